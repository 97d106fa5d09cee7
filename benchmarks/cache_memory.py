"""Memory of the controller's Node and Machine caches: bytes per cached object, and what a seed's take.

One controller keeps every Node of every shoot and every Machine of the seed, so the size of one cached object
decides how much of the memory budget a seed's machines take (4,000 of each for 200 shoots of 20 machines).
Builds N Nodes as a Gardener shoot's API server serves them (the pool's labels, other components' annotations,
the kubelet's and the node problem detector's conditions, images, addresses, capacity) and N Machines as MCM
writes them (status with the node's conditions copied, the last operation), parses each from its JSON as the
informer does, and prints the bytes each retains (tracemalloc, after parsing and a collection) and the totals
for 4,000 and 40,000 objects. Nodes are measured twice: the whole `Node` model and `cached_node`, what the
cache keeps.

    .venv/bin/python benchmarks/cache_memory.py            # 4,000 of each
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from collections.abc import Callable, Mapping
from typing import Any

from machine_preservation.core.models import Machine, Node, cached_node

CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status. AppArmor enabled"),
    ("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock"),
    ("ReadonlyFilesystem", "False", "FilesystemIsNotReadOnly", "Filesystem is not read-only"),
    ("FrequentKubeletRestart", "False", "NoFrequentKubeletRestart", "kubelet is functioning properly"),
    ("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"),
)


def served_node(index: int) -> dict[str, Any]:
    name = f"shoot--project--shoot-worker-a-z1-5d8f7-{index:05d}"
    zone = f"eu-west-1{'abc'[index % 3]}"
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "m5.large",
        "beta.kubernetes.io/instance-type": "m5.large",
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/zone": zone,
        "topology.ebs.csi.aws.com/zone": zone,
        "worker.gardener.cloud/pool": "worker-a",
        "worker.garden.sapcloud.io/group": "worker-a",
        "worker.gardener.cloud/system-components": "true",
        "worker.gardener.cloud/kubernetes-version": "1.31.4",
        "networking.gardener.cloud/node-local-dns-enabled": "true",
        "node.kubernetes.io/role": "node",
        "node.machine.sapcloud.io/machine-name": name,
    }
    annotations = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-0{index:016x}"}),
        "checksum/cloud-config-data": f"{index * 7919:064x}",
        "node.machine.sapcloud.io/last-applied-anno-labels-taints": json.dumps(
            {"metadata": {"labels": {"worker.gardener.cloud/pool": "worker-a", "node.kubernetes.io/role": "node"}}}
        ),
        "projectcalico.org/IPv4Address": f"10.250.{index // 250}.{index % 250}/19",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{index:08x}-1f2e-4d3c-8b7a-0123456789ab",
            "resourceVersion": str(100_000 + index),
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"providerID": f"aws:///{zone}/i-0{index:016x}", "podCIDR": "100.96.1.0/24"},
        "status": {
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": "2026-11-26T10:00:00Z",
                    "lastTransitionTime": "2026-11-20T10:00:00Z",
                }
                for kind, status, reason, message in CONDITIONS
            ],
            "addresses": [{"type": "InternalIP", "address": "10.250.0.1"}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "2", "memory": "7935360Ki", "pods": "110"},
            "images": [
                {"names": [f"registry.example/component-{i}@sha256:{i:064x}"], "sizeBytes": 1} for i in range(30)
            ],
        },
    }


def served_machine(index: int) -> dict[str, Any]:
    name = f"shoot--project--shoot-worker-a-z1-5d8f7-{index:05d}"
    node = served_node(index)
    return {
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": "shoot--project--shoot",
            "uid": f"{index:08x}-2f3e-4d3c-8b7a-0123456789ab",
            "resourceVersion": str(1_000_000 + index),
            "generation": 1,
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": {"name": "shoot--project--shoot-worker-a-z1", "node": name, "machine-template-hash": "5d8f7"},
            "finalizers": ["machine.sapcloud.io/machine-controller-manager"],
            "ownerReferences": [
                {
                    "apiVersion": "machine.sapcloud.io/v1alpha1",
                    "kind": "MachineSet",
                    "name": "shoot--project--shoot-worker-a-z1-5d8f7",
                    "uid": "0a1b2c3d-2f3e-4d3c-8b7a-0123456789ab",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "class": {"kind": "MachineClass", "name": "shoot--project--shoot-worker-a-z1-5d8f7"},
            "providerID": node["spec"]["providerID"],
            "nodeTemplate": {"metadata": {"labels": {"worker.gardener.cloud/pool": "worker-a"}}},
            "creationTimeout": "20m",
            "drainTimeout": "2h",
            "healthTimeout": "10m",
        },
        "status": {
            "currentStatus": {"phase": "Running", "lastUpdateTime": "2026-11-20T10:05:00Z", "timeoutActive": False},
            "lastOperation": {
                "description": f"Machine {name} successfully joined the cluster",
                "lastUpdateTime": "2026-11-20T10:05:00Z",
                "state": "Successful",
                "type": "Create",
            },
            "conditions": node["status"]["conditions"],
            "node": name,
        },
    }


def retained(parse: Callable[[Mapping[str, Any]], object], bodies: list[str]) -> float:
    """Bytes each parsed object keeps alive, parsed from its served JSON as the informer does."""
    gc.collect()
    tracemalloc.start()
    cache = {str(i): parse(json.loads(body)) for i, body in enumerate(bodies)}
    gc.collect()
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return used / len(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=4_000)
    args = parser.parse_args()
    nodes = [json.dumps(served_node(i)) for i in range(args.objects)]
    machines = [json.dumps(served_machine(i)) for i in range(args.objects)]
    node_bytes, machine_bytes = sum(map(len, nodes)) / len(nodes), sum(map(len, machines)) / len(machines)
    print(f"served JSON: Node {node_bytes:.0f} bytes, Machine {machine_bytes:.0f} bytes")
    measured: tuple[tuple[str, Callable[[Mapping[str, Any]], object], list[str]], ...] = (
        ("Node, whole model", Node.model_validate, nodes),
        ("Node, cached_node", cached_node, nodes),
        ("Machine", Machine.model_validate, machines),
    )
    for label, parse, bodies in measured:
        per_object = retained(parse, bodies)
        print(
            f"{label:>17}: {per_object:7.0f} bytes each; 4,000 {per_object * 4_000 / 2**20:6.1f} MiB, "
            f"40,000 {per_object * 40_000 / 2**20:6.1f} MiB"
        )


if __name__ == "__main__":
    main()
