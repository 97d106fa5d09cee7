"""Work-queue semantics with a controlled timer: de-duplication, no concurrent processing of a key,
delayed requeue at the exact time (earliest wins), per-key exponential backoff, shutdown, and the background
lane that keeps resyncs behind changes and due timers."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.controller.machinery.queue import WorkQueue
from machine_preservation.kube.backoff import Backoff
from tests.controller.faketimer import FakeTimer


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
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
    queue.add("a")
    queue.add("b")
    queue.add("a")
    assert len(queue) == 2
    assert await next_now(queue) == "a"
    assert await next_now(queue) == "b"
    assert await blocks(queue)


async def test_a_key_added_while_in_flight_waits_until_done() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
    queue.add("a")
    assert await next_now(queue) == "a"
    queue.add("a")
    assert await blocks(queue), "the key must not be handed to a second worker while in flight"
    queue.done("a")
    assert await next_now(queue) == "a"
    queue.done("a")
    assert await blocks(queue)


async def test_delayed_add_fires_exactly_at_the_time_and_earliest_wins() -> None:
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="t", timer=timer)
    queue.add_after("a", 10.0)
    queue.add_after("a", 30.0)  # later schedule does not postpone
    queue.add_after("b", 20.0)
    waiter = asyncio.ensure_future(queue.get())
    await timer.advance(9.999)
    assert not waiter.done()
    await timer.advance(0.001)
    assert await asyncio.wait_for(waiter, 1.0) == "a"
    queue.done("a")
    assert queue.scheduled("a") is None
    assert await blocks(queue)
    await timer.advance(10.0)
    assert await next_now(queue) == "b"


async def test_an_earlier_schedule_replaces_a_later_one() -> None:
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="t", timer=timer)
    queue.add_after("a", 60.0)
    queue.add_after("a", 5.0)
    assert queue.scheduled("a") == timer.monotonic() + 5.0
    await timer.advance(5.0)
    assert await next_now(queue) == "a"
    queue.done("a")
    await timer.advance(60.0)
    assert await blocks(queue), "the superseded schedule must not fire again"


async def test_backoff_grows_exponentially_per_key_and_forget_resets_it() -> None:
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="t", timer=timer, backoff=Backoff(base=1.0, cap=5.0))
    assert [queue.add_rate_limited("a") for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert queue.add_rate_limited("b") == 1.0
    assert queue.failures("a") == 5
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 1.0


async def test_rate_limited_key_is_handed_out_after_its_backoff() -> None:
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="t", timer=timer, backoff=Backoff(base=2.0, cap=60.0))
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")  # second failure: 4s, but the 2s schedule is earlier and wins
    waiter = asyncio.ensure_future(queue.get())
    await timer.advance(1.9)
    assert not waiter.done()
    await timer.advance(0.1)
    assert await asyncio.wait_for(waiter, 1.0) == "a"


async def test_shutdown_wakes_waiting_consumers_and_refuses_new_keys() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
    waiters = [asyncio.ensure_future(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)
    queue.shutdown()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1.0) == [None, None, None]
    queue.add("a")
    assert len(queue) == 0
    assert await next_now(queue) is None


async def test_many_workers_never_share_a_key() -> None:
    """Bounded pool of 4 workers hammered with duplicate keys: no key is ever processed twice at once."""
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
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


async def test_background_keys_wait_until_the_normal_lane_is_empty() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
    queue.add("r1", background=True)
    queue.add("r2", background=True)
    queue.add("a")
    queue.add("b")
    assert len(queue) == 4
    assert [await next_now(queue) for _ in range(3)] == ["a", "b", "r1"]
    assert await blocks(queue), "one background key in flight at a time"
    queue.add("c")
    assert await next_now(queue) == "c", "changes still go out while a background key is in flight"
    queue.done("r1")
    assert await next_now(queue) == "r2"
    assert await blocks(queue)


async def test_a_normal_add_moves_a_waiting_background_key_up_once() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
    for key in ("r1", "r2", "r3"):
        queue.add(key, background=True)
    queue.add("r3")
    queue.add("r3", background=True)  # a later resync does not move it back down
    assert len(queue) == 3
    assert [await next_now(queue) for _ in range(2)] == ["r3", "r1"]
    queue.done("r1")
    assert await next_now(queue) == "r2"
    assert await blocks(queue)


async def test_a_due_timer_overtakes_a_waiting_resync() -> None:
    """The expiry case: a machine's requeue comes due while every machine waits from a resync."""
    timer = FakeTimer()
    queue: WorkQueue[str] = WorkQueue(name="t", timer=timer)
    queue.add_after("expiring", 5.0)
    for n in range(100):
        queue.add(f"m{n}", background=True)
    assert await next_now(queue) == "m0"
    queue.done("m0")
    await timer.advance(5.0)
    assert await next_now(queue) == "expiring"
    assert await next_now(queue) == "m1"
    assert await blocks(queue)


