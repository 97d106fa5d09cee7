"""Go duration strings (`time.ParseDuration`), as Kubernetes' metav1.Duration carries them.

Accepts every form Go accepts ("72h", "1h30m", "1.5h", "-2m0s", "300ms", "0") and nothing else;
no "d" unit. Values are compared as numbers, never as strings: exact nanoseconds (Go's Duration) where the
sign matters ("-1ns" is negative), timedeltas (whole microseconds) elsewhere.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Final

_UNIT_NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_NUMBER = re.compile(r"\d+\.?\d*|\.\d+")
_MAX_NANOSECONDS = 2**63 - 1
# What a setting that holds a duration but is not a string is told (Shoot worker fields, the providerConfig).
NOT_A_DURATION_STRING: Final = 'must be a duration string such as "72h"'


class InvalidDuration(ValueError):
    """The text is not a Go duration."""


def parse_go_duration_nanoseconds(text: str) -> int:
    """Parse like Go's time.ParseDuration into exact nanoseconds (Go's Duration); raises InvalidDuration with
    Go's wording on bad input.

    Each number-and-unit term is truncated to whole nanoseconds on its own, as Go does ("0.5ns0.5ns" is 0).
    """
    if not isinstance(text, str):
        raise InvalidDuration(f"time: invalid duration {text!r}")
    rest, negative = text, False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise InvalidDuration(f'time: invalid duration "{text}"')
    total = 0
    position = 0
    while position < len(rest):
        number = _NUMBER.match(rest, position)
        if number is None:
            raise InvalidDuration(f'time: invalid duration "{text}"')
        position = number.end()
        unit_end = position
        while unit_end < len(rest) and rest[unit_end] not in "0123456789.":
            unit_end += 1
        unit = rest[position:unit_end]
        if not unit:
            raise InvalidDuration(f'time: missing unit in duration "{text}"')
        if unit not in _UNIT_NANOSECONDS:
            raise InvalidDuration(f'time: unknown unit "{unit}" in duration "{text}"')
        total += int(Decimal(number.group()) * _UNIT_NANOSECONDS[unit])
        position = unit_end
        # Go's Duration is an int64: -2^63 is the only value without a positive twin.
        if total > _MAX_NANOSECONDS + (1 if negative else 0):
            raise InvalidDuration(f'time: invalid duration "{text}"')
    return -total if negative else total


def _timedelta_of(nanoseconds: int) -> dt.timedelta:
    """Whole microseconds (timedelta's precision), truncated toward zero."""
    magnitude = abs(nanoseconds) // 1000
    return dt.timedelta(microseconds=-magnitude if nanoseconds < 0 else magnitude)


def parse_go_duration(text: str) -> dt.timedelta:
    """Parse like Go's time.ParseDuration, truncated toward zero to whole microseconds.

    Judge the sign with parse_go_duration_nanoseconds: "-1ns" is negative but truncates to zero here.
    """
    return _timedelta_of(parse_go_duration_nanoseconds(text))


def format_go_duration_nanoseconds(nanoseconds: int) -> str:
    """Render exactly like Go's Duration.String() ("72h0m0s", "1.5s", "-999ns", "1.5µs", "0s")."""
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    magnitude = abs(nanoseconds)
    if magnitude < 1_000:
        return f"{sign}{magnitude}ns"
    if magnitude < 1_000_000:
        return f"{sign}{_decimal(magnitude, 3)}µs"
    if magnitude < 1_000_000_000:
        return f"{sign}{_decimal(magnitude, 6)}ms"
    hours, remainder = divmod(magnitude, 3_600 * 1_000_000_000)
    minutes, remainder = divmod(remainder, 60 * 1_000_000_000)
    seconds = f"{_decimal(remainder, 9)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{seconds}"


def _decimal(value: int, digits: int) -> str:
    """`value / 10**digits` without trailing zeros in the fraction (exact: integer arithmetic only)."""
    whole, fraction = divmod(value, 10**digits)
    text = str(fraction).rjust(digits, "0").rstrip("0")
    return f"{whole}.{text}" if text else str(whole)


def timedelta_nanoseconds(value: dt.timedelta) -> int:
    return ((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds) * 1000


def format_go_duration(value: dt.timedelta) -> str:
    """Render like Go's Duration.String() ("72h0m0s", "1.5s", "0s")."""
    return format_go_duration_nanoseconds(timedelta_nanoseconds(value))


def duration_or_default(text: str | None, *, default: dt.timedelta, allow_zero: bool) -> dt.timedelta:
    """A per-object duration override: `text` when it is a valid Go duration in range, else `default`.

    An invalid override on an object must not stop the controller; it falls back to the configured value.
    """
    if text is None:
        return default
    try:
        nanoseconds = parse_go_duration_nanoseconds(text)
    except InvalidDuration:
        return default
    if nanoseconds < 0:  # judged on the exact value: "-1ns" is negative, though it truncates to zero
        return default
    value = _timedelta_of(nanoseconds)
    in_range = allow_zero or value > dt.timedelta(0)
    return value if in_range else default
