"""Short pauses of the garbage collector in a process whose caches hold a seed.

A full collection of CPython walks every object the collector tracks, and it runs whenever the long-lived
objects have grown by a quarter, that is in the middle of reconciles. With the caches of 200 shoots it took
~180 ms (~700,000 objects; ~600 ms when Nodes were cached whole), which was the tail of Failed → preserved.
The caches are long-lived by design, so every `period` everything is moved out of the collector's sight
(`gc.freeze`, a constant-time splice): a collection then walks only what came since. Frozen objects are still
freed by reference counting, which frees nearly everything here (the models hold no cycles); cycles among them
(tasks and errors of the work that was running at a freeze) wait for the refresh, which every `refresh_every`
periods lets the collector walk everything once: the only full pause, once in `period × refresh_every`.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Protocol

DEFAULT_PERIOD = 10.0
DEFAULT_REFRESH_EVERY = 60  # a full walk every 10 minutes


class Collector(Protocol):
    def collect(self) -> int: ...

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...


async def keep_heap(
    *, period: float = DEFAULT_PERIOD, refresh_every: int = DEFAULT_REFRESH_EVERY, collector: Collector = gc
) -> None:
    """Freeze every `period` seconds; every `refresh_every` rounds unfreeze, collect and freeze. Runs until
    cancelled."""
    rounds = 0
    while True:
        await asyncio.sleep(period)
        rounds += 1
        if rounds % refresh_every == 0:
            collector.unfreeze()
            collector.collect()
        collector.freeze()
