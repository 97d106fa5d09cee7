"""With an MCM that preserves natively (core.native): our running preservations are handed over, then MCM's
are only observed."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import go_time_string
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.native import observed_expiry, plan_native
from machine_preservation.core.node_fields import FIELDS
from machine_preservation.core.plan import (
    MachinePlan,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetPreservedTaint,
    SetPreserveExpiry,
)
from machine_preservation.core.preservation_record import DrainRecord

from .lifecycle_helpers import event_reasons, of_type, only, writes
from .plan_simulator import apply_machine_plan
from .preservation_objects import ABSENT, HOUR, NOW, machine, node, node_fields_of, preserved_condition

CONFIG = PreservationConfig()
KEPT = NOW + 5 * HOUR
FAILED = v.MachinePhase.FAILED
HANDED_OVER = [("Machine", v.EventReason.PRESERVATION_HANDED_OVER), ("Node", v.EventReason.PRESERVATION_HANDED_OVER)]
RECORD_KEYS = (v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION)
DRAINED = DrainRecord(outcome=v.DrainOutcome.DRAINED)


def native(m: Machine, n: Node | None = None, config: PreservationConfig = CONFIG) -> MachinePlan:
    return plan_native(machine=m, node=n, config=config)


def preserved_node() -> Node:
    """The node as our lifecycle left it: MCM's keys and messages, which MCM carries on from."""
    return node(
        ca="true",
        ca_marker="true",
        tainted=True,
        condition=preserved_condition(message="Preserved node drained successfully. Machine preserved until x."),
    )


def only_expiry(result: MachinePlan) -> dt.datetime | None:
    (step,) = of_type(result, SetPreserveExpiry)
    return step.expiry


# --- hand-over -------------------------------------------------------------------------------------------


def test_hand_over_writes_the_mirror_first_and_removes_the_record_last() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, drain=DRAINED, added_ca=True)
    result = native(m, preserved_node())
    assert writes(result) == [
        SetPreserveExpiry(expiry=KEPT),
        # Our marker becomes MCM's, so that MCM's stop removes the CA annotation as its own.
        PatchNodeAnnotations(
            set={v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true"},
            remove=(v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,),
        ),
        SetPreservedTaint(present=False),  # MCM v0.62 cordons instead and would never remove it
        PatchMachineAnnotations(remove=(*RECORD_KEYS, v.PRESERVED_ADDED_CA_ANNOTATION, v.PRESERVED_DRAIN_ANNOTATION)),
    ]
    # nothing else on the node: condition and CA annotation use MCM's keys and messages
    assert event_reasons(result) == HANDED_OVER
    events = of_type(result, RecordEvent)
    assert {e.message for e in events} == {
        f"Preservation until {go_time_string(KEPT)} handed over to machine-controller-manager, "
        "which preserves machines itself."
    }
    assert {e.type for e in events} == {"Normal"}


@pytest.mark.parametrize(
    "node_annotations",
    [
        {"ca": "true", "mcm_marker": "true"},  # our marker of an earlier version: MCM's already
        {"ca": "true"},  # the user's own annotation: not ours to give away
    ],
)
def test_hand_over_leaves_a_ca_annotation_without_our_marker_alone(node_annotations: dict[str, str]) -> None:
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, added_ca=True, mirrored=KEPT)
    n = node(**node_annotations, condition=preserved_condition(message="Machine preserved until x."))  # type: ignore[arg-type]
    assert of_type(native(m, n), PatchNodeAnnotations) == []


@pytest.mark.parametrize(
    ("value", "respelled"),
    [
        ("auto-preserve", {v.PRESERVE_ANNOTATION: "auto-preserved"}),  # MCM ignores our spelling and would stop
        ("auto-preserved", {}),
        ("now", {}),
        ("when-failed", {}),
        (ABSENT, {}),  # e.g. the node's value is in force
    ],
)
def test_hand_over_respells_our_auto_value_as_mcms(value: object, respelled: dict[str, str]) -> None:
    m = machine(phase=FAILED, preserve=value, expiry=KEPT, by=v.PreservedBy.AUTO, mirrored=KEPT)
    result = native(m, preserved_node())
    assert writes(result)[-1] == PatchMachineAnnotations(set=respelled, remove=RECORD_KEYS)


