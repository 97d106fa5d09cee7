"""The machine reconciler's drain on the real apiserver: the plan's steps are executed, then the drain; without a
free drain slot the reconcile writes what goes alongside the drain and asks to be requeued soon instead of
draining, and with one it drains, writes the steps alongside meanwhile, and then the outcome the core plans."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.preservation.apply import Snapshot, StepFailed, Writer
from machine_preservation.controller.preservation.caches import Caches, new_caches
from machine_preservation.controller.preservation.drain import Drainer, DrainResult
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.core import plan as p
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node
from tests.controller.support import create_machine, machine_model, machine_reconciler, new_node, read_node_model
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


async def failed_machine_to_preserve(api: client.ApiClient, namespace: str, node_names: list[str]) -> str:
    """Machine "m", Failed and asking to be preserved now, on a new NotReady node (returned)."""
    node = await new_node(api, node_names, ready=False)
    await create_machine(
        client.CustomObjectsApi(api),
        namespace,
        "m",
        node=node,
        phase="Failed",
        annotations={v.PRESERVE_ANNOTATION: "now"},
    )
    return node


async def test_a_drain_waits_for_a_free_slot_as_a_requeue(
    api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node = await failed_machine_to_preserve(api, namespace, node_names)
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
        deferred_machine = await machine_model(api, namespace, "m")
        assert drain_outcome(deferred_machine) is None, "no drain ran, none is recorded"
        assert deferred_machine is not None
        assert v.PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION not in deferred_machine.metadata.annotations
        condition = (await read_node_model(client.CoreV1Api(api), node)).preserved_condition
        assert condition is not None, "what goes alongside the drain is written though the drain waits"
        assert condition.message.startswith(v.DRAINING_MESSAGE)
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


@dataclasses.dataclass
class ConditionAfterTheDrainStarted(Writer):
    """Writes the Preserved condition only once a drain has started (or fails it, with `refuse`)."""

    drain_started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    refuse: bool = False

    async def set_preserved_condition(self, snap: Snapshot, step: p.SetPreservedCondition) -> None:
        await asyncio.wait_for(self.drain_started.wait(), 10)
        if self.refuse:
            raise ApiException(status=500, reason="Internal Server Error")
        await super().set_preserved_condition(snap, step)


@dataclasses.dataclass
class SignallingDrainer(Drainer):
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def drain(self, *, node: Node, time_limit: float, max_evict_retries: int) -> DrainResult:
        self.started.set()
        return await super().drain(node=node, time_limit=time_limit, max_evict_retries=max_evict_retries)


@pytest.mark.parametrize("refuse", [False, True], ids=["written", "refused"])
async def test_the_being_drained_condition_is_written_while_the_drain_runs(
    api: client.ApiClient, namespace: str, node_names: list[str], refuse: bool
) -> None:
    node = await failed_machine_to_preserve(api, namespace, node_names)
    node_pods = NodePods(target=api)
    async with synced_caches(api, namespace) as caches:
        reconciler = machine_reconciler(api, namespace, caches=caches, node_pods=node_pods)
        started = asyncio.Event()
        writer = reconciler.writer
        reconciler.writer = ConditionAfterTheDrainStarted(
            control=writer.control,
            target=writer.target,
            namespace=writer.namespace,
            recorder=writer.recorder,
            drain_started=started,
            refuse=refuse,
        )
        reconciler.drainer = SignallingDrainer(target=api, pods=node_pods, started=started)
        key = f"{namespace}/m"
        await eventually_async(lambda: caches.machines.get(key))
        if refuse:
            with pytest.raises(StepFailed) as failed:
                await reconciler.reconcile(key)
            assert isinstance(failed.value.step, p.SetPreservedCondition)
            assert drain_outcome(await machine_model(api, namespace, "m")) is None, "no outcome after a failure"
        else:
            # Were the condition written before the drain, it would wait for a drain that never starts.
            await reconciler.reconcile(key)
            assert drain_outcome(await machine_model(api, namespace, "m")) == v.DrainOutcome.DRAINED
            condition = (await read_node_model(client.CoreV1Api(api), node)).preserved_condition
            assert condition is not None
            assert (condition.status, condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)) == ("True", True)
    await node_pods.stop()
