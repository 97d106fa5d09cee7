"""Go durations as command-line flags: the argparse `type` every component's command line uses.

A malformed value or one out of the flag's range is a usage error (exit code 2) with Go's own message.
Negative is judged on the exact value ("-1ns" is negative); positive on the value used, in whole
microseconds ("1ns" is zero there, so not positive).
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Literal

from machine_preservation.core.durations import InvalidDuration, parse_go_duration, parse_go_duration_nanoseconds

# "any": the range is checked later, with the setting it belongs to (e.g. against another setting).
DurationRange = Literal["any", "not negative", "positive"]


def go_duration_argument(*, accept: DurationRange) -> Callable[[str], dt.timedelta]:
    """An argparse `type` for a Go duration flag that accepts the values in `accept`."""

    def parse(text: str) -> dt.timedelta:
        try:
            nanoseconds = parse_go_duration_nanoseconds(text)
        except InvalidDuration as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        value = parse_go_duration(text)
        if accept == "not negative" and nanoseconds < 0:
            raise argparse.ArgumentTypeError(f"must not be negative: {text}")
        if accept == "positive" and value <= dt.timedelta(0):
            raise argparse.ArgumentTypeError(f"must be positive: {text}")
        return value

    return parse
