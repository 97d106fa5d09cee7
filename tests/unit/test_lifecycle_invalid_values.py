"""Invalid preserve values: treated as absent, reported with one Warning Event per distinct value."""

from __future__ import annotations

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.invalid_values import record_of, report_invalid_values
from machine_preservation.core.plan import PatchMachineAnnotations, RecordEvent
from machine_preservation.core.preserve_value import InvalidValue

from .lifecycle_helpers import execute, of_type, plan, writes
from .preservation_objects import ABSENT, HOUR, NOW, machine, node

RECORD = v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION
ON_NODE = InvalidValue("Node", "n1", "yes")
ON_MACHINE = InvalidValue("Machine", "m1", "Now")


def test_a_new_invalid_value_is_recorded_with_a_warning() -> None:
    patch, events = report_invalid_values(machine=machine(), invalid=[ON_NODE])
    assert patch == PatchMachineAnnotations(set={RECORD: '[["Node","yes"]]'})
    assert [(e.kind, e.name, e.type, e.reason) for e in events] == [
        ("Node", "n1", "Warning", v.EventReason.INVALID_PRESERVE_VALUE)
    ]


def test_an_already_reported_value_costs_nothing() -> None:
    m = machine(reported_invalid=record_of([ON_NODE]))
    assert report_invalid_values(machine=m, invalid=[ON_NODE]) == (PatchMachineAnnotations(), ())


def test_only_the_values_not_reported_yet_raise_a_warning() -> None:
    m = machine(reported_invalid=record_of([ON_NODE]))
    patch, events = report_invalid_values(machine=m, invalid=[ON_MACHINE, ON_NODE])
    assert patch.set == {RECORD: record_of([ON_MACHINE, ON_NODE])}
    assert [e.kind for e in events] == ["Machine"]


def test_a_changed_value_is_reported_again() -> None:
    m = machine(reported_invalid=record_of([ON_NODE]))
    _, events = report_invalid_values(machine=m, invalid=[InvalidValue("Node", "n1", "maybe")])
    assert len(events) == 1
    assert '"maybe"' in events[0].message


@pytest.mark.parametrize("damaged", ["garbage", '{"a": 1}', "[1, 2]", '[["Node"]]'])
def test_a_damaged_record_is_rewritten_and_the_value_reported_again(damaged: str) -> None:
    patch, events = report_invalid_values(machine=machine(reported_invalid=damaged), invalid=[ON_NODE])
    assert (patch.set, len(events)) == ({RECORD: '[["Node","yes"]]'}, 1)


def test_the_record_goes_when_the_values_are_fixed_without_an_event() -> None:
    m = machine(reported_invalid=record_of([ON_NODE]))
    assert report_invalid_values(machine=m, invalid=[]) == (PatchMachineAnnotations(remove=(RECORD,)), ())
    assert report_invalid_values(machine=machine(), invalid=[]) == (PatchMachineAnnotations(), ())


def test_the_machine_plan_reports_once_then_is_quiet() -> None:
    m, n = machine(preserve="Now"), node(preserve="yes")
    first = plan(m, n)
    assert [(e.kind, e.reason) for e in of_type(first, RecordEvent)] == [
        ("Machine", v.EventReason.INVALID_PRESERVE_VALUE),
        ("Node", v.EventReason.INVALID_PRESERVE_VALUE),
    ]
    m, n = execute(m, n, first)
    assert plan(m, n).steps == ()


def test_an_invalid_machine_value_removed_on_expiry_is_not_recorded() -> None:
    # The node's `now` expires: the machine's preserve key (invalid or not) goes, so nothing is left to report.
    m = machine(preserve="Now", last_applied="now", expiry=NOW - HOUR)
    patch = writes(plan(m, node(preserve="now")))[0]
    assert isinstance(patch, PatchMachineAnnotations)
    assert v.PRESERVE_ANNOTATION in patch.remove
    assert RECORD not in patch.set
    assert of_type(plan(m, node(preserve="now")), RecordEvent)[0].reason == v.EventReason.PRESERVATION_EXPIRED


def test_the_warning_names_the_value_and_the_allowed_ones() -> None:
    _, events = report_invalid_values(machine=machine(preserve=ABSENT), invalid=[ON_MACHINE])
    assert events[0].message == (
        'Preserve annotation node.machine.sapcloud.io/preserve="Now" on Machine "m1" is invalid and ignored '
        '(treated as absent); allowed values: "", "now", "when-failed", "false".'
    )
