"""The one run loop of every controller in the process: informers, then workers once the caches synced, until
stopped or leadership is lost.

The seed's Extension controller and each namespace's preservation runtime are both this loop; they differ only
in what they watch, what their workers do, and what an informer that ends means:
- with `restart` (a `Backoff`): it is started again and lists anew (the seed-wide watches: the seed goes on);
- without: the loop ends with `Outcome.INFORMER_FAILED` (a runtime: its supervisor, or the process, starts afresh).

The order of a stop is fixed here once: on a lost Lease the companions (e.g. the heartbeat) are cancelled first,
so no write follows; then the queues shut down, in-flight work gets `grace` seconds (none when leadership is gone:
another leader may already be writing), the `stopping` hook runs alongside, and the informers stop last.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from machine_preservation.controller.machinery.queue import WorkQueue, stop_workers
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.informer import Informer, supervise

logger = logging.getLogger(__name__)


class Cache(Protocol):
    """A cache the workers read: an informer, or a view of one that someone else runs."""

    async def wait_synced(self) -> None: ...


class Outcome(enum.Enum):
    STOPPED = "stopped"  # `stop` was set
    LOST = "lost"  # `lost` was set: leadership is gone
    INFORMER_FAILED = "informer failed"  # a cache no longer follows its cluster


@dataclass
class Loop:
    name: str  # in the logs: whose loop
    informers: Sequence[Informer[Any]]  # run for the loop's lifetime
    # What the workers read before they start: the informers run here, or caches someone else runs (views).
    wait_for: Sequence[Cache]
    queues: Sequence[WorkQueue[Any]]  # shut down when the loop ends
    restart: Backoff | None = None
    grace: float = 30.0
    # Set when an informer ended and is not restarted (it stays set: the loop is over).
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    synced: bool = False  # the caches synced and the workers started

    async def run(
        self,
        *,
        stop: asyncio.Event,
        lost: asyncio.Event,
        start: Callable[[], list[asyncio.Task[None]]],
        companions: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
        stopping: Callable[[], Awaitable[None]] | None = None,
    ) -> Outcome:
        """Run the informers and `companions`; once the caches in `wait_for` synced, `start` the workers; return
        once `stop` or `lost` is set or an informer failed for good."""
        informers = [self._run_informer(informer) for informer in self.informers]
        helpers = [asyncio.create_task(companion()) for companion in companions]
        waiting = asyncio.create_task(_wait_synced(self.wait_for))
        workers: list[asyncio.Task[None]] = []
        try:
            await _first_of(stop.wait(), lost.wait(), self.failed.wait(), asyncio.shield(waiting))
            if waiting.done() and not (stop.is_set() or lost.is_set() or self.failed.is_set()):
                workers = start()
                self.synced = True
                await _first_of(stop.wait(), lost.wait(), self.failed.wait())
            if self.failed.is_set():
                return Outcome.INFORMER_FAILED
            return Outcome.LOST if lost.is_set() else Outcome.STOPPED
        finally:
            self.synced = False
            if lost.is_set():
                _cancel(helpers)  # no write after the Lease is gone
            for queue in self.queues:
                queue.shutdown()
            grace = 0.0 if lost.is_set() else self.grace
            await asyncio.gather(stop_workers(workers, grace=grace), stopping() if stopping else asyncio.sleep(0))
            _cancel([waiting, *helpers, *informers])
            await asyncio.gather(waiting, *helpers, *informers, return_exceptions=True)

    def _run_informer(self, informer: Informer[Any]) -> asyncio.Task[None]:
        if self.restart is not None:
            return asyncio.create_task(supervise(informer, self.restart), name=f"informer-{informer.name}")
        task = asyncio.create_task(informer.run(), name=f"informer-{informer.name}")
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """An informer runs until cancelled; one that ended otherwise leaves its cache stale for good."""
        if task.cancelled():
            return
        logger.error(
            "%s: %s ended (%r): its cache no longer follows the cluster", self.name, task.get_name(), task.exception()
        )
        self.failed.set()


async def _wait_synced(caches: Sequence[Cache]) -> None:
    await asyncio.gather(*(cache.wait_synced() for cache in caches))


async def _first_of(*waits: Awaitable[Any]) -> None:
    """Until the first of `waits` is done; the others are cancelled."""
    futures = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        _cancel(futures)


def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for task in tasks:
        task.cancel()


async def wait_any(*events: asyncio.Event) -> None:
    """Until one of the events is set."""
    await _first_of(*(event.wait() for event in events))
