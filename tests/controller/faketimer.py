"""A manually advanced monotonic timer for the work queue: time moves only when a test says so."""

from __future__ import annotations

import asyncio


class FakeTimer:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + max(seconds, 0.0), future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward, wake every sleeper that is due, and let woken tasks run."""
        self._now += seconds
        due = [(at, f) for at, f in self._sleepers if at <= self._now]
        self._sleepers = [(at, f) for at, f in self._sleepers if at > self._now]
        for _, future in due:
            if not future.done():
                future.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