async def test_a_key_in_flight_is_requeued_in_the_lane_it_was_asked_for() -> None:
    queue: WorkQueue[str] = WorkQueue(name="t", timer=FakeTimer())
    queue.add("a")
    assert await next_now(queue) == "a"
    queue.add("a", background=True)  # a resync while "a" is being reconciled
    queue.add("b")
    queue.done("a")
    assert await next_now(queue) == "b", "the resynced key goes behind the change"
    assert await next_now(queue) == "a"
    queue.add("a", background=True)
    queue.add("a")  # ... unless a change arrives for it too
    queue.add("c", background=True)
    queue.done("a")
    assert await next_now(queue) == "a"
    assert await next_now(queue) == "c"


Operation = tuple[str, int, bool]  # ("add", key, background) or ("take", -, -) or ("finish", index, -)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("take"), st.just(0), st.just(False)),
        st.tuples(st.just("finish"), st.integers(0, 5), st.just(False)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_lanes_never_lose_duplicate_or_share_a_key_and_serve_changes_first(ops: list[Operation]) -> None:
    """Against any interleaving of adds (either lane), gets and dones:
    - a key is never handed out while in flight, and never twice for one round of adds;
    - while any waiting key was asked for normally, `get` hands out such a key;
    - at most one key asked for only in the background is in flight;
    - draining at the end hands out every key added since it was last handed out."""

    async def run() -> None:
        queue: WorkQueue[int] = WorkQueue(name="t", timer=FakeTimer())
        in_flight: list[int] = []
        background_in_flight: set[int] = set()
        pending: dict[int, bool] = {}  # key added since last handed out -> asked for normally at least once

        async def take() -> None:
            urgent_waiting = {k for k, normal in pending.items() if normal and k not in in_flight}
            key = await next_now(queue)
            assert key is not None
            assert key not in in_flight
            assert key in pending, f"{key} handed out without a pending add"
            if urgent_waiting:
                assert pending[key], f"resynced {key} served before changed {sorted(urgent_waiting)}"
            if not pending[key]:
                assert not background_in_flight, f"{key} handed out beside background {background_in_flight}"
                background_in_flight.add(key)
            del pending[key]
            in_flight.append(key)

        def finish(key: int) -> None:
            in_flight.remove(key)
            background_in_flight.discard(key)
            queue.done(key)

        def available() -> bool:
            waiting = {k: normal for k, normal in pending.items() if k not in in_flight}
            return any(waiting.values()) or (bool(waiting) and not background_in_flight)

        for op, arg, background in ops:
            if op == "add":
                queue.add(arg, background=background)
                pending[arg] = pending.get(arg, False) or not background
            elif op == "take" and available():
                await take()
            elif op == "take":
                assert await blocks(queue)
            elif op == "finish" and in_flight:
                finish(in_flight[arg % len(in_flight)])
        while in_flight:
            finish(in_flight[-1])
        while pending:
            await take()
            finish(in_flight[-1])
        assert await blocks(queue)

    asyncio.run(run())


@pytest.mark.parametrize(("failures", "expected"), [(0, 0.0), (1, 0.2), (3, 0.8), (100, 300.0)])
def test_backoff_delays(failures: int, expected: float) -> None:
    assert Backoff().delay(failures) == pytest.approx(expected)
