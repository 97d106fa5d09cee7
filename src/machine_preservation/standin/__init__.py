"""Stand-ins for the parts of a Gardener landscape that cannot run here (MCM, cloud provider, kubelets).

Used by the end-to-end tests and the playground only; nothing here ships in the webhook or controller.
"""
