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
    format_go_duration_nanoseconds,
    parse_go_duration,
    parse_go_duration_nanoseconds,
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


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("-1ns", -1),
        ("-999ns", -999),
        ("1ns", 1),
        ("-1.5us", -1500),
        ("0.5ns0.5ns", 0),  # each term is truncated on its own, as Go does
        ("-0.5ns", 0),
        ("72h", 72 * 3600 * 10**9),
        ("-9223372036854775808ns", -(2**63)),  # int64's minimum: only the negative side reaches it
        ("9223372036854775807ns", 2**63 - 1),
    ],
)
def test_parses_exact_nanoseconds(text: str, nanoseconds: int) -> None:
    assert parse_go_duration_nanoseconds(text) == nanoseconds


@pytest.mark.parametrize("text", ["9223372036854775808ns", "-9223372036854775809ns"])
def test_rejects_values_outside_int64(text: str) -> None:
    with pytest.raises(InvalidDuration, match="invalid duration"):
        parse_go_duration_nanoseconds(text)


def test_sub_microsecond_values_truncate_toward_zero_as_timedeltas() -> None:
    assert parse_go_duration("-999ns") == dt.timedelta(0)
    assert parse_go_duration("-1001ns") == dt.timedelta(microseconds=-1)
    assert parse_go_duration("1999ns") == dt.timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("nanoseconds", "text"),
    [
        (0, "0s"),
        (-1, "-1ns"),
        (-999, "-999ns"),
        (1500, "1.5µs"),
        (1_000, "1µs"),
        (1_500_000, "1.5ms"),
        (1_000_000_001, "1.000000001s"),
        (-(2**63), "-2562047h47m16.854775808s"),
        (3_600 * 10**9 + 5 * 10**9, "1h0m5s"),
    ],
)
def test_formats_exact_nanoseconds_like_go(nanoseconds: int, text: str) -> None:
    assert format_go_duration_nanoseconds(nanoseconds) == text


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_exact_format_then_parse_round_trips(nanoseconds: int) -> None:
    assert parse_go_duration_nanoseconds(format_go_duration_nanoseconds(nanoseconds)) == nanoseconds


@pytest.mark.parametrize("text", ["-1ns", "-999ns", "-0.001ms"])
def test_negative_overrides_below_a_microsecond_fall_back(text: str) -> None:
    assert duration_or_default(text, default=dt.timedelta(hours=72), allow_zero=True) == dt.timedelta(hours=72)


def test_positive_overrides_below_a_microsecond_are_zero() -> None:
    assert duration_or_default("1ns", default=dt.timedelta(hours=72), allow_zero=True) == dt.timedelta(0)
    assert duration_or_default("1ns", default=dt.timedelta(hours=72), allow_zero=False) == dt.timedelta(hours=72)
