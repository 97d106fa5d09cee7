"""Machine preservation for MCM-managed Kubernetes clusters: admission webhook and controller."""
