"""Go duration parsing: the forms metav1.Duration accepts, and nothing else."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.durations import (
    InvalidDuration,
    duration_or_default,
    format_go_duration,
    parse_go_duration,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("72h", dt.timedelta(hours=72)),
        ("72h0m0s", dt.timedelta(hours=72)),
        ("1h30m", dt.timedelta(hours=1, minutes=30)),
        ("1.5h", dt.timedelta(hours=1, minutes=30)),
        ("-2m0s", dt.timedelta(minutes=-2)),
        ("+3s", dt.timedelta(seconds=3)),
        ("300ms", dt.timedelta(milliseconds=300)),
        ("1500us", dt.timedelta(microseconds=1500)),
        ("1500µs", dt.timedelta(microseconds=1500)),
        (".5s", dt.timedelta(milliseconds=500)),
        ("1.s", dt.timedelta(seconds=1)),
        ("0", dt.timedelta(0)),
        ("-0", dt.timedelta(0)),
        ("0s", dt.timedelta(0)),
    ],
)
def test_parses_go_forms(text: str, expected: dt.timedelta) -> None:
    assert parse_go_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'invalid duration ""'),
        ("1d", 'unknown unit "d" in duration "1d"'),
        ("h", 'invalid duration "h"'),
        ("5", 'missing unit in duration "5"'),
        ("1e3s", 'unknown unit "e" in duration "1e3s"'),
        (" 1h", 'invalid duration " 1h"'),
        ("1h ", 'unknown unit "h " in duration "1h "'),
        ("1H", 'unknown unit "H" in duration "1H"'),
        ("1h.", 'invalid duration "1h."'),
        ("2562048h", 'invalid duration "2562048h"'),
        ("-", 'invalid duration "-"'),
    ],
)
def test_rejects_what_go_rejects(text: str, message: str) -> None:
    with pytest.raises(InvalidDuration, match=message.replace("(", r"\(")):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (dt.timedelta(hours=72), "72h0m0s"),
        (dt.timedelta(minutes=-2), "-2m0s"),
        (dt.timedelta(seconds=1.5), "1.5s"),
        (dt.timedelta(milliseconds=300), "300ms"),
        (dt.timedelta(0), "0s"),
        (dt.timedelta(minutes=1, seconds=5), "1m5s"),
    ],
)
def test_formats_like_go(value: dt.timedelta, text: str) -> None:
    assert format_go_duration(value) == text


@given(st.timedeltas(min_value=dt.timedelta(days=-10_000), max_value=dt.timedelta(days=10_000)))
def test_format_then_parse_round_trips(value: dt.timedelta) -> None:
    assert parse_go_duration(format_go_duration(value)) == value


@pytest.mark.parametrize(
    ("text", "allow_zero", "expected"),
    [
        (None, True, dt.timedelta(hours=72)),
        ("1h", True, dt.timedelta(hours=1)),
        ("0s", True, dt.timedelta(0)),
        ("0s", False, dt.timedelta(hours=72)),
        ("-1h", True, dt.timedelta(hours=72)),
        ("3 days", True, dt.timedelta(hours=72)),
        ("", False, dt.timedelta(hours=72)),
    ],
)
def test_duration_or_default_falls_back_on_missing_invalid_or_out_of_range(
    text: str | None, allow_zero: bool, expected: dt.timedelta
) -> None:
    assert duration_or_default(text, default=dt.timedelta(hours=72), allow_zero=allow_zero) == expected
