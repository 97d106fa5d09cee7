"""Work-queue semantics with a controlled clock: de-duplication, no concurrent processing of a key,
delayed requeue at the exact time (earliest wins), per-key exponential backoff, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from machine_preservation.controller.queue import Backoff, WorkQueue
from tests.controller.fakeclock import FakeClock


async def next_now(queue: WorkQueue[str]) -> str | None:
    """The key `get()` hands out without any time passing (fails if it would block)."""
    return await asyncio.wait_for(queue.get(), timeout=1.0)


async def blocks(queue: WorkQueue[str]) -> bool:
    task = asyncio.ensure_future(queue.get())
    for _ in range(5):
        await asyncio.sleep(0)
    blocked = not task.done()
    task.cancel()
    return blocked


async def test_adding_a_waiting_key_twice_hands_it_out_once() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", clock=FakeClock())
    queue.add("a")
    queue.add("b")
    queue.add("a")
    assert len(queue) == 2
    assert await next_now(queue) == "a"
    assert await next_now(queue) == "b"
    assert await blocks(queue)


async def test_a_key_added_while_in_flight_waits_until_done() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", clock=FakeClock())
    queue.add("a")
    assert await next_now(queue) == "a"
    queue.add("a")
    assert await blocks(queue), "the key must not be handed to a second worker while in flight"
    queue.done("a")
    assert await next_now(queue) == "a"
    queue.done("a")
    assert await blocks(queue)


async def test_delayed_add_fires_exactly_at_the_time_and_earliest_wins() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(name="t", clock=clock)
    queue.add_after("a", 10.0)
    queue.add_after("a", 30.0)  # later schedule does not postpone
    queue.add_after("b", 20.0)
    waiter = asyncio.ensure_future(queue.get())
    await clock.advance(9.999)
    assert not waiter.done()
    await clock.advance(0.001)
    assert await asyncio.wait_for(waiter, 1.0) == "a"
    queue.done("a")
    assert queue.scheduled("a") is None
    assert await blocks(queue)
    await clock.advance(10.0)
    assert await next_now(queue) == "b"


async def test_an_earlier_schedule_replaces_a_later_one() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(name="t", clock=clock)
    queue.add_after("a", 60.0)
    queue.add_after("a", 5.0)
    assert queue.scheduled("a") == clock.monotonic() + 5.0
    await clock.advance(5.0)
    assert await next_now(queue) == "a"
    queue.done("a")
    await clock.advance(60.0)
    assert await blocks(queue), "the superseded schedule must not fire again"


async def test_backoff_grows_exponentially_per_key_and_forget_resets_it() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(name="t", clock=clock, backoff=Backoff(base=1.0, cap=5.0))
    assert [queue.add_rate_limited("a") for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert queue.add_rate_limited("b") == 1.0
    assert queue.failures("a") == 5
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 1.0


async def test_rate_limited_key_is_handed_out_after_its_backoff() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(name="t", clock=clock, backoff=Backoff(base=2.0, cap=60.0))
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")  # second failure: 4s, but the 2s schedule is earlier and wins
    waiter = asyncio.ensure_future(queue.get())
    await clock.advance(1.9)
    assert not waiter.done()
    await clock.advance(0.1)
    assert await asyncio.wait_for(waiter, 1.0) == "a"


async def test_shutdown_wakes_waiting_consumers_and_refuses_new_keys() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", clock=FakeClock())
    waiters = [asyncio.ensure_future(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)
    queue.shutdown()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1.0) == [None, None, None]
    queue.add("a")
    assert len(queue) == 0
    assert await next_now(queue) is None


async def test_many_workers_never_share_a_key() -> None:
    """Bounded pool of 4 workers hammered with duplicate keys: no key is ever processed twice at once."""
    queue: WorkQueue[str] = WorkQueue(name="t", clock=FakeClock())
    active: set[str] = set()
    overlaps: list[str] = []
    processed: list[str] = []

    async def worker() -> None:
        while (key := await queue.get()) is not None:
            if key in active:
                overlaps.append(key)
            active.add(key)
            await asyncio.sleep(0)
            processed.append(key)
            if len(processed) < 40:
                queue.add(key)  # an event arrives while the key is in flight
            active.discard(key)
            queue.done(key)

    for key in "abc":
        queue.add(key)
    workers = [asyncio.ensure_future(worker()) for _ in range(4)]
    for _ in range(200):
        await asyncio.sleep(0)
    queue.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == []
    assert len(processed) >= 40
    assert set(processed) == {"a", "b", "c"}


@pytest.mark.parametrize(("failures", "expected"), [(0, 0.0), (1, 0.2), (3, 0.8), (100, 300.0)])
def test_backoff_delays(failures: int, expected: float) -> None:
    assert Backoff().delay(failures) == pytest.approx(expected)