def test_hand_over_mirrors_the_capped_expiry() -> None:
    # until written far ahead: MCM gets since + max, as our lifecycle would have ended it
    m = machine(phase=FAILED, preserve="now", expiry=NOW + 10_000 * HOUR, since=NOW - HOUR)
    result = native(m, preserved_node())
    assert of_type(result, SetPreserveExpiry) == [SetPreserveExpiry(expiry=NOW - HOUR + 720 * HOUR)]
    short = native(m, preserved_node(), config=dataclasses.replace(CONFIG, max_preserve_timeout=2 * HOUR))
    assert of_type(short, SetPreserveExpiry) == [SetPreserveExpiry(expiry=NOW + HOUR)]


def test_hand_over_of_a_damaged_record_hands_over_an_expired_preservation() -> None:
    m = machine(phase=FAILED, preserve="now")
    m = m.model_copy(
        update={"metadata": m.metadata.model_copy(update={"annotations": {v.PRESERVED_UNTIL_ANNOTATION: "soon"}})}
    )
    result = native(m)
    expiry = only_expiry(result)
    assert expiry is not None
    assert expiry < NOW, "a damaged record never keeps a machine: MCM ends it"
    assert writes(result)[-1] == PatchMachineAnnotations(remove=(v.PRESERVED_UNTIL_ANNOTATION,))


def test_hand_over_without_a_node_reports_on_the_machine_only() -> None:
    result = native(machine(node="", phase=FAILED, preserve="now", expiry=KEPT))
    assert event_reasons(result) == [("Machine", v.EventReason.PRESERVATION_HANDED_OVER)]


@pytest.mark.parametrize("done", [0, 1])
def test_a_hand_over_interrupted_after_any_write_is_repeated_then_only_observed(done: int) -> None:
    m = machine(phase=FAILED, preserve="auto-preserve", expiry=KEPT, by=v.PreservedBy.AUTO)
    n: Node | None = preserved_node()
    first = native(m, n)
    partial = MachinePlan(steps=tuple(writes(first)[:done]))
    m, n = apply_machine_plan(machine=m, node=n, plan=partial, now=NOW)
    again = native(m, n)
    assert of_type(again, PatchMachineAnnotations) == of_type(first, PatchMachineAnnotations)
    assert event_reasons(again) == HANDED_OVER
    m, n = apply_machine_plan(machine=m, node=n, plan=again, now=NOW)
    assert m.preservation is None
    assert (m.mirrored_expiry, m.metadata.annotations[v.PRESERVE_ANNOTATION]) == (KEPT, "auto-preserved")
    after = native(m, n)
    assert writes(after) == [], "handed over: from now on only observed"
    assert event_reasons(after) == [
        ("Machine", v.EventReason.PRESERVATION_STARTED),
        ("Node", v.EventReason.PRESERVATION_STARTED),
    ]


# --- observation -----------------------------------------------------------------------------------------


def test_a_preservation_by_mcm_is_observed_from_its_expiry_once() -> None:
    result = native(machine(phase=FAILED, preserve="auto-preserved", mirrored=KEPT), preserved_node())
    assert writes(result) == []
    events = of_type(result, RecordEvent)
    assert [(e.kind, e.reason, e.type, e.once) for e in events] == [
        ("Machine", v.EventReason.PRESERVATION_STARTED, "Normal", True),
        ("Node", v.EventReason.PRESERVATION_STARTED, "Normal", True),
    ]
    assert {e.message for e in events} == {
        f"machine-controller-manager preserves the machine until {go_time_string(KEPT)}."
    }
    # another preservation (another expiry) is another Event
    later = native(machine(phase=FAILED, mirrored=KEPT + HOUR), preserved_node())
    assert {e.message for e in of_type(later, RecordEvent)}.isdisjoint({e.message for e in events})


