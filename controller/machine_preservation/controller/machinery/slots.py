"""A process-wide cap on the reconciles that run at once, shared by every shoot's workers.

Each shoot has workers of its own (so one shoot's backlog never waits behind another's keys), and 200 shoots
would otherwise run up to 200 × 6 reconciles at once: as many requests in flight to the seed's API server, as
much memory for their responses. A worker takes a slot for each reconcile; slots are handed out first come,
first served, and a shoot has at most its few workers waiting, so a shoot with a thousand keys queued takes turns
with a shoot that has one. The slots bound what the shoots share (the seed's API server, the event loop), so a
reconcile gives its slot back while it waits on its own shoot: during every request to the shoot's API server
(`trace_config`, on the shoot's client), and around the waits on the shoot that are not a request of its own
(`lent`: a drain waiting for pods to leave, the first list of a node's pods, writes another task sends). It takes
a slot again for what follows; drains are paced by their own per-shoot limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp


@dataclass
class _Hold:
    """A slot taken by one task, the reconcile's: only that task lends it. A task it starts (`create_task`, and
    `wait_for` on Python 3.11) inherits its context, and with it this hold, but never lends the slot: it would give
    back one it does not hold."""

    task: asyncio.Task[Any] | None
    lent: bool = False  # given back while the task waits on a shoot


_holding: contextvars.ContextVar[_Hold | None] = contextvars.ContextVar("reconcile_slot", default=None)


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
        hold = _Hold(task=asyncio.current_task())
        token = _holding.set(hold)
        try:
            yield
        finally:
            if not hold.lent:  # not when cancelled while waiting to take it back
                self.in_use -= 1
                semaphore.release()
            _holding.reset(token)

    @contextlib.asynccontextmanager
    async def lent(self) -> AsyncIterator[None]:
        """Waiting that is not work (a drain, another task's writes to the shoot): the slot held by this task, if
        any, is free meanwhile."""
        hold = self._lendable()
        if hold is None:
            yield
            return
        self._give_back(hold)
        try:
            yield
        finally:
            await self._take_back(hold)

    def trace_config(self) -> aiohttp.TraceConfig:
        """For a shoot's API client, the one place its requests lend: while a request of a reconcile holding a slot
        waits for the shoot's answer, the slot is free; it is taken back once answered (not when cancelled)."""
        trace = aiohttp.TraceConfig()

        async def sent(_: aiohttp.ClientSession, request: SimpleNamespace, __: object) -> None:
            request.hold = self._lendable()
            if request.hold is not None:
                self._give_back(request.hold)

        async def answered(_: aiohttp.ClientSession, request: SimpleNamespace, params: object) -> None:
            hold, request.hold = getattr(request, "hold", None), None
            cancelled = isinstance(getattr(params, "exception", None), asyncio.CancelledError)
            if hold is not None and not cancelled:
                await self._take_back(hold)

        trace.on_request_start.append(sent)
        trace.on_request_end.append(answered)
        trace.on_request_exception.append(answered)
        return trace

    def _lendable(self) -> _Hold | None:
        hold = _holding.get()
        if self._semaphore is None or hold is None or hold.lent or hold.task is not asyncio.current_task():
            return None
        return hold

    def _give_back(self, hold: _Hold) -> None:
        assert self._semaphore is not None
        self.in_use -= 1
        self._semaphore.release()
        hold.lent = True

    async def _take_back(self, hold: _Hold) -> None:
        assert self._semaphore is not None
        await self._semaphore.acquire()
        self.in_use += 1
        hold.lent = False
