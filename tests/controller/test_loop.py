"""The one run loop of the seed and of every runtime: workers only once the caches synced, the order of a stop, and
what an informer that ends means (restarted, or the end of the loop)."""

from __future__ import annotations

import asyncio
from typing import Any

from machine_preservation.controller.machinery.loop import Loop, Outcome
from machine_preservation.controller.machinery.queue import WorkQueue
from machine_preservation.kube.backoff import Backoff
from tests.polling import eventually_async


class FakeInformer:
    """Lists when `listed` is set, then runs until cancelled, or ends once when `end` is set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs = 0
        self.listed = asyncio.Event()
        self.end = asyncio.Event()
        self._synced = asyncio.Event()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def relist(self) -> None:
        self._synced.clear()

    async def run(self) -> None:
        self.runs += 1
        await self.listed.wait()
        self._synced.set()
        await self.end.wait()
        self.end.clear()
        raise RuntimeError(f"{self.name}: ended")


def loop_of(*informers: FakeInformer, queue: WorkQueue[str], **settings: Any) -> Loop:
    return Loop(name="test", informers=informers, wait_for=informers, queues=(queue,), **settings)  # type: ignore[arg-type]


async def test_workers_start_only_once_every_cache_synced_and_stop_with_grace() -> None:
    a, b = FakeInformer("a"), FakeInformer("b")
    queue: WorkQueue[str] = WorkQueue(name="q")
    loop = loop_of(a, b, queue=queue, grace=5.0)
    started: list[asyncio.Task[None]] = []
    finished = asyncio.Event()

    async def work() -> None:
        await queue.get()  # None once the queue shuts down
        finished.set()

    def start() -> list[asyncio.Task[None]]:
        started.append(asyncio.create_task(work()))
        return started

    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop=stop, lost=asyncio.Event(), start=start))
    a.listed.set()
    await asyncio.sleep(0.05)
    assert not started, "a cache still listing: no worker yet"
    b.listed.set()
    await eventually_async(lambda: loop.synced, limit=5, interval=0.01)
    assert len(started) == 1
    stop.set()
    assert await running is Outcome.STOPPED
    assert finished.is_set(), "the worker saw the queue shut down and finished within the grace"
    assert not loop.synced


async def test_a_lost_lease_cancels_the_companions_first_and_gives_the_work_no_grace() -> None:
    informer = FakeInformer("a")
    informer.listed.set()
    queue: WorkQueue[str] = WorkQueue(name="q")
    loop = loop_of(informer, queue=queue, grace=30.0)
    order: list[str] = []

    async def heartbeat() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            order.append("heartbeat cancelled")
            raise

    async def busy() -> None:
        try:
            await asyncio.sleep(3600)  # in-flight work that would take the whole grace
        except asyncio.CancelledError:
            order.append("work cancelled")
            raise

    lost = asyncio.Event()
    running = asyncio.create_task(
        loop.run(
            stop=asyncio.Event(),
            lost=lost,
            start=lambda: [asyncio.create_task(busy())],
            companions=[heartbeat],
        )
    )
    await eventually_async(lambda: loop.synced, limit=5, interval=0.01)
    lost.set()
    assert await asyncio.wait_for(running, 5) is Outcome.LOST
    # Cancelled first (the heartbeat writes nothing more), and the work at once: 30 s of grace would time out here.
    assert order == ["heartbeat cancelled", "work cancelled"]


async def test_an_informer_that_ends_ends_the_loop_without_restart() -> None:
    informer = FakeInformer("nodes")
    informer.listed.set()
    loop = loop_of(informer, queue=WorkQueue(name="q"))
    running = asyncio.create_task(loop.run(stop=asyncio.Event(), lost=asyncio.Event(), start=list))
    await eventually_async(lambda: loop.synced, limit=5, interval=0.01)
    informer.end.set()
    assert await asyncio.wait_for(running, 5) is Outcome.INFORMER_FAILED
    assert loop.failed.is_set()
    assert informer.runs == 1


async def test_an_informer_that_ends_is_started_again_with_restart() -> None:
    informer = FakeInformer("clusters")
    informer.listed.set()
    loop = loop_of(informer, queue=WorkQueue(name="q"), restart=Backoff(base=0.01, cap=0.01))
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop=stop, lost=asyncio.Event(), start=list))
    await eventually_async(lambda: loop.synced, limit=5, interval=0.01)
    informer.end.set()
    await eventually_async(lambda: informer.runs == 2 and informer.synced, limit=5, interval=0.01)  # listed anew
    assert not loop.failed.is_set()
    stop.set()
    assert await running is Outcome.STOPPED
