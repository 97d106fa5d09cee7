"""A plan's Events do not hold up its writes: each is sent once the writes before it succeeded, the writes after
it go on meanwhile, and the plan returns once every Event is answered; a failed Event still fails the plan, a
Machine patch marked `after_events` (the acknowledgement of a start's announcement) is written only once the Events
before it are recorded, and waiting for a shoot's Event leaves the reconcile slot free."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt

import pytest
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.apply import Snapshot, StepFailed, execute
from machine_preservation.core import plan as p
from machine_preservation.core.models import Machine, Node

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
SNAP = Snapshot(
    machine=Machine.model_validate({"metadata": {"name": "m", "namespace": "ns"}}),
    node=Node.model_validate({"metadata": {"name": "n"}}),
)


def event(kind: str = "Machine") -> p.RecordEvent:
    return p.RecordEvent(kind=kind, name="m" if kind == "Machine" else "n", type="Normal", reason="R", message="x")


def annotate(value: str, *, after_events: bool = False) -> p.PatchMachineAnnotations:
    return p.PatchMachineAnnotations(set={"a": value}, after_events=after_events)


class Writer:
    """Records what is written; an Event is answered only once `answer_events` is set."""

    def __init__(self, slots: ReconcileSlots | None = None) -> None:
        self.slots = slots or ReconcileSlots()
        self.log: list[str] = []
        self.answer_events = asyncio.Event()
        self.event_error: ApiException | None = None
        self.failing_value = ""
        self.written: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)

    def answer_events_once_written(self, value: str) -> asyncio.Task[None]:
        """Answer the Events once the annotation `value` has been written."""

        async def answer() -> None:
            await self.written[value].wait()
            self.answer_events.set()

        return asyncio.create_task(answer())

    async def record_event(self, _snap: Snapshot, step: p.RecordEvent, *, now: dt.datetime) -> None:
        self.log.append(f"event {step.kind} sent")
        await self.answer_events.wait()
        self.log.append(f"event {step.kind} answered")
        if self.event_error is not None:
            raise self.event_error

    async def patch_machine_annotations(self, _snap: Snapshot, step: p.PatchMachineAnnotations) -> None:
        if step.set["a"] == self.failing_value:
            raise ApiException(status=409, reason="Conflict")
        self.log.append(f"annotations {step.set['a']}")
        self.written[step.set["a"]].set()


async def run(writer: Writer, steps: list[p.MachineStep]) -> None:
    # In the calling task, as a worker runs a reconcile (`wait_for` would run it in a task of its own, which does not
    # hold the caller's slot and so lends none).
    async with asyncio.timeout(5):
        await execute(writer=writer, writes=[(SNAP, s) for s in steps], now=NOW)  # type: ignore[arg-type]


async def test_the_writes_after_an_event_do_not_wait_for_its_answer() -> None:
    writer = Writer()
    answering = writer.answer_events_once_written("2")
    await run(writer, [annotate("1"), event(), annotate("2")])
    await answering
    assert writer.log[0] == "annotations 1"
    assert writer.log.index("annotations 2") < writer.log.index("event Machine answered") == 3


async def test_an_event_is_sent_only_after_the_writes_before_it() -> None:
    writer = Writer()
    writer.failing_value = "1"
    writer.answer_events.set()
    with pytest.raises(StepFailed) as failed:
        await run(writer, [annotate("1"), event(), annotate("2")])
    assert isinstance(failed.value.step, p.PatchMachineAnnotations)
    assert writer.log == [], "neither the Event nor the write after the failed one"


async def test_a_failed_event_fails_the_plan_once_the_writes_are_made() -> None:
    writer = Writer()
    writer.event_error = ApiException(status=500, reason="Internal Server Error")
    writer.answer_events.set()
    with pytest.raises(StepFailed) as failed:
        await run(writer, [event(), annotate("2")])
    assert isinstance(failed.value.step, p.RecordEvent)
    assert "annotations 2" in writer.log


async def test_an_acknowledgement_waits_for_the_events_before_it_and_only_for_those() -> None:
    writer = Writer()
    answering = writer.answer_events_once_written("2")  # the write in between
    await run(writer, [annotate("1"), event(), annotate("2"), annotate("ack", after_events=True), event("Node")])
    await answering
    log = writer.log
    assert log.index("annotations 2") < log.index("event Machine answered"), "a plain write does not wait"
    assert log.index("event Machine answered") < log.index("annotations ack"), "the acknowledgement waits"
    assert log[-2:] == ["event Node sent", "event Node answered"], "an Event after it is sent after it"


async def test_an_acknowledgement_is_not_written_when_an_event_before_it_failed() -> None:
    writer = Writer()
    writer.event_error = ApiException(status=500, reason="Internal Server Error")
    writer.answer_events.set()
    with pytest.raises(StepFailed) as failed:
        await run(writer, [event(), annotate("2"), annotate("ack", after_events=True), annotate("3")])
    assert isinstance(failed.value.step, p.RecordEvent)
    assert "annotations 2" in writer.log
    assert "annotations ack" not in writer.log, "the announcement stays pending: a restart makes it again"
    assert "annotations 3" not in writer.log


async def test_a_failed_write_returns_only_once_its_events_are_answered() -> None:
    writer = Writer()
    writer.failing_value = "2"

    async def answer_later() -> None:
        await asyncio.sleep(0.1)
        writer.answer_events.set()

    answering = asyncio.create_task(answer_later())
    with pytest.raises(StepFailed) as failed:
        await run(writer, [event(), annotate("2")])
    assert isinstance(failed.value.step, p.PatchMachineAnnotations)
    assert writer.log == ["event Machine sent", "event Machine answered"], "no Event left behind unanswered"
    await answering


async def test_waiting_for_a_shoots_event_leaves_the_slot_and_keeps_the_count() -> None:
    slots = ReconcileSlots(limit=1)
    writer = Writer(slots)

    async def reconcile() -> None:
        async with slots.held():
            await run(writer, [event("Node"), annotate("1")])
            assert slots.in_use == 1

    waiting = asyncio.create_task(reconcile())
    await asyncio.wait_for(writer.written["1"].wait(), 2)

    async def other() -> None:
        async with slots.held():
            assert slots.in_use == 1

    await asyncio.wait_for(other(), 2)  # the first reconcile waits for its Node's Event with the slot lent
    writer.answer_events.set()
    await waiting
    assert slots.in_use == 0
    inside = 0

    async def count() -> None:
        nonlocal inside
        async with slots.held():
            inside += 1
            assert inside == 1, "the Event's task gave back a slot it did not hold"
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(count() for _ in range(3)))
