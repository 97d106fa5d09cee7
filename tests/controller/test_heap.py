"""keep_heap: freeze every period; every few rounds let the collector walk everything once."""

from __future__ import annotations

import asyncio
import ctypes
import gc
from pathlib import Path

from machine_preservation.controller.machinery.heap import keep_heap
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

    def trim(self) -> None:
        self.calls.append("trim")


async def test_every_round_freezes_and_trims_and_every_third_collects_everything_first() -> None:
    collector = RecordingCollector()
    task = asyncio.create_task(keep_heap(period=0.001, refresh_every=3, collector=collector, trim=collector.trim))
    await eventually_async(lambda: collector.calls.count("trim") >= 6, limit=5, interval=0.001)
    task.cancel()

    assert collector.calls[:16] == [
        "freeze",
        "trim",
        "freeze",
        "trim",
        "unfreeze",
        "collect",
        "freeze",
        "trim",
        "freeze",
        "trim",
        "freeze",
        "trim",
        "unfreeze",
        "collect",
        "freeze",
        "trim",
    ]


async def test_the_c_librarys_free_memory_is_given_back() -> None:
    """glibc's malloc_trim, with the real C library: the pages of a freed block in the heap leave the process."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    assert libc.mallopt(-3, 4 << 20) == 1  # M_MMAP_THRESHOLD: a 1 MiB block comes from the heap, not a mapping
    try:
        *blocks, keeper = [libc.malloc(1 << 20) for _ in range(65)]  # the last above the rest: the top stays
        for block in blocks:
            ctypes.memset(block, 1, 1 << 20)  # resident
        for block in blocks:
            libc.free(ctypes.c_void_p(block))
        before = resident_kib()
        task = asyncio.create_task(keep_heap(period=0.001, collector=RecordingCollector()))
        await eventually_async(lambda: before - resident_kib() >= 32 * 1024, limit=5, interval=0.01)
        task.cancel()
        libc.free(ctypes.c_void_p(keeper))
    finally:
        libc.mallopt(-3, 128 * 1024)


def resident_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


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
