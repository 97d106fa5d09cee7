"""A de-duplicating work queue with delayed requeue and per-key exponential backoff.

Semantics follow client-go's workqueue (the type controller-runtime builds on):

- `add(key)`: a key waiting in the queue is not added twice; a key being processed is marked dirty
  and handed out again only after `done(key)`, so one key is never processed concurrently;
- `add(key, background=True)`: the same, in a second lane that is served only when the first is empty.
  Periodic resyncs use it, so a change or a due timer (an expiry) never waits behind a resync of every
  object; a key waiting in the background lane moves up when it is added normally. At most one background
  key is in flight at a time: reconciles share one event loop, and several workers busy with a resync would
  slow every await of an urgent reconcile (each HTTP response waits behind their CPU slices);
- `add_after(key, delay)`: the key is added once `delay` has passed on the injected timer; when the
  same key is scheduled several times the earliest time wins (a later event never postpones an
  expiry);
- `add_rate_limited(key)`: `add_after` with a per-key exponential backoff (`forget(key)` resets it);
- `shutdown()`: `get()` returns None from then on; keys in flight still reach `done()`.

Time comes from a monotonic `Timer` so tests drive it without sleeping.

`run_worker` is the loop that takes keys from a queue, reconciles them and requeues them as the outcome says.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar

from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.kube.api_errors import Conflict, Failed, call
from machine_preservation.kube.backoff import Backoff

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class Timer(Protocol):
    """Monotonic seconds and a sleep on the same time line."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemTimer:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class WorkQueue(Generic[K]):
    def __init__(self, *, name: str, timer: Timer | None = None, backoff: Backoff | None = None) -> None:
        self.name = name
        self._timer: Timer = timer or SystemTimer()
        self._backoff = backoff or Backoff()
        self._ready: deque[K] = deque()
        self._background: dict[K, None] = {}  # insertion-ordered, O(1) removal when a key moves up
        self._dirty: set[K] = set()
        self._requeue_in_background: set[K] = set()  # dirty keys in flight that only a resync asked for
        self._processing: set[K] = set()
        self._background_in_flight: set[K] = set()
        self._failures: dict[K, int] = {}
        self._delayed: list[tuple[float, int, K]] = []
        self._delayed_at: dict[K, float] = {}
        self._sequence = itertools.count()
        self._changed = asyncio.Event()
        self._shutting_down = False

    # --- producers ---------------------------------------------------------------------------------

    def add(self, key: K, *, background: bool = False) -> None:
        if self._shutting_down:
            return
        if key in self._dirty:
            if not background:
                self._requeue_in_background.discard(key)
                if key in self._background:
                    del self._background[key]
                    self._ready.append(key)
            return
        self._dirty.add(key)
        if key in self._processing:
            if background:
                self._requeue_in_background.add(key)
            return
        if background:
            self._background[key] = None
        else:
            self._ready.append(key)
        self._changed.set()

    def add_after(self, key: K, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        due = self._timer.monotonic() + delay
        current = self._delayed_at.get(key)
        if current is not None and current <= due:
            return
        self._delayed_at[key] = due
        heapq.heappush(self._delayed, (due, next(self._sequence), key))
        self._changed.set()

    def add_rate_limited(self, key: K) -> float:
        """Requeue after the key's next backoff step; returns the delay chosen."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self._backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    # --- consumers ---------------------------------------------------------------------------------

    async def get(self) -> K | None:
        """The next key to process (marked in flight), or None once the queue is shut down."""
        while True:
            if self._shutting_down:
                return None
            next_due = self._promote_due()
            if self._ready or (self._background and not self._background_in_flight):
                if self._ready:
                    key = self._ready.popleft()
                else:
                    key = next(iter(self._background))
                    del self._background[key]
                    self._background_in_flight.add(key)
                self._processing.add(key)
                self._dirty.discard(key)
                return key
            self._changed.clear()
            await self._wait(None if next_due is None else next_due - self._timer.monotonic())

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._background_in_flight:
            self._background_in_flight.discard(key)
            self._changed.set()  # the background slot is free again
        if key in self._dirty and not self._shutting_down:
            if key in self._requeue_in_background:
                self._requeue_in_background.discard(key)
                self._background[key] = None
            else:
                self._ready.append(key)
            self._changed.set()

    def shutdown(self) -> None:
        self._shutting_down = True
        self._changed.set()

    # --- introspection -----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys waiting to be processed now, in both lanes (the queue depth)."""
        return len(self._ready) + len(self._background)

    def scheduled(self, key: K) -> float | None:
        """When (on the timer) a delayed add of `key` is due, if one is pending."""
        return self._delayed_at.get(key)

    # --- internals ---------------------------------------------------------------------------------

    def _promote_due(self) -> float | None:
        """Move due delayed keys to the ready queue; return when the next one is due."""
        current = self._timer.monotonic()
        while self._delayed:
            due, _, key = self._delayed[0]
            if self._delayed_at.get(key) != due:
                heapq.heappop(self._delayed)  # superseded by an earlier schedule
                continue
            if due > current:
                return due
            heapq.heappop(self._delayed)
            del self._delayed_at[key]
            self.add(key)
        return None

    async def _wait(self, delay: float | None) -> None:
        """Until something is added, the queue shuts down, or `delay` passes on the timer."""
        waiters: set[asyncio.Future[object]] = {asyncio.ensure_future(self._changed.wait())}
        if delay is not None:
            waiters.add(asyncio.ensure_future(self._timer.sleep(delay)))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()


class ObjectGone(Exception):
    """What a key's reconcile acts on no longer exists: the key is done with (a deletion is an event of its own)."""


class RetryWithBackoff(Exception):
    """A key's reconcile could not finish, in a way its code foresaw; the key comes back after its backoff."""

    # Whether it lost a race with another writer (counted apart in the metrics).
    conflict: bool = False


# Reconciles one key; returns when to look at it again (None: only on a change).
Reconcile = Callable[[str], Awaitable[dt.timedelta | None]]


async def run_worker(
    queue: WorkQueue[str], reconcile: Reconcile, *, metrics: Metrics, slots: ReconcileSlots | None = None
) -> None:
    """Reconcile keys from the queue until it shuts down, each in one of the process's `slots`. A key whose
    reconcile failed comes back after its backoff; one that succeeded has its backoff reset and comes back when
    the reconcile asked for; one whose plan found its object gone is done with."""
    loop = asyncio.get_running_loop()
    slots = slots or ReconcileSlots()
    while (key := await queue.get()) is not None:
        try:
            async with slots.held():
                await _reconcile_one(queue, reconcile, key, metrics=metrics, loop=loop)
        finally:
            queue.done(key)
        # A reconcile that plans nothing never suspends, and neither does `get` while keys are ready:
        # without this yield one worker runs a whole resync's keys (2,000 machines: ~2 s) without
        # letting the watches, the probes or the Lease renewal run.
        await asyncio.sleep(0)


async def _reconcile_one(
    queue: WorkQueue[str], reconcile: Reconcile, key: str, *, metrics: Metrics, loop: asyncio.AbstractEventLoop
) -> None:
    """One key's reconcile and what its outcome means for the key: the worker's policy in one table."""
    started = loop.time()
    result = "success"
    try:
        requeue = await call(reconcile(key))
    except ObjectGone as gone:
        queue.forget(key)  # what the plan writes is gone: its deletion is an event of its own
        logger.info("%s %s: %s; nothing more to do", queue.name, key, gone)
    except RetryWithBackoff as failed:
        result = "conflict" if failed.conflict else "error"
        delay = queue.add_rate_limited(key)
        logger.info("%s %s: %s; retry in %.1fs", queue.name, key, failed, delay)
    except Failed as error:
        result = "conflict" if isinstance(error, Conflict) else "error"
        delay = queue.add_rate_limited(key)
        logger.info("%s %s: %s %s; retry in %.1fs", queue.name, key, error.status, error.reason, delay)
    except Exception:
        result = "error"
        delay = queue.add_rate_limited(key)
        logger.exception("%s %s: reconcile failed; retry in %.1fs", queue.name, key, delay)
    else:
        queue.forget(key)
        if requeue is not None:
            queue.add_after(key, requeue.total_seconds())
    finally:
        metrics.reconcile_duration.labels(controller=queue.name, result=result).observe(loop.time() - started)


async def stop_workers(workers: list[asyncio.Task[None]], *, grace: float) -> None:
    """After the queues shut down: let in-flight reconciles finish within `grace` seconds (none at all when 0, as
    after losing the Lease: another leader may already be writing), cancel the rest, wait for all."""
    pending = set(workers)
    if workers and grace > 0:
        _, pending = await asyncio.wait(workers, timeout=grace)
    for task in pending:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
