"""How cache changes reach the work queues, on the real apiserver: a periodic resync queues every machine in the
background lane, and a real change overtakes it (so an expiry or a failure never waits behind a resync)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kubernetes.aio import client

from machine_preservation.controller.manager import new_caches
from machine_preservation.controller.queue import WorkQueue
from machine_preservation.controller.reconcile import Caches, Queues, wire_handlers
from tests.controller.support import GROUP, VERSION, create_machine, eventually


@contextlib.asynccontextmanager
async def wired(api: client.ApiClient, namespace: str, *, resync_period: float) -> AsyncIterator[tuple[Caches, Queues]]:
    caches = new_caches(control=api, target=api, namespace=namespace, resync_period=resync_period)
    queues = Queues(
        machines=WorkQueue(name="m"), machine_sets=WorkQueue(name="s"), machine_deployments=WorkQueue(name="d")
    )
    wire_handlers(caches=caches, queues=queues)
    tasks = [asyncio.create_task(informer.run()) for informer in caches.all]
    try:
        await asyncio.wait_for(asyncio.gather(*(i.wait_synced() for i in caches.all)), 30)
        yield caches, queues
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def drain(queue: WorkQueue[str]) -> list[str]:
    """Every key waiting now, in the order workers would get them."""
    keys = []
    while len(queue):
        key = await asyncio.wait_for(queue.get(), 1)
        assert key is not None
        keys.append(key)
        queue.done(key)
    return keys


async def test_a_change_overtakes_a_resync_of_every_machine(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    names = [f"m{n}" for n in range(8)]
    for name in names:
        await create_machine(custom, namespace, name)
    async with wired(api, namespace, resync_period=0.5) as (caches, queues):
        assert sorted(await drain(queues.machines)) == sorted(f"{namespace}/{n}" for n in names)
        resyncs = caches.machines.stats.resyncs
        await eventually(lambda: caches.machines.stats.resyncs > resyncs and len(queues.machines) == len(names))

        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "machines", "m5", {"metadata": {"labels": {"changed": "yes"}}}
        )
        await eventually(lambda: (m := caches.machines.get(f"{namespace}/m5")) and m.metadata.labels.get("changed"))
        order = await drain(queues.machines)

    assert order[0] == f"{namespace}/m5", f"the changed machine waited behind the resync: {order}"
    assert sorted(order) == sorted(f"{namespace}/{n}" for n in names), "each machine queued once"
