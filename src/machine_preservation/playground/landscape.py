"""The playground's small Gardener landscape, as manifests.

One Shoot with two worker pools, and what a provider extension would make of it in the shoot's
control-plane namespace: one MachineDeployment + MachineSet per pool and zone. Pool `edge` spreads
`autoPreserveFailedMachineMax: 2` over two zones (1 each, remainder to the first zones); pool `core` has
auto-preservation off. The MCM stand-in creates the Machines and their Nodes from the MachineSets.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.zones import distribute_over_zones
from machine_preservation.core.durations import format_go_duration

GARDEN_NAMESPACE = "garden-dev"
SHOOT_NAME = "playground"
CONTROL_NAMESPACE = f"shoot--dev--{SHOOT_NAME}"
WORKLOAD_NAMESPACE = "workload"
_API = f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}"


@dataclass(frozen=True)
class Pool:
    name: str
    zones: tuple[str, ...]
    machines_per_zone: int
    auto_preserve_max: int


POOLS = (
    Pool(name="edge", zones=("z1", "z2"), machines_per_zone=2, auto_preserve_max=2),
    Pool(name="core", zones=("z1",), machines_per_zone=2, auto_preserve_max=0),
)


def machine_set_name(pool: Pool, zone_index: int) -> str:
    return f"{CONTROL_NAMESPACE}-{pool.name}-z{zone_index + 1}"


def shoot(*, preserve_timeout: dt.timedelta) -> dict[str, Any]:
    workers = [
        {
            "name": pool.name,
            "minimum": pool.machines_per_zone * len(pool.zones),
            "maximum": pool.machines_per_zone * len(pool.zones) + 1,
            "zones": list(pool.zones),
            "systemComponents": {"allow": pool.name == "core"},
            "machineControllerManager": {
                "autoPreserveFailedMachineMax": pool.auto_preserve_max,
                "machinePreserveTimeout": format_go_duration(preserve_timeout),
            },
        }
        for pool in POOLS
    ]
    return {
        "apiVersion": f"{v.SHOOT_API_GROUP}/{v.SHOOT_API_VERSION}",
        "kind": "Shoot",
        "metadata": {"name": SHOOT_NAME, "namespace": GARDEN_NAMESPACE},
        "spec": {"provider": {"type": "local", "workers": workers}},
    }


def machine_deployments(*, preserve_timeout: dt.timedelta) -> list[dict[str, Any]]:
    """One MachineDeployment per pool and zone, the pool's max distributed like Gardener does."""
    deployments = []
    for pool in POOLS:
        shares = distribute_over_zones(total=pool.auto_preserve_max, zone_count=len(pool.zones))
        for index, zone in enumerate(pool.zones):
            name = machine_set_name(pool, index)
            labels = {"pool": pool.name, "topology.kubernetes.io/zone": zone}
            deployments.append(
                {
                    "apiVersion": _API,
                    "kind": "MachineDeployment",
                    "metadata": {"name": name, "namespace": CONTROL_NAMESPACE, "labels": labels},
                    "spec": {
                        "replicas": pool.machines_per_zone,
                        "autoPreserveFailedMachineMax": shares[index],
                        "selector": {"matchLabels": labels},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {"machinePreserveTimeout": format_go_duration(preserve_timeout)},
                        },
                    },
                }
            )
    return deployments


def machine_set(deployment: dict[str, Any], *, deployment_uid: str) -> dict[str, Any]:
    """The MachineSet MCM's deployment controller would create for `deployment`."""
    metadata = deployment["metadata"]
    return {
        "apiVersion": _API,
        "kind": "MachineSet",
        "metadata": {
            "name": metadata["name"],
            "namespace": CONTROL_NAMESPACE,
            "labels": metadata["labels"],
            "ownerReferences": [
                {
                    "apiVersion": _API,
                    "kind": "MachineDeployment",
                    "name": metadata["name"],
                    "uid": deployment_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            key: deployment["spec"][key] for key in ("replicas", "autoPreserveFailedMachineMax", "selector", "template")
        },
    }


def daemon_set() -> dict[str, Any]:
    """A DaemonSet object, so its pods have a real owner (no daemonset controller runs here)."""
    labels = {"app": "node-agent"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "node-agent", "namespace": WORKLOAD_NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "agent", "image": "registry.invalid/agent"}]},
            },
        },
    }


def pod(*, name: str, node: str, labels: dict[str, str], owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": WORKLOAD_NAMESPACE, "labels": labels}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        # A short grace period: a drain waits it out on a node that stopped responding.
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "app", "image": "registry.invalid/app"}],
        },
    }


def pod_disruption_budget() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": WORKLOAD_NAMESPACE},
        # minAvailable: the disruption controller computes maxUnavailable only for pods with a scalable owner.
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
