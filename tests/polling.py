"""Waiting for eventual state in tests against the real API server: poll with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes.client.exceptions import ApiException

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll until `check` returns a truthy value (or stops raising); fail with the last outcome."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (AssertionError, ApiException) as error:
            last = error
        else:
            if result:
                return result
            last = result
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s; last outcome: {last!r}")
