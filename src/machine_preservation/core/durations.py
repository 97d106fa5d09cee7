"""Go duration strings (`time.ParseDuration`), as Kubernetes' metav1.Duration carries them.

Accepts every form Go accepts ("72h", "1h30m", "1.5h", "-2m0s", "300ms", "0") and nothing else;
no "d" unit. Values are compared as timedeltas, never as strings.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

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


class InvalidDuration(ValueError):
    """The text is not a Go duration."""


def parse_go_duration(text: str) -> dt.timedelta:
    """Parse like Go's time.ParseDuration; raises InvalidDuration with Go's wording on bad input."""
    if not isinstance(text, str):
        raise InvalidDuration(f"time: invalid duration {text!r}")
    rest, sign = text, 1
    if rest[:1] in ("-", "+"):
        sign = -1 if rest[0] == "-" else 1
        rest = rest[1:]
    if rest == "0":
        return dt.timedelta(0)
    if not rest:
        raise InvalidDuration(f'time: invalid duration "{text}"')
    total = Decimal(0)
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
        total += Decimal(number.group()) * _UNIT_NANOSECONDS[unit]
        position = unit_end
    if total > _MAX_NANOSECONDS:
        raise InvalidDuration(f'time: invalid duration "{text}"')
    nanoseconds = int(total) * sign
    return dt.timedelta(microseconds=nanoseconds // 1000 if nanoseconds >= 0 else -((-nanoseconds) // 1000))


def format_go_duration(value: dt.timedelta) -> str:
    """Render like Go's Duration.String() at second precision or finer ("72h0m0s", "1.5s", "0s")."""
    total_us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if total_us == 0:
        return "0s"
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    if total_us < 1_000_000:
        if total_us % 1000 == 0:
            return f"{sign}{total_us // 1000}ms"
        return f"{sign}{_trim(total_us / 1000)}ms" if total_us >= 1000 else f"{sign}{total_us}µs"
    hours, remainder = divmod(total_us, 3_600_000_000)
    minutes, remainder = divmod(remainder, 60_000_000)
    seconds = _trim(remainder / 1_000_000)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


def _trim(number: float) -> str:
    return f"{number:.6f}".rstrip("0").rstrip(".")


def duration_or_default(text: str | None, *, default: dt.timedelta, allow_zero: bool) -> dt.timedelta:
    """A per-object duration override: `text` when it is a valid Go duration in range, else `default`.

    An invalid override on an object must not stop the controller; it falls back to the configured value.
    """
    if text is None:
        return default
    try:
        value = parse_go_duration(text)
    except InvalidDuration:
        return default
    in_range = value >= dt.timedelta(0) if allow_zero else value > dt.timedelta(0)
    return value if in_range else default
