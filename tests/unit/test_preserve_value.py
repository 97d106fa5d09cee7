"""Effective preserve value: node over machine, the last-applied record, `""`, invalid values."""

from __future__ import annotations

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.preserve_value import (
    InvalidValue,
    ValueOrigin,
    effective_preserve_value,
    is_auto_value,
    parse_preserve_value,
)

from .preservation_objects import ABSENT, machine, node

P = v.PreserveValue


@pytest.mark.parametrize(
    ("node_value", "machine_value", "last_applied", "expected", "source", "in_control"),
    [
        # upstream MCM's rules, node found
        (ABSENT, "now", ABSENT, P.NOW, ValueOrigin.MACHINE, False),
        (ABSENT, ABSENT, ABSENT, P.NONE, ValueOrigin.MACHINE, False),
        (ABSENT, ABSENT, "now", P.NONE, ValueOrigin.NODE, True),  # node annotation removed: stop
        ("when-failed", ABSENT, ABSENT, P.WHEN_FAILED, ValueOrigin.NODE, True),
        ("now", "when-failed", ABSENT, P.NOW, ValueOrigin.NODE, True),
        ("now", "now", "now", P.NOW, ValueOrigin.NODE, True),
        ("now", "now", "when-failed", P.NOW, ValueOrigin.NODE, True),
        (ABSENT, "now", "now", P.NONE, ValueOrigin.NODE, True),  # stale identical machine value: still stop
        # an empty last-applied record means the node is not in control
        (ABSENT, "false", "", P.FALSE, ValueOrigin.MACHINE, False),
        # a node's "" is valid (upstream: invalid), means no preference, and overrides the machine
        ("", "now", ABSENT, P.NONE, ValueOrigin.NODE, True),
        ("", "false", "now", P.NONE, ValueOrigin.NODE, True),
        # the machine's "" is no preference
        (ABSENT, "", ABSENT, P.NONE, ValueOrigin.MACHINE, False),
        # the node's false wins over the machine's now, and vice versa
        ("false", "now", ABSENT, P.FALSE, ValueOrigin.NODE, True),
        ("now", "false", ABSENT, P.NOW, ValueOrigin.NODE, True),
        # both spellings of the auto value read as AUTO (on the machine; on a node see below)
        (ABSENT, "auto-preserve", ABSENT, P.AUTO, ValueOrigin.MACHINE, False),
        (ABSENT, "auto-preserved", ABSENT, P.AUTO, ValueOrigin.MACHINE, False),
        # the machine's auto value survives a node in control that has no preference
        ("", "auto-preserve", ABSENT, P.AUTO, ValueOrigin.MACHINE, True),
        (ABSENT, "auto-preserve", "now", P.AUTO, ValueOrigin.MACHINE, True),
        # ... but not a node value that says something
        ("false", "auto-preserve", ABSENT, P.FALSE, ValueOrigin.NODE, True),
        ("now", "auto-preserve", ABSENT, P.NOW, ValueOrigin.NODE, True),
    ],
)
def test_effective_value(
    node_value: object,
    machine_value: object,
    last_applied: object,
    expected: v.PreserveValue,
    source: ValueOrigin,
    in_control: bool,
) -> None:
    effective = effective_preserve_value(
        machine=machine(preserve=machine_value, last_applied=last_applied), node=node(preserve=node_value)
    )
    assert (effective.value, effective.source, effective.node_in_control) == (expected, source, in_control)
    assert effective.invalid == ()


def test_missing_node_leaves_the_machine_value_in_force_whatever_last_applied_says() -> None:
    effective = effective_preserve_value(machine=machine(preserve="now", last_applied="false"), node=None)
    assert (effective.value, effective.source, effective.node_in_control) == (P.NOW, ValueOrigin.MACHINE, False)


@pytest.mark.parametrize("auto", ["auto-preserve", "auto-preserved"])
def test_the_auto_value_on_a_node_is_invalid_and_ignored(auto: str) -> None:
    # The controller writes it on Machines only: on a Node someone else wrote it.
    effective = effective_preserve_value(machine=machine(last_applied="now"), node=node(preserve=auto))
    assert (effective.value, effective.source, effective.node_in_control, effective.node_raw) == (
        P.NONE,
        ValueOrigin.NODE,
        True,
        None,
    )
    assert effective.invalid == (InvalidValue("Node", "n1", auto),)


def test_node_raw_is_the_valid_node_value_as_written() -> None:
    assert effective_preserve_value(machine=machine(), node=node(preserve="when-failed")).node_raw == "when-failed"
    assert effective_preserve_value(machine=machine(), node=node(preserve="")).node_raw == ""
    assert effective_preserve_value(machine=machine(), node=node()).node_raw is None
    assert effective_preserve_value(machine=machine(), node=node(preserve="yes")).node_raw is None


@pytest.mark.parametrize("bad", ["yes", "Now", " now", "now ", "true", "auto", "FALSE"])
def test_invalid_machine_value_is_treated_as_absent_and_reported(bad: str) -> None:
    effective = effective_preserve_value(machine=machine(preserve=bad), node=node())
    assert effective.value == P.NONE
    assert effective.invalid == (InvalidValue("Machine", "m1", bad),)


def test_invalid_node_value_is_treated_as_absent_so_the_machine_decides() -> None:
    effective = effective_preserve_value(machine=machine(preserve="now"), node=node(preserve="yes"))
    assert (effective.value, effective.source, effective.node_in_control) == (P.NOW, ValueOrigin.MACHINE, False)
    assert effective.invalid == (InvalidValue("Node", "n1", "yes"),)


def test_invalid_node_value_with_a_last_applied_record_means_the_node_value_is_gone() -> None:
    effective = effective_preserve_value(machine=machine(last_applied="now"), node=node(preserve="yes"))
    assert (effective.value, effective.source) == (P.NONE, ValueOrigin.NODE)


def test_both_invalid_are_both_reported_machine_first() -> None:
    effective = effective_preserve_value(machine=machine(preserve="x"), node=node(preserve="y"))
    assert effective.invalid == (InvalidValue("Machine", "m1", "x"), InvalidValue("Node", "n1", "y"))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, P.NONE),
        ("", P.NONE),
        ("now", P.NOW),
        ("when-failed", P.WHEN_FAILED),
        ("false", P.FALSE),
        ("auto-preserve", P.AUTO),
        ("auto-preserved", P.AUTO),
        ("no", None),
        ("NOW", None),
    ],
)
def test_parse_preserve_value(raw: str | None, expected: v.PreserveValue | None) -> None:
    assert parse_preserve_value(raw) == expected


def test_is_auto_value_accepts_both_spellings_only() -> None:
    assert [is_auto_value(raw) for raw in ("auto-preserve", "auto-preserved", "now", "", None)] == [
        True,
        True,
        False,
        False,
        False,
    ]
