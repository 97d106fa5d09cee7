"""A Node cache behind the Machine's on the real apiserver: MCM failed the machine from its own view of the node,
while our Node watch has not delivered the node's failure yet. The reconciler reads the Node afresh before it
would move the machine back to Running, so the failure is preserved instead of undone; a node that is healthy on
the API server still brings its machine back."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator

import pytest
from kubernetes.aio import client

from machine_preservation.controller.preservation.caches import Caches, new_caches
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reconcile import LiveNodes
from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.lifecycle import node_is_healthy
from machine_preservation.core.models import Machine
from machine_preservation.core.preservation_record import format_timestamp
from tests.controller.support import create_machine, machine_model, machine_reconciler, new_node
from tests.polling import eventually_async


@contextlib.asynccontextmanager
async def caches_with_a_stopped_node_watch(api: client.ApiClient, namespace: str) -> AsyncIterator[Caches]:
    """Synced caches whose Node informer is then stopped: from there on its Nodes are late."""
    caches = new_caches(control=api, target=api, namespace=namespace, resync_period=600)
    tasks = {informer.name: asyncio.create_task(informer.run()) for informer in caches.owned}
    try:
        await asyncio.wait_for(asyncio.gather(*(i.wait_synced() for i in caches.all)), 30)
        tasks["nodes"].cancel()
        yield caches
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def set_ready(api: client.ApiClient, node: str, status: str) -> None:
    now = format_timestamp(dt.datetime.now(dt.UTC))
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "Test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    await client.CoreV1Api(api).patch_node_status(node, {"status": {"conditions": [condition]}})


@pytest.mark.parametrize(("ready_on_the_server", "phase_after"), [("Unknown", "Failed"), ("True", "Running")])
async def test_a_failed_machine_is_judged_by_its_node_as_the_api_server_has_it(
    api: client.ApiClient, namespace: str, node_names: list[str], ready_on_the_server: str, phase_after: str
) -> None:
    node = await new_node(api, node_names, ready=True)
    config = PreservationConfig()
    node_pods = NodePods(target=api)
    async with caches_with_a_stopped_node_watch(api, namespace) as caches:
        await set_ready(api, node, ready_on_the_server)
        await create_machine(
            client.CustomObjectsApi(api),
            namespace,
            "m",
            node=node,
            phase="Failed",
            annotations={v.PRESERVE_ANNOTATION: "when-failed"},
        )
        key = f"{namespace}/m"
        await eventually_async(lambda: (cached := caches.machines.get(key)) is not None and cached.phase == "Failed")
        late = caches.nodes.get(node)
        assert late is not None
        assert node_is_healthy(node=late, config=config), "the cache is late: it still shows the node healthy"

        reconciler = machine_reconciler(api, namespace, caches=caches, node_pods=node_pods, config=config)
        await reconciler.reconcile(key)

        machine: Machine | None = await machine_model(api, namespace, "m")
        assert machine is not None
        assert machine.phase == phase_after
        if phase_after == "Failed":
            assert machine.preservation is not None, "the failure is preserved, not undone"
    await node_pods.stop()


async def test_a_node_gone_from_the_api_server_is_no_node(
    api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node = await new_node(api, node_names, ready=True)
    live = LiveNodes(target=api)

    found = await live.get(node)
    assert found is not None
    assert found.metadata.name == node

    await client.CoreV1Api(api).delete_node(node)
    assert await live.get(node) is None
