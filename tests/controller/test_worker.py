"""A worker's handling of reconcile outcomes, with a controlled timer: requeue at the time the plan asks
for, backoff on conflicts and errors (reset by success), one metrics observation per reconcile."""

from __future__ import annotations

import asyncio
import datetime as dt

from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.machinery.queue import ObjectGone, WorkQueue, run_worker
from machine_preservation.controller.preservation.apply import StepFailed
from machine_preservation.core import plan as p
from machine_preservation.kube.backoff import Backoff
from tests.controller.faketimer import FakeTimer


async def test_outcomes_drive_requeue_and_backoff() -> None:
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="machines", timer=timer, backoff=Backoff(base=1.0, cap=60.0))
    metrics = Metrics()
    outcomes: list[BaseException | dt.timedelta | None] = [
        StepFailed(p.SetPreserveExpiry(expiry=None), ApiException(status=409, reason="Conflict"), conflict=True),
        ApiException(status=500, reason="Internal"),
        RuntimeError("bug"),
        dt.timedelta(seconds=30),
        None,
    ]
    calls: list[float] = []

    async def reconcile(key: str) -> dt.timedelta | None:
        assert key == "ns/m"
        calls.append(timer.monotonic())
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    worker = asyncio.create_task(run_worker(queue, reconcile, metrics=metrics))
    start = timer.monotonic()
    queue.add("ns/m")
    await timer.advance(0)
    assert calls == [start]
    assert queue.failures("ns/m") == 1
    await timer.advance(1.0)  # first backoff step
    assert len(calls) == 2
    await timer.advance(2.0)  # second
    assert len(calls) == 3
    await timer.advance(4.0)  # third; this reconcile succeeds and asks to look again in 30s
    assert len(calls) == 4
    assert queue.failures("ns/m") == 0, "success resets the backoff"
    await timer.advance(29.9)
    assert len(calls) == 4
    await timer.advance(0.1)
    assert len(calls) == 5
    assert calls[1:] == [start + 1, start + 3, start + 7, start + 37]
    await timer.advance(3600)
    assert len(calls) == 5, "no requeue was asked for"

    queue.shutdown()
    await asyncio.wait_for(worker, 1)
    samples = {
        s.labels["result"]: s.value
        for metric in metrics.reconcile_duration.collect()
        for s in metric.samples
        if s.name.endswith("_count")
    }
    assert samples == {"conflict": 1.0, "error": 2.0, "success": 2.0}


async def test_a_plan_whose_object_is_gone_ends_without_a_retry() -> None:
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="machinesets", timer=timer, backoff=Backoff(base=1.0, cap=60.0))
    metrics = Metrics()
    outcomes: list[BaseException] = [ApiException(status=500, reason="Internal"), ObjectGone("machine m: Not Found")]
    calls: list[float] = []

    async def reconcile(key: str) -> dt.timedelta | None:
        calls.append(timer.monotonic())
        raise outcomes.pop(0)

    worker = asyncio.create_task(run_worker(queue, reconcile, metrics=metrics))
    queue.add("ns/s")
    await timer.advance(0)
    await timer.advance(1.0)  # the error's backoff
    assert len(calls) == 2
    assert queue.failures("ns/s") == 0, "gone resets the backoff"
    await timer.advance(3600)
    assert len(calls) == 2, "nothing is retried for an object that is gone"

    queue.shutdown()
    await asyncio.wait_for(worker, 1)
    samples = {
        s.labels["result"]: s.value
        for metric in metrics.reconcile_duration.collect()
        for s in metric.samples
        if s.name.endswith("_count")
    }
    assert samples == {"error": 1.0, "success": 1.0}
