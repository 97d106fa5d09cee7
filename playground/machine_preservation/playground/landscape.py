"""The playground's small Gardener landscape, as manifests.

One Shoot with two worker pools, and what Gardener and a provider extension would make of it in the shoot's
control-plane namespace: the `Cluster` resource carrying the Shoot, and per pool and zone a Secret, a
MachineClass and a MachineDeployment labelled `worker.gardener.cloud/pool=<pool>` and with the zone. Real MCM
creates the MachineSets, Machines and (through its fake cloud) the Nodes from them.

Pool `edge` spreads `autoPreserveFailedMachineMax: 2` over two zones (1 each, remainder to the first zones);
pool `core` has auto-preservation off. MCM v0.61.3's CRDs keep neither that max nor `machinePreserveTimeout` on
MachineDeployments, and MCM copies neither to its Machines: the controller and the webhook read both from the
Shoot in the `Cluster` resource, for the pool the MachineDeployment's label names and the zone it carries.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    WORKER_POOL_LABEL,
    ZONE_LABEL,
    distribute_over_zones,
)
from machine_preservation.localcluster import mcm_pool

GARDEN_NAMESPACE = "garden-dev"
SHOOT_NAME = "playground"
CONTROL_NAMESPACE = f"shoot--dev--{SHOOT_NAME}"
WORKLOAD_NAMESPACE = "workload"


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
EDGE, CORE = POOLS


@dataclass(frozen=True)
class Deployment:
    """One MachineDeployment: a pool's machines in one zone."""

    pool: Pool
    zone_index: int

    @property
    def zone(self) -> str:
        return self.pool.zones[self.zone_index]

    @property
    def name(self) -> str:
        # Provider extensions choose these names; nothing parses them (the pool comes from the label).
        return f"{CONTROL_NAMESPACE}-{self.pool.name}-z{self.zone_index + 1}"

    @property
    def auto_preserve_share(self) -> int:
        """This zone's share of the pool's max, as Gardener distributes it."""
        shares = distribute_over_zones(total=self.pool.auto_preserve_max, zone_count=len(self.pool.zones))
        return shares[self.zone_index]


def deployments(pool: Pool | None = None) -> list[Deployment]:
    return [Deployment(p, i) for p in POOLS if pool in (None, p) for i in range(len(p.zones))]


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


def cluster(shoot: dict[str, Any]) -> dict[str, Any]:
    """Gardener's `Cluster` resource of the control namespace: the Shoot (as the garden cluster serves it) for
    the seed's controllers to read."""
    return {
        "apiVersion": f"{CLUSTER_API_GROUP}/{CLUSTER_API_VERSION}",
        "kind": "Cluster",
        "metadata": {"name": CONTROL_NAMESPACE},
        "spec": {
            "cloudProfile": {
                "apiVersion": f"{v.SHOOT_API_GROUP}/{v.SHOOT_API_VERSION}",
                "kind": "CloudProfile",
                "metadata": {"name": "local"},
            },
            "seed": {
                "apiVersion": f"{v.SHOOT_API_GROUP}/{v.SHOOT_API_VERSION}",
                "kind": "Seed",
                "metadata": {"name": "local"},
            },
            "shoot": shoot,
        },
    }


def pool_objects(deployment: Deployment) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The Secret, MachineClass and MachineDeployment a provider extension would create for `deployment`."""
    labels = {WORKER_POOL_LABEL: deployment.pool.name, ZONE_LABEL: deployment.zone}
    return mcm_pool.pool_objects(
        CONTROL_NAMESPACE,
        deployment.name,
        replicas=deployment.pool.machines_per_zone,
        machine_deployment_labels=labels,
        node_labels=labels,
    )


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
