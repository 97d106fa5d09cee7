"""One shoot's Nodes cannot take the memory every shoot of the seed is served from: the extension process (as the
seed chart's ServiceAccount) against real kube-apiservers, a shoot owner's big Nodes (thousands of taints, long
condition messages) cached slim, and a shoot whose Nodes are over the budget reported not served while another
shoot stays served."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import CACHED_VALUE_LIMIT
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener import apply_extension
from machine_preservation.localcluster.gardener_landscape import BareShoot, read_extension, served
from tests.integration.test_extension_controller import (  # noqa: F401 (fixtures)
    _event,
    api,
    ca_pem,
    new_shoot,
    running_extension,
    seed,
)
from tests.polling import eventually_async

BUDGET = 3 * 2**19  # 1.5 MiB
LONG = "m" * 20_000


def big_node(name: str) -> dict[str, Any]:
    """A shoot owner's Node of ~0.5 MB as JSON, with our taint among 2,000 others."""
    taints = [{"key": f"owner.example.com/taint-{i}", "value": "v" * 60, "effect": "NoSchedule"} for i in range(2_000)]
    taints.insert(1_000, {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT})
    return {
        "metadata": {"name": name, "annotations": {v.PRESERVE_ANNOTATION: LONG, "owner.example.com/big": LONG}},
        "spec": {"providerID": f"aws:///{name}", "taints": taints},
    }


def big_status() -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": LONG},
                *({"type": f"Owner{i}", "status": "True", "reason": "Owner", "message": LONG} for i in range(8)),
            ]
        }
    }


async def create_big_nodes(shoot: BareShoot, names: list[str]) -> None:
    core = client.CoreV1Api(shoot.api)
    for name in names:
        await core.create_node(big_node(name))  # type: ignore[arg-type]
        await core.patch_node_status(name, big_status())


def shoot_nodes(extension: Any, namespace: str) -> Any:
    """The Nodes informer of the shoot's runtime in the extension process (None: not running)."""
    shoot = extension.controller.supervisor._shoots.get(namespace)
    runtime = shoot.runtime if shoot is not None else None
    return runtime.caches.nodes if runtime is not None and runtime.caches is not None else None


async def test_big_nodes_are_cached_slim_and_a_shoot_over_its_node_budget_is_not_served_while_others_are(
    seed: ControlPlane,  # noqa: F811 (the fixtures imported above)
    api: client.ApiClient,  # noqa: F811
    ca_pem: bytes,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        new_shoot(seed, api, tmp_path / "small") as small,
        new_shoot(seed, api, tmp_path / "big") as big,
        running_extension(seed, api, ca_pem, tmp_path / "extension", node_budget=BUDGET) as extension,
    ):
        await create_big_nodes(small, ["node-0"])  # ~0.5 MB: within the budget
        await create_big_nodes(big, [f"node-{i}" for i in range(4)])  # ~2 MB: over it
        await apply_extension(api, small.namespace)
        await apply_extension(api, big.namespace)

        # The shoot within its budget is served, its big Node cached as the plan reads it and no more.
        await eventually_async(lambda: served(api, small.namespace), limit=60)
        nodes = shoot_nodes(extension, small.namespace)
        node = nodes.get("node-0")
        assert node is not None
        assert [(t.key, t.index) for t in node.spec.taints] == [(v.PRESERVED_TAINT_KEY, 1_000)]
        assert node.spec.has_taints
        assert node.metadata.annotations == {v.PRESERVE_ANNOTATION: LONG[:CACHED_VALUE_LIMIT]}
        ready = node.condition("Ready")
        assert ready is not None
        assert (ready.status, ready.message) == ("True", "")
        assert len(node.model_dump_json()) < 4_000

        # The shoot over its budget: an Event, its Extension's condition and a gauge say it is not served.
        warning = await eventually_async(lambda: _event(api, big.namespace, "ShootNodesOverBudget"), limit=60)
        assert warning.type == "Warning"
        assert "the shoot's Nodes are over their budget" in warning.message
        assert "1.5 MiB" in warning.message
        extension_object = await read_extension(api, big.namespace)
        healthy = next(c for c in extension_object["status"]["conditions"] if c["type"] == "ControlPlaneHealthy")
        assert healthy["status"] != "True"
        assert "over their budget" in healthy["message"]
        registry = extension.controller.metrics.registry

        def over(namespace: str) -> float | None:
            return registry.get_sample_value("machine_preservation_shoot_nodes_over_budget", {"namespace": namespace})

        await eventually_async(lambda: over(big.namespace) == 1, limit=30)
        assert over(small.namespace) == 0

        # Meanwhile the other shoot goes on: a new Node of it is followed.
        await client.CoreV1Api(small.api).create_node({"metadata": {"name": "node-1"}})  # type: ignore[arg-type]
        await eventually_async(lambda: shoot_nodes(extension, small.namespace).get("node-1") is not None, limit=30)
        assert await served(api, small.namespace)

        # Once its owner removes Nodes, the shoot is served again.
        big_core = client.CoreV1Api(big.api)
        await asyncio.gather(*(big_core.delete_node(f"node-{i}") for i in range(1, 4)))
        # Its Nodes are listed again after 30 s, 60 s, 120 s (caches.NODE_BUDGET_BACKOFF, ±20 %): in the first
        # minutes after the first failure, a re-list comes within 144 s of any moment.
        await eventually_async(lambda: served(api, big.namespace), limit=150)
        assert over(big.namespace) == 0
