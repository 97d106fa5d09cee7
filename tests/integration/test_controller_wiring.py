"""What the controller derives from its caches, on the real apiserver: a periodic resync queues every machine in
the background lane and a real change overtakes it (so an expiry or a failure never waits behind a resync); the
per-MachineSet priority summary follows every machine change."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator

from kubernetes.aio import client

from machine_preservation.controller.machinery.queue import WorkQueue
from machine_preservation.controller.preservation.caches import Caches, new_caches
from machine_preservation.controller.preservation.handlers import Queues, wire_handlers
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.core import vocabulary as v
from machine_preservation.core.preservation_record import start_record
from machine_preservation.core.priority import unpreserved_priority_ceiling
from tests.controller.support import GROUP, VERSION, create_machine, machine_set_owner
from tests.polling import eventually_async

TEN_HOURS = dt.timedelta(hours=10)
USER = v.PreservedBy.USER


@contextlib.asynccontextmanager
async def wired(api: client.ApiClient, namespace: str, *, resync_period: float) -> AsyncIterator[tuple[Caches, Queues]]:
    caches = new_caches(control=api, target=api, namespace=namespace, resync_period=resync_period)
    queues = Queues(
        machines=WorkQueue(name="m"), machine_sets=WorkQueue(name="s"), machine_deployments=WorkQueue(name="d")
    )
    node_pods = NodePods(target=api)
    wire_handlers(caches=caches, node_pods=node_pods, queues=queues)
    tasks = [asyncio.create_task(informer.run()) for informer in caches.owned]
    try:
        await asyncio.wait_for(asyncio.gather(*(i.wait_synced() for i in caches.all)), 30)
        yield caches, queues
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await node_pods.stop()


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
        await eventually_async(lambda: caches.machines.stats.resyncs > resyncs and len(queues.machines) == len(names))

        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "machines", "m5", {"metadata": {"labels": {"changed": "yes"}}}
        )
        await eventually_async(
            lambda: (m := caches.machines.get(f"{namespace}/m5")) and m.metadata.labels.get("changed")
        )
        order = await drain(queues.machines)

    assert order[0] == f"{namespace}/m5", f"the changed machine waited behind the resync: {order}"
    assert sorted(order) == sorted(f"{namespace}/{n}" for n in names), "each machine queued once"


async def test_the_priority_ceiling_follows_machine_changes(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    owner = await machine_set_owner(api, namespace, "ms")
    max_timeout = dt.timedelta(hours=1)
    started = dt.datetime.now(dt.UTC)
    # "p"'s record asks for 10 h but started 2 h ago: capped at 1 h it has run out, so "p" counts as unpreserved.
    # "q" is preserved (for its capped hour): its priority is not a ceiling for the others.
    records = {
        "p": start_record(now=started - dt.timedelta(hours=2), timeout=TEN_HOURS, max_timeout=TEN_HOURS, by=USER),
        "q": start_record(now=started, timeout=TEN_HOURS, max_timeout=TEN_HOURS, by=USER),
    }
    for name, priority in (("a", "4"), ("b", "6"), ("c", "3"), ("p", "8"), ("q", "9")):
        record = records[name].annotations() if name in records else {}
        annotations = {v.MACHINE_PRIORITY_ANNOTATION: priority, **record}
        await create_machine(custom, namespace, name, owner=owner, annotations=annotations)
    async with wired(api, namespace, resync_period=600) as (caches, _):

        def ceilings() -> dict[str, int]:
            now = dt.datetime.now(dt.UTC)
            machines = caches.machines.values()
            computed = {m.metadata.name: caches.priority_ceiling(m, now=now, max_timeout=max_timeout) for m in machines}
            defined = {
                m.metadata.name: unpreserved_priority_ceiling(
                    machine=m, machine_set_machines=machines, now=now, max_timeout=max_timeout
                )
                for m in machines
            }
            assert computed == defined
            return computed

        assert ceilings() == {"a": 8, "b": 8, "c": 8, "p": 6, "q": 8}
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "machines",
            "c",
            {"metadata": {"annotations": {v.MACHINE_PRIORITY_ANNOTATION: "9"}}},
        )
        await eventually_async(lambda: ceilings() == {"a": 9, "b": 9, "c": 8, "p": 9, "q": 9})
        await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "c")
        await eventually_async(lambda: ceilings() == {"a": 8, "b": 8, "p": 6, "q": 8})
