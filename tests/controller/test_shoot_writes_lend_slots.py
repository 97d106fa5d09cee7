"""A write to a shoot's API server does not hold the process's reconcile slot: with one slot, a reconcile whose
node write waits on a shoot API server that does not answer leaves the slot to another shoot's reconcile; a
write to the seed keeps it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

import pytest

from machine_preservation.controller.machinery.events import EventRecorder
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.apply import Snapshot, Writer, execute, in_the_target_cluster
from machine_preservation.core import plan as p
from machine_preservation.core.models import Machine, Node
from tests.controller.silent import silent_api_server
from tests.polling import eventually_async

NOW = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("step", "shoot"),
    [
        (p.PatchNodeAnnotations(set={"a": "b"}), True),
        (p.SetPreservedTaint(present=True), True),
        (p.SetPreservedCondition(status="True", reason="r", message="m", last_transition_time=NOW), True),
        (p.RecordEvent(kind="Node", name="n", type="Normal", reason="R", message="m"), True),
        (p.RecordEvent(kind="Machine", name="m", type="Normal", reason="R", message="m"), False),
        (p.PatchMachineAnnotations(set={"a": "b"}), False),
        (p.SetPreserveExpiry(expiry=None), False),
        (p.DeleteMachine(), False),
    ],
)
def test_which_steps_write_to_the_shoot(step: p.MachineStep, shoot: bool) -> None:
    assert in_the_target_cluster(step) is shoot


async def test_a_hanging_shoot_write_leaves_the_slot_to_other_reconciles() -> None:
    """The shoot's client is made with the slots' trace (as the seed makes it): its requests lend the slot."""
    slots = ReconcileSlots(limit=1)
    async with silent_api_server(trace_configs=[slots.trace_config()]) as shoot, silent_api_server() as seed:
        hanging = asyncio.create_task(_reconcile(slots, seed.api, shoot.api, p.PatchNodeAnnotations(set={"a": "b"})))
        await eventually_async(lambda: shoot.connections, limit=5, interval=0.01)  # the write is sent
        assert not hanging.done(), "the shoot's API server does not answer"
        assert slots.in_use == 0, "lent while the shoot's answer is awaited"
        await asyncio.wait_for(_hold_once(slots), 2)  # would wait forever if the node write held the slot
        hanging.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hanging
    assert slots.in_use == 0


async def test_a_hanging_seed_write_keeps_the_slot() -> None:
    slots = ReconcileSlots(limit=1)
    async with silent_api_server(trace_configs=[slots.trace_config()]) as shoot, silent_api_server() as seed:
        hanging = asyncio.create_task(_reconcile(slots, seed.api, shoot.api, p.PatchMachineAnnotations(set={"a": "b"})))
        await eventually_async(lambda: seed.connections, limit=5, interval=0.01)  # the write is sent
        assert not hanging.done(), "the seed's API server does not answer"
        assert slots.in_use == 1
        other = asyncio.create_task(_hold_once(slots))
        await asyncio.sleep(0.2)
        assert not other.done(), "the seed write holds the one slot"
        hanging.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hanging
        await asyncio.wait_for(other, 2)
    assert slots.in_use == 0


async def _reconcile(slots: ReconcileSlots, seed: Any, shoot: Any, step: p.MachineStep) -> None:
    recorder = EventRecorder(control=seed, target=shoot, machine_namespace="ns", instance="test")
    writer = Writer(control=seed, target=shoot, namespace="ns", recorder=recorder, slots=slots)
    snap = Snapshot(
        machine=Machine.model_validate({"metadata": {"name": "m", "namespace": "ns", "resourceVersion": "1"}}),
        node=Node.model_validate({"metadata": {"name": "n", "resourceVersion": "1"}}),
    )
    async with slots.held():
        await execute(writer=writer, writes=[(snap, step)], now=NOW)


async def _hold_once(slots: ReconcileSlots) -> None:
    async with slots.held():
        pass
