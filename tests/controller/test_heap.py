"""keep_heap: freeze every period; every few rounds let the collector walk everything once."""

from __future__ import annotations

import asyncio
import gc

from machine_preservation.controller.heap import keep_heap
from tests.polling import eventually_async


class RecordingCollector:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self) -> int:
        self.calls.append("collect")
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


async def test_every_round_freezes_and_every_third_collects_everything_first() -> None:
    collector = RecordingCollector()
    task = asyncio.create_task(keep_heap(period=0.001, refresh_every=3, collector=collector))
    await eventually_async(lambda: collector.calls.count("freeze") >= 6, limit=5, interval=0.001)
    task.cancel()

    assert collector.calls[:10] == [
        "freeze",
        "freeze",
        "unfreeze",
        "collect",
        "freeze",
        "freeze",
        "freeze",
        "unfreeze",
        "collect",
        "freeze",
    ]


async def test_nothing_happens_before_the_first_period() -> None:
    collector = RecordingCollector()
    task = asyncio.create_task(keep_heap(period=60, collector=collector))
    await asyncio.sleep(0.05)
    task.cancel()

    assert collector.calls == []


async def test_with_the_real_collector_the_survivors_are_frozen() -> None:
    survivor = ["a list is always tracked"]
    assert any(o is survivor for o in gc.get_objects())
    try:
        task = asyncio.create_task(keep_heap(period=0.01))
        # Frozen objects live in the permanent generation, which get_objects() does not list.
        await eventually_async(lambda: all(o is not survivor for o in gc.get_objects()), limit=5, interval=0.01)
        task.cancel()
    finally:
        gc.unfreeze()
    assert any(o is survivor for o in gc.get_objects())
