"""Waiting for eventual state in tests: poll with a limit, never a bare sleep.

`eventually` polls a synchronous check (the blocking kubernetes client; from async code run it with
`asyncio.to_thread`); `eventually_async` polls a check that returns a value or an awaitable, from async
code. Both retry while the check returns something falsy or raises AssertionError or an ApiException of either
kubernetes client (the blocking one's and kubernetes.aio's are two classes), and fail with the last outcome once
the limit has passed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kubernetes.aio.client.exceptions import ApiException as AioApiException
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")

RETRIED = (AssertionError, ApiException, AioApiException)


class _Wait:
    """One wait: its deadline, and the last outcome to report when the deadline passes."""

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._deadline = time.monotonic() + limit
        self.last: object = None

    def open(self) -> bool:
        return time.monotonic() < self._deadline

    def reached(self, result: object) -> bool:
        self.last = result
        return bool(result)

    def expired(self) -> AssertionError:
        return AssertionError(f"not reached within {self._limit:g} s; last outcome: {self.last!r}")


def eventually(check: Callable[[], T], *, limit: float = 60.0, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; return that."""
    wait = _Wait(limit)
    while wait.open():
        try:
            result = check()
        except RETRIED as error:
            wait.last = error
        else:
            if wait.reached(result):
                return result
        time.sleep(interval)
    raise wait.expired()


async def eventually_async(check: Callable[[], Awaitable[T] | T], *, limit: float = 30.0, interval: float = 0.1) -> T:
    """Poll `check` (awaiting what it returns, if awaitable) until the result is truthy; return that."""
    wait = _Wait(limit)
    while wait.open():
        try:
            outcome = check()
            result = await outcome if inspect.isawaitable(outcome) else outcome
        except RETRIED as error:
            wait.last = error
        else:
            if wait.reached(result):
                return result
        await asyncio.sleep(interval)
    raise wait.expired()
