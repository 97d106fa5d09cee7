"""The preservation record in Machine annotations (core.preservation_record): written and read back exactly,
read defensively (damaged records end like expired ones, every expiry capped at since + the maximum), and
patched with the fewest changes."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.plan import PatchMachineAnnotations
from machine_preservation.core.preservation_record import (
    DrainRecord,
    PreservationRecord,
    format_timestamp,
    parse_timestamp,
    read_record,
    record_patch,
    start_record,
)

from .plan_simulator import patched_annotations
from .preservation_objects import HOUR, NOW

SINCE, UNTIL, BY = v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION
DRAIN = v.PRESERVED_DRAIN_ANNOTATION
FAILING_SINCE, LAST_ATTEMPT = v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION, v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION
ADDED_CA = v.PRESERVED_ADDED_CA_ANNOTATION
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MAX = 720 * HOUR
OTHER = {"example.com/unrelated": "x", v.PRESERVE_ANNOTATION: "now"}

# --- timestamps ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-08-20T10:00:00Z", NOW),
        ("2026-08-20T12:00:00+02:00", NOW),  # an offset is converted to UTC
        ("2026-08-20T10:00:00.5Z", NOW + dt.timedelta(microseconds=500_000)),
        ("2026-08-20T10:00:00", None),  # no zone: ambiguous, rejected
        ("2026-08-20", None),  # a date has no zone either
        ("yesterday", None),
        ("", None),
        (None, None),
        # In range as written, out of it in UTC: malformed, not a crash (a Node's fields are the shoot owner's
        # to write while the webhook is unreachable).
        ("0001-01-01T00:00:00+01:00", None),
        ("9999-12-31T23:59:59-01:00", None),
    ],
)
def test_parse_timestamp_needs_a_zone(text: str | None, expected: dt.datetime | None) -> None:
    parsed = parse_timestamp(text)
    assert parsed == expected
    if parsed is not None:
        assert parsed.tzinfo == dt.UTC


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (NOW, "2026-08-20T10:00:00Z"),
        (NOW + dt.timedelta(microseconds=999_999), "2026-08-20T10:00:00Z"),  # whole seconds, as the API server
        (dt.datetime(2026, 8, 20, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))), "2026-08-20T10:00:00Z"),
        (dt.datetime(2026, 8, 20, 10, 0), "2026-08-20T10:00:00Z"),  # naive: taken as UTC
    ],
)
def test_format_timestamp_is_rfc3339_utc_whole_seconds(moment: dt.datetime, text: str) -> None:
    assert format_timestamp(moment) == text


# --- round trip ------------------------------------------------------------------------------------------

MOMENTS = st.integers(0, 4_000_000_000).map(lambda seconds: EPOCH + dt.timedelta(seconds=seconds))
ZONES = st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=2)), dt.timezone(dt.timedelta(hours=-7, minutes=-30))])
DRAINS = st.one_of(
    st.none(),
    st.just(DrainRecord(outcome=v.DrainOutcome.DRAINED)),
    st.builds(lambda since, last: DrainRecord(v.DrainOutcome.FAILED, since, last), MOMENTS, MOMENTS),
)


@st.composite
def records(draw: st.DrawFn) -> PreservationRecord:
    zone = draw(ZONES)
    return PreservationRecord(
        since=draw(MOMENTS).astimezone(zone),
        until=draw(MOMENTS).astimezone(zone),
        by=draw(st.sampled_from(v.PreservedBy)),
        drain=draw(DRAINS),
        added_ca_annotation=draw(st.booleans()),
    )


@given(records(), st.booleans())
def test_a_record_reads_back_as_written(record: PreservationRecord, with_others: bool) -> None:
    annotations = {**(OTHER if with_others else {}), **record.annotations()}
    assert read_record(annotations) == record
    assert set(record.annotations()) <= set(v.PRESERVATION_RECORD_ANNOTATIONS)


def test_the_annotations_of_a_record() -> None:
    record = PreservationRecord(
        since=NOW,
        until=NOW + 72 * HOUR,
        by=v.PreservedBy.AUTO,
        drain=DrainRecord(v.DrainOutcome.FAILED, failing_since=NOW + HOUR, last_attempt=NOW + 2 * HOUR),
        added_ca_annotation=True,
    )
    assert record.annotations() == {
        SINCE: "2026-08-20T10:00:00Z",
        UNTIL: "2026-08-23T10:00:00Z",
        BY: "auto",
        ADDED_CA: "true",
        DRAIN: "failed",
        FAILING_SINCE: "2026-08-20T11:00:00Z",
        LAST_ATTEMPT: "2026-08-20T12:00:00Z",
    }
    # the drain keys only with a drain record, the CA note only when this preservation added it
    assert PreservationRecord(since=NOW, until=NOW, by=v.PreservedBy.USER).annotations() == {
        SINCE: "2026-08-20T10:00:00Z",
        UNTIL: "2026-08-20T10:00:00Z",
        BY: "user",
    }


# --- defensive reading -----------------------------------------------------------------------------------

GOOD = {SINCE: "2026-08-20T10:00:00Z", UNTIL: "2026-08-23T10:00:00Z", BY: "user"}


@pytest.mark.parametrize(
    "annotations",
    [{}, OTHER, {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now", v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true"}],
)
def test_without_a_record_key_there_is_no_record(annotations: dict[str, str]) -> None:
    assert read_record(annotations) is None


@pytest.mark.parametrize(
    "annotations",
    [
        {**GOOD, UNTIL: "tomorrow"},
        {**GOOD, SINCE: ""},
        {**GOOD, UNTIL: "2026-08-23T10:00:00"},  # a time without a zone is rejected
        {UNTIL: "2026-08-23T10:00:00Z"},  # since missing
        {SINCE: "2026-08-20T10:00:00Z"},  # until missing
        {BY: "user"},  # only a stray key
        {DRAIN: "drained"},
        {ADDED_CA: "true"},
    ],
)
def test_a_damaged_record_reads_as_expired(annotations: dict[str, str]) -> None:
    record = read_record(annotations)
    assert record is not None
    assert record.damaged
    assert record.drain is None
    # expired at any time, whatever the maximum: it never keeps a machine forever
    assert record.expired(now=EPOCH, max_timeout=MAX)
    assert record.expired(now=EPOCH, max_timeout=dt.timedelta(days=100_000))
    assert record.expiry(max_timeout=MAX) <= EPOCH


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("auto", v.PreservedBy.AUTO),
        ("user", v.PreservedBy.USER),
        ("robot", v.PreservedBy.USER),
        (None, v.PreservedBy.USER),
    ],
)
def test_an_unknown_or_missing_by_reads_as_a_user(by: str | None, expected: v.PreservedBy) -> None:
    annotations = {key: value for key, value in GOOD.items() if key != BY}
    if by is not None:
        annotations[BY] = by
    record = read_record(annotations)
    assert record is not None
    assert (record.by, record.damaged) == (expected, False)


@pytest.mark.parametrize(
    ("drain_annotations", "expected"),
    [
        ({DRAIN: "drained"}, DrainRecord(v.DrainOutcome.DRAINED)),
        ({DRAIN: "drained", FAILING_SINCE: "2026-08-20T10:00:00Z"}, DrainRecord(v.DrainOutcome.DRAINED)),
        (
            {DRAIN: "failed", FAILING_SINCE: "2026-08-20T10:00:00Z", LAST_ATTEMPT: "2026-08-20T11:00:00Z"},
            DrainRecord(v.DrainOutcome.FAILED, failing_since=NOW, last_attempt=NOW + HOUR),
        ),
        # damaged drain records: the drain is simply done again (the preservation itself stands)
        ({DRAIN: "failed", LAST_ATTEMPT: "2026-08-20T11:00:00Z"}, None),
        ({DRAIN: "failed", FAILING_SINCE: "2026-08-20T10:00:00Z"}, None),
        ({DRAIN: "failed", FAILING_SINCE: "2026-08-20T10:00:00", LAST_ATTEMPT: "2026-08-20T11:00:00Z"}, None),
        ({DRAIN: "maybe"}, None),
        ({DRAIN: ""}, None),
        ({FAILING_SINCE: "2026-08-20T10:00:00Z", LAST_ATTEMPT: "2026-08-20T11:00:00Z"}, None),
    ],
)
def test_the_drain_record(drain_annotations: dict[str, str], expected: DrainRecord | None) -> None:
    record = read_record({**GOOD, **drain_annotations})
    assert record is not None
    assert (record.drain, record.damaged) == (expected, False)


@pytest.mark.parametrize(("value", "added"), [("true", True), ("false", False), ("yes", False), ("", False)])
def test_only_true_says_this_preservation_added_the_ca_annotation(value: str, added: bool) -> None:
    record = read_record({**GOOD, ADDED_CA: value})
    assert record is not None
    assert record.added_ca_annotation is added


# --- the cap ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("until", "max_timeout", "expiry"),
    [
        (NOW + 5 * HOUR, MAX, NOW + 5 * HOUR),  # within the maximum: as written
        (NOW + MAX, MAX, NOW + MAX),
        (NOW + 10_000 * HOUR, MAX, NOW + MAX),  # written far in the future: since + max
        (NOW + 5 * HOUR, 2 * HOUR, NOW + 2 * HOUR),
        (NOW + 5 * HOUR, dt.timedelta(0), NOW),
        (NOW - HOUR, MAX, NOW - HOUR),  # until before since: as written (already over)
    ],
)
def test_the_expiry_is_until_capped_at_since_plus_the_maximum(
    until: dt.datetime, max_timeout: dt.timedelta, expiry: dt.datetime
) -> None:
    record = PreservationRecord(since=NOW, until=until, by=v.PreservedBy.USER)
    assert record.expiry(max_timeout=max_timeout) == expiry
    assert record.expired(now=expiry, max_timeout=max_timeout), "expired includes exactly the expiry"
    assert not record.expired(now=expiry - dt.timedelta(microseconds=1), max_timeout=max_timeout)


@given(records(), st.integers(0, 100_000).map(lambda hours: hours * HOUR), MOMENTS)
def test_the_cap_never_lets_a_preservation_outlive_since_plus_the_maximum(
    record: PreservationRecord, max_timeout: dt.timedelta, now: dt.datetime
) -> None:
    expiry = record.expiry(max_timeout=max_timeout)
    assert expiry == min(record.until, record.since + max_timeout)
    assert record.expired(now=now, max_timeout=max_timeout) == (expiry <= now)
    if now >= record.since + max_timeout:
        assert record.expired(now=now, max_timeout=max_timeout)


@pytest.mark.parametrize(
    ("now", "timeout", "max_timeout", "since", "until"),
    [
        (NOW, 72 * HOUR, MAX, NOW, NOW + 72 * HOUR),
        (NOW + dt.timedelta(microseconds=999_999), HOUR, MAX, NOW, NOW + HOUR),  # whole seconds, as stored
        (NOW, 1000 * HOUR, MAX, NOW, NOW + MAX),  # capped when it starts
        (NOW, dt.timedelta(0), MAX, NOW, NOW),
        (dt.datetime(2026, 8, 20, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))), HOUR, MAX, NOW, NOW + HOUR),
    ],
)
def test_start_record(
    now: dt.datetime, timeout: dt.timedelta, max_timeout: dt.timedelta, since: dt.datetime, until: dt.datetime
) -> None:
    record = start_record(now=now, timeout=timeout, max_timeout=max_timeout, by=v.PreservedBy.AUTO)
    assert record == PreservationRecord(since=since, until=until, by=v.PreservedBy.AUTO)
    assert record.since.tzinfo == dt.UTC
    assert read_record(record.annotations()) == record


# --- record_patch ----------------------------------------------------------------------------------------

FAILED_DRAIN = DrainRecord(v.DrainOutcome.FAILED, failing_since=NOW, last_attempt=NOW + HOUR)
RECORD = PreservationRecord(since=NOW, until=NOW + 72 * HOUR, by=v.PreservedBy.USER)


@pytest.mark.parametrize(
    ("current", "record", "to_set", "to_remove"),
    [
        (OTHER, RECORD, RECORD.annotations(), ()),  # a start writes every key
        ({**OTHER, **RECORD.annotations()}, RECORD, {}, ()),  # as it is: nothing
        # the drain record is added, then replaced
        (
            RECORD.annotations(),
            dataclasses.replace(RECORD, drain=FAILED_DRAIN),
            FAILED_DRAIN.annotations(),
            (),
        ),
        (
            {**RECORD.annotations(), **FAILED_DRAIN.annotations()},
            dataclasses.replace(RECORD, drain=DrainRecord(v.DrainOutcome.DRAINED)),
            {DRAIN: "drained"},
            (FAILING_SINCE, LAST_ATTEMPT),
        ),
        # the drain record goes with the failure
        ({**RECORD.annotations(), **FAILED_DRAIN.annotations()}, RECORD, {}, (DRAIN, FAILING_SINCE, LAST_ATTEMPT)),
        # only the keys that differ are written
        ({**RECORD.annotations(), UNTIL: "2027-01-01T00:00:00Z"}, RECORD, {UNTIL: "2026-08-23T10:00:00Z"}, ()),
        # no record: every record key present goes, nothing else
        ({**OTHER, **RECORD.annotations(), ADDED_CA: "true"}, None, {}, (SINCE, UNTIL, BY, ADDED_CA)),
        ({**OTHER, DRAIN: "junk"}, None, {}, (DRAIN,)),
        (OTHER, None, {}, ()),
    ],
)
def test_record_patch(
    current: dict[str, str],
    record: PreservationRecord | None,
    to_set: dict[str, str],
    to_remove: tuple[str, ...],
) -> None:
    assert record_patch(current=current, record=record) == (to_set, to_remove)


ANNOTATION_MAPS = st.dictionaries(
    st.sampled_from([*v.PRESERVATION_RECORD_ANNOTATIONS, *OTHER]),
    st.sampled_from(["", "true", "user", "auto", "drained", "failed", "2026-08-20T10:00:00Z", "junk"]),
)


@given(ANNOTATION_MAPS, st.one_of(st.none(), records()))
def test_a_record_patch_makes_the_annotations_hold_exactly_the_record(
    current: dict[str, str], record: PreservationRecord | None
) -> None:
    to_set, to_remove = record_patch(current=current, record=record)
    assert not set(to_set) & set(to_remove)
    assert set(to_set) | set(to_remove) <= set(v.PRESERVATION_RECORD_ANNOTATIONS)
    after = patched_annotations(current, PatchMachineAnnotations(set=to_set, remove=to_remove))
    assert read_record(after) == record
    assert {k: x for k, x in after.items() if k in OTHER} == {k: x for k, x in current.items() if k in OTHER}
    assert record_patch(current=after, record=record) == ({}, ())