def test_the_end_of_a_preservation_by_mcm_is_observed_from_the_node_condition_once() -> None:
    stopped_at = NOW - HOUR
    stopped = preserved_condition(status="False", reason="Preservation stopped.", transition=stopped_at)
    result = native(machine(), node(condition=stopped))
    assert writes(result) == []
    events = of_type(result, RecordEvent)
    assert [(e.kind, e.reason, e.once) for e in events] == [
        ("Machine", v.EventReason.PRESERVATION_STOPPED, True),
        ("Node", v.EventReason.PRESERVATION_STOPPED, True),
    ]
    assert {e.message for e in events} == {
        f"machine-controller-manager stopped the preservation at {go_time_string(stopped_at)}."
    }


@pytest.mark.parametrize(
    "n",
    [
        None,
        node(),
        node(condition=preserved_condition(message="Machine preserved until x.")),  # preserved, but no expiry seen
        node(condition=preserved_condition(status="False", message="Preserved node could not be drained.")),
    ],
)
def test_nothing_is_observed_without_an_expiry_or_a_stopped_condition(n: Node | None) -> None:
    assert native(machine(), n) == MachinePlan()


@pytest.mark.parametrize(
    "m",
    [
        machine(phase=FAILED, preserve="now", expiry=KEPT, deleting=True),
        machine(phase=FAILED, mirrored=KEPT, deleting=True),
        machine(phase=v.MachinePhase.TERMINATING, preserve="auto-preserve", expiry=KEPT),
        machine(phase=v.MachinePhase.TERMINATING, mirrored=KEPT),
    ],
)
def test_nothing_for_machines_being_deleted(m: Machine) -> None:
    stopped = preserved_condition(status="False", reason="Preservation stopped.")
    assert native(m, node(condition=stopped)) == MachinePlan()


@pytest.mark.parametrize(
    ("mirrored", "expected"),
    [(None, None), (NOW - HOUR, None), (NOW, None), (KEPT, KEPT)],
)
def test_observed_expiry_only_while_in_the_future(mirrored: dt.datetime | None, expected: dt.datetime | None) -> None:
    assert observed_expiry(machine(mirrored=mirrored), NOW) == expected


# --- properties ------------------------------------------------------------------------------------------

EXPIRIES = [None, NOW - HOUR, KEPT, NOW + 10_000 * HOUR]
CONDITIONS = [
    None,
    preserved_condition(message="Machine preserved until x."),
    preserved_condition(status="False", reason="Preservation stopped.", transition=NOW - HOUR),
]


@st.composite
def natives(draw: st.DrawFn) -> tuple[Machine, Node | None]:
    has_node = draw(st.booleans())
    m = machine(
        node="n1" if has_node else "",
        phase=draw(st.sampled_from([FAILED, v.MachinePhase.RUNNING, v.MachinePhase.TERMINATING])),
        preserve=draw(st.sampled_from([ABSENT, "now", "when-failed", "auto-preserve", "auto-preserved", "false"])),
        expiry=draw(st.sampled_from(EXPIRIES)),
        since=draw(st.sampled_from([None, NOW - 1000 * HOUR])),
        by=draw(st.sampled_from(v.PreservedBy)),
        drain=draw(st.sampled_from([None, DRAINED])),
        added_ca=draw(st.booleans()),
        mirrored=draw(st.sampled_from(EXPIRIES)),
        deleting=draw(st.integers(0, 5)) == 0,
    )
    n = node(condition=draw(st.sampled_from(CONDITIONS)), tainted=draw(st.booleans())) if has_node else None
    return m, n


