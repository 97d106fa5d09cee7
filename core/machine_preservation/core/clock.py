"""The wall clock, passed in so that tests can replace it.

A `Clock` returns the current time as an aware UTC datetime; a value read from one is called `now`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

Clock = Callable[[], dt.datetime]


def system_clock() -> dt.datetime:
    """The system's current time, aware, in UTC."""
    return dt.datetime.now(dt.UTC)
