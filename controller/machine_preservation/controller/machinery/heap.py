"""Short pauses of the garbage collector in a process whose caches hold a seed.

A full collection of CPython walks every object the collector tracks, and it runs whenever the long-lived
objects have grown by a quarter, that is in the middle of reconciles. With the caches of 200 shoots it took
~180 ms (~700,000 objects; ~600 ms when Nodes were cached whole), which was the tail of Failed → preserved.
The caches are long-lived by design, so every `period` everything is moved out of the collector's sight
(`gc.freeze`, a constant-time splice): a collection then walks only what came since. Frozen objects are still
freed by reference counting, which frees nearly everything here (the models hold no cycles); cycles among them
(tasks and errors of the work that was running at a freeze) wait for the refresh, which every `refresh_every`
periods lets the collector walk everything once: the only full pause, once in `period × refresh_every`.

After each round the C library is asked to give free memory back to the system (glibc's `malloc_trim`): a burst
(the cold start's lists, a seed's overlapping drains) leaves pages of its heap free but resident, 9 MiB of the
extension's at 200 shoots after its samples. It runs in a thread, as it walks the heap for a few milliseconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from collections.abc import Callable
from typing import Protocol

DEFAULT_PERIOD = 10.0
DEFAULT_REFRESH_EVERY = 60  # a full walk every 10 minutes


class Collector(Protocol):
    def collect(self) -> int: ...

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`; None where the C library has none (musl)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return None if trim is None else lambda: trim(0)


MALLOC_TRIM = _malloc_trim()


async def keep_heap(
    *,
    period: float = DEFAULT_PERIOD,
    refresh_every: int = DEFAULT_REFRESH_EVERY,
    collector: Collector = gc,
    trim: Callable[[], object] | None = MALLOC_TRIM,
) -> None:
    """Freeze every `period` seconds; every `refresh_every` rounds unfreeze, collect and freeze; then `trim`.
    Runs until cancelled."""
    rounds = 0
    while True:
        await asyncio.sleep(period)
        rounds += 1
        if rounds % refresh_every == 0:
            collector.unfreeze()
            collector.collect()
        collector.freeze()
        if trim is not None:
            await asyncio.to_thread(trim)