@settings(max_examples=300, deadline=None)
@given(natives())
def test_native_plans_never_run_the_lifecycle_and_hand_over_once(snapshot: tuple[Machine, Node | None]) -> None:
    m, n = snapshot
    result = native(m, n)
    # only the mirror, the Machine's annotations and the removal of our taint are ever written: the rest is MCM's
    allowed = SetPreserveExpiry | PatchMachineAnnotations | SetPreservedTaint
    assert all(isinstance(step, allowed) for step in writes(result))
    assert all(not step.present for step in of_type(result, SetPreservedTaint))
    if m.preservation is None or m.metadata.deletion_timestamp is not None:
        assert writes(result) == []
        assert all(e.once for e in of_type(result, RecordEvent)), "observations are recorded once each"
        return
    record = m.preservation
    if m.phase == v.MachinePhase.TERMINATING:
        assert result == MachinePlan()
        return
    handed, handed_node = apply_machine_plan(machine=m, node=n, plan=result, now=NOW)
    assert handed.preservation is None
    if handed_node is not None:
        assert not handed_node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT), "MCM never removes it"
    assert handed.mirrored_expiry == record.expiry(max_timeout=CONFIG.max_preserve_timeout)
    assert handed.metadata.annotations.get(v.PRESERVE_ANNOTATION) != "auto-preserve"
    assert isinstance(writes(result)[-1], PatchMachineAnnotations), "the record goes last"
    assert writes(native(handed, handed_node)) == [], "handed over once"


@pytest.mark.parametrize(
    ("priority", "last_priority", "after"),
    [
        ("5", "", None),  # it had none before we raised it
        ("6", "4", "4"),  # its own value comes back
        ("1", "", "1"),  # the CA's deletion mark set meanwhile stays
        ("7", ABSENT, "7"),  # not raised by us: left alone
    ],
)
def test_hand_over_restores_the_priority_our_preservation_raised(
    priority: str, last_priority: object, after: str | None
) -> None:
    # MCM sorts preserved machines last itself; a priority left raised would outlive its preservation.
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, priority=priority, last_priority=last_priority)
    handed, _ = apply_machine_plan(machine=m, node=None, plan=native(m), now=NOW)
    assert handed.metadata.annotations.get(v.MACHINE_PRIORITY_ANNOTATION) == after
    assert v.LAST_MACHINE_PRIORITY_ANNOTATION not in handed.metadata.annotations
    assert len(of_type(native(m), PatchMachineAnnotations)) == 1, "in the write that removes the record"


def test_hand_over_removes_our_taint_which_mcm_does_not_know() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, drain=DRAINED)
    result = native(m, preserved_node())
    assert [type(step).__name__ for step in writes(result)] == [
        "SetPreserveExpiry",
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "PatchMachineAnnotations",
    ]
    assert only(result, SetPreservedTaint) == SetPreservedTaint(present=False)


def test_hand_over_leaves_a_node_of_another_machine_alone() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=KEPT)
    m = m.model_copy(update={"spec": m.spec.model_copy(update={"provider_id": "fake:///m1"})})
    n = preserved_node()
    n = n.model_copy(update={"spec": n.spec.model_copy(update={"provider_id": "fake:///other"})})
    result = native(m, n)
    assert of_type(result, SetPreservedTaint) == []
    assert [e.kind for e in of_type(result, RecordEvent)] == ["Machine"]


def test_hand_over_removes_the_nodes_fields_of_our_preservation_with_the_marker() -> None:
    # They tell of our record, which goes: MCM shows its preservation by its own condition and expiry.
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, drain=DrainRecord(outcome=v.DrainOutcome.DRAINED))
    fields = {**node_fields_of(m, "failed", pods_left="1", blocked_by="shop/web"), v.PRESERVED_EVIDENCE_ANNOTATION: "e"}
    with_marker = node(ca="true", ca_marker="true", tainted=True, condition=preserved_condition(), fields=fields)
    assert only(native(m, with_marker), PatchNodeAnnotations) == PatchNodeAnnotations(
        set={v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true"},
        remove=(v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION, *(key for key in FIELDS if key in fields)),
    )
    without_marker = node(ca="true", condition=preserved_condition(), fields=fields)
    patch = only(native(m, without_marker), PatchNodeAnnotations)
    assert (patch.set, set(patch.remove)) == ({}, set(FIELDS)), "the evidence's name stays with its writer"
