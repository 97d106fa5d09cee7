"""The record of reported invalid values stays small whatever the values, and reports each value once."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.invalid_values import (
    DIGEST_PREFIX,
    MAX_ENTRIES,
    RECORD_LIMIT,
    SHOWN_CHARACTERS,
    record_key,
    record_of,
    report_invalid_values,
    shown_value,
)
from machine_preservation.core.models import Machine
from machine_preservation.core.plan import PatchMachineAnnotations
from machine_preservation.core.preserve_value import InvalidValue

from .preservation_objects import machine

RECORD = v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION
# Kubernetes' limit on all annotations of one object together (keys and values, in bytes).
ANNOTATIONS_LIMIT = 256 * 1024
# What a Kubernetes Event's message may hold and still be readable (events.k8s.io caps its note at 1 KiB).
EVENT_MESSAGE_LIMIT = 1024
LONGEST_NAME = "n" * 253  # the longest object name Kubernetes allows


def applied(m: Machine, patch: PatchMachineAnnotations) -> Machine:
    annotations = {k: val for k, val in m.metadata.annotations.items() if k not in patch.remove} | dict(patch.set)
    return m.model_copy(update={"metadata": m.metadata.model_copy(update={"annotations": annotations})})


def annotations_size(m: Machine) -> int:
    return sum(len(k.encode()) + len(val.encode("utf-8", "surrogatepass")) for k, val in m.metadata.annotations.items())


def test_a_huge_invalid_value_leaves_room_for_the_patch() -> None:
    # A 140,000-character value written while the webhook was down: the record used to copy it, and the
    # Machine's annotations (value + copy) then exceeded Kubernetes' limit, so every patch failed.
    huge = "x" * 140_000
    m = machine(preserve=huge)
    patch, events = report_invalid_values(machine=m, invalid=[InvalidValue("Machine", "m1", huge)])
    after = applied(m, patch)
    assert annotations_size(after) < len(huge) + 1024
    assert annotations_size(after) <= ANNOTATIONS_LIMIT
    assert len(patch.set[RECORD]) <= RECORD_LIMIT
    assert len(events) == 1
    assert report_invalid_values(machine=after, invalid=[InvalidValue("Machine", "m1", huge)]) == (
        PatchMachineAnnotations(),
        (),
    )


def test_a_huge_value_in_an_older_record_is_shrunk_and_not_reported_again() -> None:
    huge = "y" * 140_000
    old_record = json.dumps([["Machine", huge]], separators=(",", ":"))
    m = machine(preserve=huge, reported_invalid=old_record)
    patch, events = report_invalid_values(machine=m, invalid=[InvalidValue("Machine", "m1", huge)])
    assert events == ()
    assert len(patch.set[RECORD]) <= RECORD_LIMIT


def test_short_values_are_recorded_readably_long_ones_as_digests() -> None:
    assert record_key("Now") == "Now"
    assert record_key("x" * 64) == "x" * 64
    long_key = record_key("x" * 65)
    assert long_key.startswith(DIGEST_PREFIX)
    assert len(long_key) == len(DIGEST_PREFIX) + 32
    # A value shaped like a digest is hashed too, so it never stands for another value.
    assert record_key(long_key) != long_key
    assert record_of([InvalidValue("Node", "n1", "yes")]) == '[["Node","yes"]]'


def test_the_event_shows_a_bounded_escaped_value() -> None:
    _, events = report_invalid_values(machine=machine(), invalid=[InvalidValue("Machine", "m1", "z" * 140_000)])
    message = events[0].message
    assert f'="{"z" * SHOWN_CHARACTERS}... (140000 characters)"' in message
    assert len(message) < 400
    assert shown_value('say "hi"\n') == 'say \\"hi\\"\\n'


def test_findings_beyond_the_room_are_neither_recorded_nor_reported() -> None:
    findings = [InvalidValue("Machine", "m1", f"v{i}") for i in range(MAX_ENTRIES + 2)]
    patch, events = report_invalid_values(machine=machine(), invalid=findings)
    assert len(json.loads(patch.set[RECORD])) == MAX_ENTRIES
    assert len(events) == MAX_ENTRIES
    patch, events = report_invalid_values(machine=applied(machine(), patch), invalid=findings)
    assert (patch, events) == (PatchMachineAnnotations(), ())


values = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=80),
    st.builds(lambda piece, times: piece * times, st.text(min_size=1, max_size=3), st.integers(1, 100_000)),
    st.just(DIGEST_PREFIX + "0" * 32),
)
findings_lists = st.lists(
    st.builds(InvalidValue, st.sampled_from(["Machine", "Node"]), st.sampled_from(["m1", LONGEST_NAME]), values),
    max_size=6,
)


@given(findings=findings_lists)
def test_the_record_is_small_and_each_value_reported_once(findings: list[InvalidValue]) -> None:
    m = machine()
    patch, events = report_invalid_values(machine=m, invalid=findings)
    if findings:
        record = patch.set[RECORD]
        assert len(record.encode()) <= RECORD_LIMIT
        distinct = {(f.kind, f.value) for f in findings}
        assert len(events) == min(len(distinct), MAX_ENTRIES)
    for event in events:
        assert len(event.message) <= EVENT_MESSAGE_LIMIT
    # Reconciling again with the same findings writes nothing and reports nothing.
    assert report_invalid_values(machine=applied(m, patch), invalid=findings) == (PatchMachineAnnotations(), ())


def entries(record: str | None) -> list[tuple[str, str]]:
    return [] if record is None else [(kind, key) for kind, key in json.loads(record)]


@given(first=findings_lists, second=findings_lists)
def test_only_values_new_to_the_record_are_reported(first: list[InvalidValue], second: list[InvalidValue]) -> None:
    patch, _ = report_invalid_values(machine=machine(), invalid=first)
    m = applied(machine(), patch)
    known = entries(m.metadata.annotations.get(RECORD))
    patch, events = report_invalid_values(machine=m, invalid=second)
    room = entries(record_of(second)) if second else []
    assert [event.kind for event in events] == [kind for kind, key in room if (kind, key) not in known]
    assert entries(applied(m, patch).metadata.annotations.get(RECORD)) == room


@pytest.mark.parametrize("damaged", ["[" * 100_000, '[["Node", 1]]', "null", '"x"'])
def test_a_damaged_or_hostile_record_is_replaced_by_a_small_one(damaged: str) -> None:
    patch, events = report_invalid_values(
        machine=machine(reported_invalid=damaged), invalid=[InvalidValue("Node", "n1", "yes")]
    )
    assert (patch.set, len(events)) == ({RECORD: '[["Node","yes"]]'}, 1)
