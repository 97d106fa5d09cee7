"""A real local Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager) on loopback.

Used by the integration tests and the playground. The binaries are built from the Go module proxy by
localcluster/go/k8s-testbin (see toolchain.py); nothing here is a mock of the API server.
"""
