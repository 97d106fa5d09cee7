"""The machine reconciler's drain on the real apiserver: the plan is executed up to its drain; without a free
drain slot the reconcile asks to be requeued soon instead of draining, and with one it drains and writes the
outcome the core plans for it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator

from kubernetes.aio import client

from machine_preservation.controller.apply import StepFailed
from machine_preservation.controller.caches import Caches, new_caches
from machine_preservation.controller.node_pods import NodePods
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine
from tests.controller.support import create_machine, machine_model, machine_reconciler, new_node
from tests.polling import eventually_async


@contextlib.asynccontextmanager
async def synced_caches(api: client.ApiClient, namespace: str) -> AsyncIterator[Caches]:
    caches = new_caches(control=api, target=api, namespace=namespace, resync_period=600)
    tasks = [asyncio.create_task(informer.run()) for informer in caches.owned]
    try:
        await asyncio.wait_for(asyncio.gather(*(i.wait_synced() for i in caches.all)), 30)
        yield caches
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def drain_outcome(machine: Machine | None) -> v.DrainOutcome | None:
    record = machine.preservation if machine is not None else None
    return record.drain.outcome if record is not None and record.drain is not None else None


async def test_a_drain_waits_for_a_free_slot_as_a_requeue(
    api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node = await new_node(api, node_names, ready=False)
    await create_machine(
        client.CustomObjectsApi(api),
        namespace,
        "m",
        node=node,
        phase="Failed",
        annotations={v.PRESERVE_ANNOTATION: "now"},
    )
    node_pods = NodePods(target=api)
    async with synced_caches(api, namespace) as caches:
        reconciler = machine_reconciler(api, namespace, caches=caches, node_pods=node_pods, max_concurrent_drains=1)
        key = f"{namespace}/m"
        await eventually_async(lambda: caches.machines.get(key))

        async def reconciled() -> dt.timedelta | None:
            """One reconcile; a conflict means the caches were behind the previous one's writes: none."""
            with contextlib.suppress(StepFailed):
                return await reconciler.reconcile(key)
            return None

        def drains(outcome: str) -> float:
            return (
                reconciler.metrics.registry.get_sample_value("machine_preservation_drains_total", {"outcome": outcome})
                or 0.0
            )

        reconciler._draining.add("another-node")  # the only slot is taken

        async def deferred() -> bool:
            return await reconciled() == reconciler.drain_deferral

        await eventually_async(deferred)
        assert drain_outcome(await machine_model(api, namespace, "m")) is None, "no drain ran, none is recorded"
        assert (drains("succeeded"), drains("failed")) == (0.0, 0.0)

        reconciler._draining.clear()

        async def drained() -> bool:
            await reconciled()
            return drain_outcome(await machine_model(api, namespace, "m")) == v.DrainOutcome.DRAINED

        await eventually_async(drained)
        assert drains("succeeded") >= 1
        assert node_pods.nodes == [node], "the failed machine's node is the only one whose pods are watched"

        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, namespace, "machines", "m"
        )
        await eventually_async(lambda: caches.machines.get(key) is None)
        assert await reconciler.reconcile(key) is None
        assert node_pods.nodes == [], "the machine is gone: its node's pods are no longer watched"
    await node_pods.stop()
