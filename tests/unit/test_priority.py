"""Scale-down priority of preserved machines: raised above the unpreserved, remembered, restored."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine
from machine_preservation.core.plan import PatchMachineAnnotations
from machine_preservation.core.preservation_record import parse_timestamp
from machine_preservation.core.priority import (
    own_priority,
    parse_priority,
    priority_patch,
    unpreserved_priorities,
    unpreserved_priority_ceiling,
)

from .lifecycle_helpers import of_type, plan
from .plan_simulator import patched_annotations
from .preservation_objects import ABSENT, HOUR, NOW, machine, node

PRIORITY, LAST = v.MACHINE_PRIORITY_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION
KEPT = NOW + 5 * HOUR


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 3), ("1", 1), ("3", 3), ("10", 10), ("-2", -2), ("abc", 3), ("", 3), ("2.5", 3)]
)
def test_parse_priority_defaults_like_mcm(raw: str | None, expected: int) -> None:
    assert parse_priority(raw) == expected


@pytest.mark.parametrize(
    ("priority", "last", "expected"),
    [(ABSENT, ABSENT, 3), ("7", ABSENT, 7), ("9", "4", 4), ("9", "", 3), ("9", "x", 3), ("1", "5", 5)],
)
def test_own_priority_is_the_remembered_one_while_raised(priority: object, last: object, expected: int) -> None:
    assert own_priority(machine(priority=priority, last_priority=last)) == expected


def test_ceiling_is_the_highest_own_priority_of_the_other_unpreserved_machines() -> None:
    planned = machine(name="me", priority="50")
    siblings = [
        planned,  # itself: left out
        machine(name="a", priority="4"),
        machine(name="b", priority="9", expiry=KEPT),  # preserved: left out
        machine(name="c", priority="8", deleting=True),  # going away: left out
        machine(name="d", priority="12", last_priority="6"),  # raised, not preserved any more: counts as 6
        machine(name="e", priority="7", expiry=NOW),  # expired: unpreserved
    ]
    assert unpreserved_priority_ceiling(machine=planned, machine_set_machines=siblings, now=NOW) == 7


def test_ceiling_is_at_least_the_default() -> None:
    only_low = [machine(name="a", priority="1"), machine(name="b", priority="2")]
    assert unpreserved_priority_ceiling(machine=machine(name="me"), machine_set_machines=only_low, now=NOW) == 3
    assert unpreserved_priority_ceiling(machine=machine(name="me"), machine_set_machines=[], now=NOW) == 3


@pytest.mark.parametrize(
    ("priority", "last", "preserved", "auto", "expected"),
    [
        # raising remembers what was there ("" = nothing)
        (ABSENT, ABSENT, True, False, PatchMachineAnnotations(set={PRIORITY: "12", LAST: ""})),
        ("7", ABSENT, True, True, PatchMachineAnnotations(set={PRIORITY: "11", LAST: "7"})),
        ("100", ABSENT, True, False, PatchMachineAnnotations(set={PRIORITY: "12", LAST: "100"})),
        ("abc", ABSENT, True, False, PatchMachineAnnotations(set={PRIORITY: "12", LAST: "abc"})),
        # never raise a value below the default (CA's deletion mark)
        ("1", ABSENT, True, False, PatchMachineAnnotations()),
        ("2", ABSENT, True, True, PatchMachineAnnotations()),
        # while raised: follow the ceiling and the kind, never overwrite a deletion mark set meanwhile
        ("12", "", True, False, PatchMachineAnnotations()),
        ("11", "", True, False, PatchMachineAnnotations(set={PRIORITY: "12"})),
        ("1", "5", True, False, PatchMachineAnnotations()),
        (ABSENT, "5", True, True, PatchMachineAnnotations(set={PRIORITY: "11"})),
        # restore: the remembered value, absent stays absent, a deletion mark set meanwhile stays
        ("12", "7", False, False, PatchMachineAnnotations(set={PRIORITY: "7"}, remove=(LAST,))),
        ("12", "", False, False, PatchMachineAnnotations(remove=(PRIORITY, LAST))),
        ("12", "abc", False, False, PatchMachineAnnotations(set={PRIORITY: "abc"}, remove=(LAST,))),
        ("1", "7", False, False, PatchMachineAnnotations(remove=(LAST,))),
        # never raised: nothing to restore
        ("9", ABSENT, False, False, PatchMachineAnnotations()),
    ],
)
def test_priority_patch(
    priority: object, last: object, preserved: bool, auto: bool, expected: PatchMachineAnnotations
) -> None:
    m = machine(priority=priority, last_priority=last)
    assert priority_patch(machine=m, preserved=preserved, auto=auto, ceiling=10) == expected


def test_machine_plan_raises_auto_below_manual() -> None:
    manual = plan(machine(phase="Failed", preserve="now"), ceiling=6)
    auto = plan(machine(phase="Failed", preserve="auto-preserve"), ceiling=6)
    assert of_type(manual, PatchMachineAnnotations)[0].set[PRIORITY] == "8"
    assert of_type(auto, PatchMachineAnnotations)[0].set[PRIORITY] == "7"


def test_machine_plan_restores_on_stop_before_clearing_the_expiry() -> None:
    result = plan(machine(preserve="false", expiry=KEPT, priority="8", last_priority="4"), node())
    assert result.steps[0] == PatchMachineAnnotations(set={PRIORITY: "4"}, remove=(LAST,))


# --- a whole MachineSet ---------------------------------------------------------------------------------

STATES = ["unpreserved", "auto", "manual"]


@st.composite
def machine_sets(draw: st.DrawFn) -> list[tuple[Machine, str]]:
    count = draw(st.integers(1, 8))
    members = []
    for index in range(count):
        state = draw(st.sampled_from(STATES))
        members.append(
            (
                machine(
                    name=f"m{index}",
                    priority=draw(st.sampled_from([ABSENT, "1", "2", "3", "4", "9", "abc"])),
                    expiry=None if state == "unpreserved" else KEPT,
                ),
                state,
            )
        )
    return members


def settle(members: list[tuple[Machine, str]], *, preserved: bool = True) -> list[tuple[Machine, str]]:
    """Every machine's priority patch against the snapshot, applied (as the shell's reconciles would)."""
    snapshot = [m for m, _ in members]
    settled = []
    for m, state in members:
        ceiling = unpreserved_priority_ceiling(machine=m, machine_set_machines=snapshot, now=NOW)
        patch = priority_patch(
            machine=m, preserved=preserved and state != "unpreserved", auto=state == "auto", ceiling=ceiling
        )
        metadata = m.metadata.model_copy(update={"annotations": patched_annotations(m.metadata.annotations, patch)})
        settled.append((m.model_copy(update={"metadata": metadata}), state))
    return settled


@settings(max_examples=300, deadline=None)
@given(machine_sets())
def test_preserved_machines_outrank_unpreserved_ones_and_manual_outranks_auto(
    members: list[tuple[Machine, str]],
) -> None:
    settled = settle(members)
    priority = {m.metadata.name: parse_priority(m.metadata.annotations.get(PRIORITY)) for m, _ in settled}
    original = {m.metadata.name: m.metadata.annotations.get(PRIORITY) for m, _ in members}
    raised = {name for name, raw in original.items() if parse_priority(raw) >= v.DEFAULT_MACHINE_PRIORITY}
    by_state = {state: [m.metadata.name for m, s in settled if s == state] for state in STATES}
    for name, raw in original.items():
        if name not in raised or name in by_state["unpreserved"]:
            assert settled[int(name[1:])][0].metadata.annotations.get(PRIORITY) == raw  # untouched
    for high in set(by_state["auto"] + by_state["manual"]) & raised:
        assert all(priority[high] > priority[low] for low in by_state["unpreserved"])
    for manual in set(by_state["manual"]) & raised:
        assert all(priority[manual] > priority[auto] for auto in set(by_state["auto"]) & raised)
    # converged: settling again changes nothing
    assert settle(settled) == settled


@settings(max_examples=300, deadline=None)
@given(machine_sets())
def test_stopping_restores_every_original_priority(members: list[tuple[Machine, str]]) -> None:
    restored = settle(settle(members), preserved=False)
    assert [m.metadata.annotations for m, _ in restored] == [m.metadata.annotations for m, _ in members]


def test_deletion_mark_set_while_preserved_survives_the_restore() -> None:
    raised = machine(priority="5", last_priority="", expiry=KEPT)
    marked = raised.model_copy(
        update={"metadata": raised.metadata.model_copy(update={"annotations": {PRIORITY: "1", LAST: ""}})}
    )
    assert priority_patch(machine=marked, preserved=True, auto=False, ceiling=3) == PatchMachineAnnotations()
    restore = priority_patch(machine=marked, preserved=False, auto=False, ceiling=3)
    assert patched_annotations(marked.metadata.annotations, restore) == {PRIORITY: "1"}


def test_a_sibling_expiring_exactly_now_counts_as_unpreserved() -> None:
    # expiry == now counts as expired (unpreserved), as in MCM's sort
    sibling = machine(name="a", priority="9", expiry=NOW)
    assert unpreserved_priority_ceiling(machine=machine(), machine_set_machines=[sibling], now=NOW) == 9
    later = NOW - dt.timedelta(seconds=1)
    assert unpreserved_priority_ceiling(machine=machine(), machine_set_machines=[sibling], now=later) == 3


def preserved_at(m: Machine, now: dt.datetime, max_timeout: dt.timedelta) -> bool:
    """Spelled out from the annotations: a readable record whose until, capped at since + max, is after now."""
    since = parse_timestamp(m.metadata.annotations.get(v.PRESERVED_SINCE_ANNOTATION))
    until = parse_timestamp(m.metadata.annotations.get(v.PRESERVED_UNTIL_ANNOTATION))
    return since is not None and until is not None and min(until, since + max_timeout) > now


@pytest.mark.parametrize(
    ("since_ago", "max_timeout", "ceiling"),
    [
        (HOUR, 720 * HOUR, 3),  # since + max ahead: preserved, its priority does not count
        (720 * HOUR, 720 * HOUR, 9),  # since + max is now: unpreserved, whatever `until` says
        (3 * HOUR, 2 * HOUR, 9),  # a lower maximum ends it sooner
    ],
)
def test_a_siblings_expiry_counts_capped_at_since_plus_the_maximum(
    since_ago: dt.timedelta, max_timeout: dt.timedelta, ceiling: int
) -> None:
    sibling = machine(name="a", priority="9", expiry=NOW + 10_000 * HOUR, since=NOW - since_ago)
    found = unpreserved_priority_ceiling(
        machine=machine(), machine_set_machines=[sibling], now=NOW, max_timeout=max_timeout
    )
    assert found == ceiling


def test_a_mirrored_expiry_without_a_record_is_not_a_preservation() -> None:
    sibling = machine(name="a", priority="9", mirrored=NOW + HOUR)
    assert unpreserved_priority_ceiling(machine=machine(), machine_set_machines=[sibling], now=NOW) == 9


def brute_force_ceiling(me: Machine, machines: list[Machine], now: dt.datetime, max_timeout: dt.timedelta) -> int:
    """The definition, spelled out: the highest own priority of the other unpreserved, not deleted machines."""
    others = [
        own_priority(m)
        for m in machines
        if m.metadata.name != me.metadata.name
        and m.metadata.deletion_timestamp is None
        and not preserved_at(m, now, max_timeout)
    ]
    return max([v.DEFAULT_MACHINE_PRIORITY, *others])


@st.composite
def machines_with_expiries(draw: st.DrawFn) -> list[Machine]:
    return [
        machine(
            name=f"m{index}",
            priority=draw(st.sampled_from([ABSENT, "1", "2", "3", "4", "7", "9", "abc"])),
            last_priority=draw(st.sampled_from([ABSENT, "", "5", "8"])),
            expiry=draw(st.one_of(st.none(), st.integers(-3, 6).map(lambda h: NOW + h * HOUR))),
            # a start long ago lets the cap end the preservation before its `until`
            since=draw(st.one_of(st.none(), st.integers(0, 8).map(lambda h: NOW - 720 * HOUR + h * HOUR))),
            # a mirrored expiry alone is not a preservation
            mirrored=draw(st.sampled_from([None, NOW + 5 * HOUR])),
            deleting=draw(st.booleans()),
        )
        for index in range(draw(st.integers(0, 9)))
    ]


@settings(max_examples=500, deadline=None)
@given(machines_with_expiries(), st.integers(0, 8 * 3600), st.sampled_from([720 * HOUR, 2 * HOUR]))
def test_one_summary_per_machine_set_answers_every_machines_ceiling_until_it_expires(
    machines: list[Machine], later_seconds: int, max_timeout: dt.timedelta
) -> None:
    """The controller computes the summary once per MachineSet and reuses it while `holds_at` says so: every
    answer must equal the definition, at the moment of computing and at any later moment it still holds."""
    summary = unpreserved_priorities(machine_set_machines=machines, now=NOW, max_timeout=max_timeout)
    later = NOW + dt.timedelta(seconds=later_seconds)
    probes = [*machines, machine(name="outsider")]
    for me in probes:
        assert summary.ceiling_for(me.metadata.name) == brute_force_ceiling(me, machines, NOW, max_timeout)
    assert summary.holds_at(NOW)
    assert not summary.holds_at(NOW - dt.timedelta(seconds=1)), "a clock that went back recomputes"
    if summary.holds_at(later):
        for me in probes:
            assert summary.ceiling_for(me.metadata.name) == brute_force_ceiling(me, machines, later, max_timeout)
    else:
        assert summary.valid_until is not None
        assert later >= summary.valid_until
