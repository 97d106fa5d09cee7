"""A process-wide cap on the reconciles that run at once, shared by every shoot's workers.

Each shoot has workers of its own (so one shoot's backlog never waits behind another's keys), and 200 shoots
would otherwise run up to 200 × 6 reconciles at once: as many requests in flight to the seed's API server, as
much memory for their responses. A worker takes a slot for each reconcile; slots are handed out first come,
first served, and a shoot has at most its few workers waiting, so a shoot with a thousand keys queued takes turns
with a shoot that has one. A drain gives its slot back while it waits for pods to leave (an attempt may take
minutes) and takes one again for the writes of its outcome: drains are paced by their own per-shoot limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# Whether the running task holds a slot (set by `held`): only then does `lent` give one back.
_holding: contextvars.ContextVar[bool] = contextvars.ContextVar("holding_reconcile_slot", default=False)


@dataclass
class ReconcileSlots:
    limit: int = 0  # 0: no cap (a standalone controller serves one cluster)
    in_use: int = field(default=0, init=False)
    _semaphore: asyncio.Semaphore | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.limit > 0:
            self._semaphore = asyncio.Semaphore(self.limit)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """One reconcile: waits for a slot, holds it until the block ends."""
        semaphore = self._semaphore
        if semaphore is None:
            yield
            return
        await semaphore.acquire()
        self.in_use += 1
        token = _holding.set(True)
        try:
            yield
        finally:
            if _holding.get():  # not when cancelled while `lent` waited to take it back
                self.in_use -= 1
                semaphore.release()
            _holding.reset(token)

    @contextlib.asynccontextmanager
    async def lent(self) -> AsyncIterator[None]:
        """Waiting that is not work (a drain): the slot held by this task, if any, is free meanwhile."""
        semaphore = self._semaphore
        if semaphore is None or not _holding.get():
            yield
            return
        self.in_use -= 1
        semaphore.release()
        _holding.set(False)
        try:
            yield
        finally:
            await semaphore.acquire()
            self.in_use += 1
            _holding.set(True)


def detached(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`work` as a task of its own that holds no slot: it never gives back the slot of the task that started it
    (a task inherits the context, and with it the mark of a held slot)."""
    context = contextvars.copy_context()
    context.run(_holding.set, False)
    return asyncio.create_task(work, context=context)
