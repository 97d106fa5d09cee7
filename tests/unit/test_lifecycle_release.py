"""The machine plan while the extension is disabled for the shoot (`MachineContext.released`).

Every running preservation stops with the writes of any stop (priority, our CA annotation, condition, taint,
mirror, record), a Failed machine is left to MCM (not deleted, its phase not moved), nothing starts, and the
user's preserve annotations on the Machine and the Node stay exactly as they are.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from machine_preservation.core import conditions
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node, NoNode
from machine_preservation.core.plan import (
    DeleteMachine,
    DrainNode,
    MachinePlan,
    MachineStep,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetMachinePhase,
    SetPreservedCondition,
    SetPreservedTaint,
    SetPreserveExpiry,
)
from machine_preservation.core.preservation_record import DrainRecord

from .lifecycle_helpers import CONFIG, execute, of_type, plan, writes
from .preservation_objects import ABSENT, HOUR, NOW, machine, node, preserved_condition

RUNNING, FAILED = v.MachinePhase.RUNNING, v.MachinePhase.FAILED
MIRROR = dataclasses.replace(CONFIG, mirror_status=True)
KEPT = NOW + 5 * HOUR
EARLIER = NOW - 10 * HOUR  # the transition time preserved_condition() gives by default
UNTIL_KEPT = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
SINCE, UNTIL, BY = v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION
ADDED_CA, DRAIN = v.PRESERVED_ADDED_CA_ANNOTATION, v.PRESERVED_DRAIN_ANNOTATION
CA, OUR_MARKER, MCM_MARKER = (
    v.CA_SCALE_DOWN_DISABLED_ANNOTATION,
    v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
    v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,
)
PRIORITY_RESTORED = PatchMachineAnnotations(remove=(v.MACHINE_PRIORITY_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION))
TAINT_REMOVED = SetPreservedTaint(present=False)
MIRROR_CLEARED = SetPreserveExpiry(expiry=None)
RELEASED_MESSAGE = (
    "Preservation stopped: machine-preservation was disabled for this cluster; the machine is left to "
    "machine-controller-manager."
)
ON_BOTH = ("Machine", "Node")
ON_MACHINE = ("Machine",)


def stopped_condition(transition: dt.datetime = NOW) -> SetPreservedCondition:
    return SetPreservedCondition(
        status="False", reason=v.ConditionReason.PRESERVATION_STOPPED, message="", last_transition_time=transition
    )


def record_removed(*keys: str) -> PatchMachineAnnotations:
    return PatchMachineAnnotations(remove=(SINCE, UNTIL, BY, *keys))


@dataclass(frozen=True)
class Case:
    machine: Machine
    node: Node | NoNode
    writes: list[MachineStep]
    stop_events_on: tuple[str, ...] = ()  # where the PreservationStopped Events go (none: nothing to stop)
    config: Any = CONFIG


CASES = {
    "now on the machine, Running, our CA annotation and marker, priority raised": Case(
        machine(preserve="now", expiry=KEPT, added_ca=True, priority="5", last_priority=""),
        node(ca="true", ca_marker="true", ready="True", condition=preserved_condition(message=UNTIL_KEPT)),
        [
            PRIORITY_RESTORED,
            PatchNodeAnnotations(remove=(CA, OUR_MARKER)),
            stopped_condition(),
            record_removed(ADDED_CA),
        ],
        ON_BOTH,
    ),
    "now on the node, when-failed on the machine: neither is synced nor removed; a user's CA annotation stays": Case(
        machine(preserve="when-failed", expiry=KEPT),
        node(preserve="now", ca="true", ready="True", condition=preserved_condition(message=UNTIL_KEPT)),
        [stopped_condition(), record_removed()],
        ON_BOTH,
    ),
    "a user's CA annotation with our marker, the record says not ours: it stays": Case(
        machine(preserve="now", expiry=KEPT),
        node(ca="true", ca_marker="true", ready="True", condition=preserved_condition(message=UNTIL_KEPT)),
        [stopped_condition(), record_removed()],
        ON_BOTH,
    ),
    "when-failed, Failed and drained, our CA annotation under MCM's marker: not deleted": Case(
        machine(
            phase=FAILED,
            preserve="when-failed",
            expiry=KEPT,
            added_ca=True,
            drain=DrainRecord(outcome=v.DrainOutcome.DRAINED),
        ),
        node(
            ca="true",
            mcm_marker="true",
            tainted=True,
            condition=preserved_condition(message=f"Preserved node drained successfully. {UNTIL_KEPT}"),
        ),
        [
            PatchNodeAnnotations(remove=(CA, MCM_MARKER)),
            TAINT_REMOVED,
            stopped_condition(),
            record_removed(ADDED_CA, DRAIN),
        ],
        ON_BOTH,
    ),
    "when-failed, Failed, node healthy again: the phase is not moved": Case(
        machine(phase=FAILED, preserve="when-failed", expiry=KEPT),
        node(ready="True", tainted=True, condition=preserved_condition(message=UNTIL_KEPT)),
        [TAINT_REMOVED, stopped_condition(), record_removed()],
        ON_BOTH,
    ),
    "auto, Failed, being drained, mirrored, priority raised: the auto value stays": Case(
        machine(
            phase=FAILED,
            preserve="auto-preserve",
            expiry=KEPT,
            by=v.PreservedBy.AUTO,
            mirrored=KEPT,
            priority="4",
            last_priority="",
        ),
        node(
            tainted=True,
            condition=preserved_condition(
                status="False",
                reason=v.ConditionReason.PRESERVED_BY_MCM,
                message=f"Preserved node is being drained. {UNTIL_KEPT}",
            ),
        ),
        [PRIORITY_RESTORED, TAINT_REMOVED, stopped_condition(EARLIER), MIRROR_CLEARED, record_removed()],
        ON_BOTH,
        MIRROR,
    ),
    "now, Failed, expired: not deleted, the annotation stays": Case(
        machine(phase=FAILED, preserve="now", expiry=NOW - HOUR),
        node(tainted=True, condition=preserved_condition(message=UNTIL_KEPT)),
        [TAINT_REMOVED, stopped_condition(), record_removed()],
        ON_BOTH,
    ),
    "false, Failed, still preserved: not deleted": Case(
        machine(phase=FAILED, preserve="false", expiry=KEPT),
        node(tainted=True, condition=preserved_condition(message=UNTIL_KEPT)),
        [TAINT_REMOVED, stopped_condition(), record_removed()],
        ON_BOTH,
    ),
    "now, Running, no node": Case(
        machine(node="", preserve="now", expiry=KEPT, mirrored=KEPT),
        NoNode.NO_LABEL,
        [MIRROR_CLEARED, record_removed()],
        ON_MACHINE,
        MIRROR,
    ),
    "when-failed, Failed, its node not found": Case(
        machine(phase=FAILED, preserve="when-failed", expiry=KEPT),
        NoNode.NOT_FOUND,
        [record_removed()],
        ON_MACHINE,
    ),
    "leftover of a stop: condition True without a record": Case(
        machine(phase=FAILED, preserve="now"),
        node(tainted=True, condition=preserved_condition(message=UNTIL_KEPT)),
        [TAINT_REMOVED, stopped_condition()],
    ),
    "leftover of a stop: taint without a record": Case(machine(phase=FAILED), node(tainted=True), [TAINT_REMOVED]),
    "leftover of a stop: condition stopped already, taint without a record": Case(
        machine(phase=FAILED),
        node(tainted=True, condition=preserved_condition(status="False", reason="Preservation stopped.")),
        [TAINT_REMOVED],
    ),
    "not preserved, now on the node, Failed: nothing starts": Case(machine(phase=FAILED), node(preserve="now"), []),
    "not preserved, now on the machine, Running: nothing starts": Case(machine(preserve="now"), node(), []),
    "not preserved, auto on the machine, Failed: nothing starts": Case(
        machine(phase=FAILED, preserve="auto-preserve"), node(), []
    ),
    "not preserved, an invalid value on the node: not reported": Case(machine(), node(preserve="yes"), []),
    "not preserved, our CA annotation and marker without a record: left alone": Case(
        machine(), node(ca="true", ca_marker="true"), []
    ),
    "being deleted: MCM's deletion flow owns it": Case(
        machine(phase=FAILED, preserve="now", expiry=KEPT, deleting=True),
        node(tainted=True, condition=preserved_condition(message=UNTIL_KEPT)),
        [],
    ),
}


def preserve_values(m: Machine, n: Node | None) -> tuple[str | None, ...]:
    values = (
        m.metadata.annotations.get(v.PRESERVE_ANNOTATION),
        m.metadata.annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION),
    )
    return values if n is None else (*values, n.metadata.annotations.get(v.PRESERVE_ANNOTATION))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_release_writes_exactly_the_stop(case: Case) -> None:
    result = plan(case.machine, case.node, config=case.config, released=True)
    assert writes(result) == case.writes
    assert result.requeue_after is None
    stops = [(e.kind, e.reason, e.message) for e in of_type(result, RecordEvent)]
    assert stops == [(kind, v.EventReason.PRESERVATION_STOPPED, RELEASED_MESSAGE) for kind in case.stop_events_on]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_release_converges_and_keeps_the_users_values(case: Case) -> None:
    n = case.node if isinstance(case.node, Node) else None
    m2, n2 = execute(case.machine, n, plan(case.machine, case.node, config=case.config, released=True))
    assert preserve_values(m2, n2) == preserve_values(case.machine, n)
    node_value = n2 if n2 is not None else case.node
    assert plan(m2, node_value, config=case.config, released=True) == MachinePlan()


def test_without_release_the_same_machines_would_be_deleted_recovered_or_started() -> None:
    """The table's cases that differ from an ordinary plan, so the released input is what makes them."""
    differing = {
        name
        for name, case in CASES.items()
        if plan(case.machine, case.node, config=case.config)
        != plan(case.machine, case.node, config=case.config, released=True)
    }
    assert {
        "now, Failed, expired: not deleted, the annotation stays",
        "false, Failed, still preserved: not deleted",
        "when-failed, Failed, node healthy again: the phase is not moved",
        "not preserved, now on the node, Failed: nothing starts",
        "not preserved, now on the machine, Running: nothing starts",
        "not preserved, auto on the machine, Failed: nothing starts",
        "not preserved, an invalid value on the node: not reported",
        "now on the node, when-failed on the machine: neither is synced nor removed; a user's CA annotation stays",
    } <= differing


# --- properties over arbitrary machines and nodes ---

VALUES = [ABSENT, "", "now", "when-failed", "false", "auto-preserve", "auto-preserved", "yes"]
PHASES = ["Running", "Failed", "Unknown", "Pending", "", "Terminating"]
UNTIL = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
CONDITIONS: list[dict[str, Any] | None] = [
    None,
    preserved_condition(message=UNTIL),
    preserved_condition(reason="Preserved by MCM.", message=f"Preserved node drained successfully. {UNTIL}"),
    preserved_condition(status="False", message=f"Preserved node is being drained. {UNTIL}"),
    preserved_condition(status="False", message=f"Preserved node could not be drained. {UNTIL} Pods blocking: a/b."),
    preserved_condition(status="False", reason="Preservation stopped."),
]
DRAINS = [
    None,
    DrainRecord(outcome=v.DrainOutcome.DRAINED),
    DrainRecord(outcome=v.DrainOutcome.FAILED, failing_since=NOW - 3 * HOUR, last_attempt=NOW - HOUR),
]
FLAG = [ABSENT, "true", "false"]


@st.composite
def released_snapshots(draw: st.DrawFn) -> dict[str, Any]:
    has_label = draw(st.booleans())
    m = machine(
        node="n1" if has_label else "",
        phase=draw(st.sampled_from(PHASES)),
        expiry=draw(st.sampled_from([None, None, NOW - HOUR, NOW, KEPT, NOW + 100 * HOUR])),
        by=draw(st.sampled_from(v.PreservedBy)),
        drain=draw(st.sampled_from(DRAINS)),
        added_ca=draw(st.booleans()),
        mirrored=draw(st.sampled_from([None, KEPT])),
        preserve=draw(st.sampled_from(VALUES)),
        last_applied=draw(st.sampled_from([ABSENT, "", "now", "when-failed", "false"])),
        priority=draw(st.sampled_from([ABSENT, "1", "3", "5"])),
        last_priority=draw(st.sampled_from([ABSENT, ABSENT, "", "2", "7"])),
        deleting=draw(st.integers(0, 9)) == 0,
    )
    n: Node | NoNode = NoNode.NO_LABEL
    if has_label:
        n = (
            node(
                preserve=draw(st.sampled_from(VALUES)),
                ca=draw(st.sampled_from(FLAG)),
                ca_marker=draw(st.sampled_from(FLAG)),
                mcm_marker=draw(st.sampled_from(FLAG)),
                ready=draw(st.sampled_from(["True", "False"])),
                tainted=draw(st.booleans()),
                condition=draw(st.sampled_from(CONDITIONS)),
            )
            if draw(st.integers(0, 4)) > 0
            else NoNode.NOT_FOUND
        )
    return {"machine": m, "node": n, "config": draw(st.sampled_from([CONFIG, MIRROR]))}


def released_plan(s: dict[str, Any], m: Machine | None = None, n: Node | None = None) -> MachinePlan:
    machine_now = s["machine"] if m is None else m
    node_now: Node | NoNode = s["node"] if m is None else (n if n is not None else s["node"])
    return plan(machine_now, node_now, config=s["config"], released=True)


def existing(s: dict[str, Any]) -> Node | None:
    return s["node"] if isinstance(s["node"], Node) else None


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(released_snapshots())
def test_a_release_never_starts_deletes_moves_the_phase_or_touches_a_preserve_value(s: dict[str, Any]) -> None:
    result = released_plan(s)
    assert not of_type(result, DeleteMachine)
    assert not of_type(result, SetMachinePhase)
    assert not of_type(result, DrainNode)
    assert not any(step.present for step in of_type(result, SetPreservedTaint))
    assert not any(step.status == conditions.TRUE for step in of_type(result, SetPreservedCondition))
    assert not any(step.expiry is not None for step in of_type(result, SetPreserveExpiry))
    assert not any(e.reason == v.EventReason.PRESERVATION_STARTED for e in of_type(result, RecordEvent))
    user_keys = {v.PRESERVE_ANNOTATION, v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION}
    for patch in (*of_type(result, PatchMachineAnnotations), *of_type(result, PatchNodeAnnotations)):
        assert not user_keys & (set(patch.set) | set(patch.remove))
        assert SINCE not in patch.set
    assert result.requeue_after is None


@PROPERTY
@given(released_snapshots())
def test_a_release_leaves_no_preservation_behind_and_converges(s: dict[str, Any]) -> None:
    m, n = execute(s["machine"], existing(s), released_plan(s))
    if s["machine"].metadata.deletion_timestamp is not None or s["machine"].phase == v.MachinePhase.TERMINATING:
        assert (m, n) == (s["machine"], existing(s))  # MCM's deletion flow owns it
        return
    assert m.preservation is None
    assert m.phase == s["machine"].phase
    assert m.metadata.deletion_timestamp is None
    assert preserve_values(m, n) == preserve_values(s["machine"], existing(s))
    if s["config"].mirror_status and s["machine"].preservation is not None:
        assert m.mirrored_expiry is None
    if n is not None:
        assert not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        assert n.preserved_condition is None or conditions.is_stopped(n.preserved_condition)
    assert released_plan(s, m, n) == MachinePlan()


@PROPERTY
@given(released_snapshots())
def test_a_release_removes_the_ca_annotation_only_where_our_record_says_we_added_it(s: dict[str, Any]) -> None:
    removes_ca = any(CA in patch.remove for patch in of_type(released_plan(s), PatchNodeAnnotations))
    if removes_ca:
        record = s["machine"].preservation
        assert record is not None
        assert record.added_ca_annotation
        annotations = s["node"].metadata.annotations
        assert "true" in (annotations.get(OUR_MARKER), annotations.get(MCM_MARKER))


@PROPERTY
@given(released_snapshots(), st.integers(0, 10))
def test_a_release_interrupted_after_any_step_finishes_the_same(s: dict[str, Any], done: int) -> None:
    first = released_plan(s)
    full = execute(s["machine"], existing(s), first)
    m, n = execute(s["machine"], existing(s), MachinePlan(steps=first.steps[:done]))
    again = released_plan(s, m, n)
    assert not of_type(again, DeleteMachine)
    m, n = execute(m, n, again)
    assert released_plan(s, m, n) == MachinePlan()
    assert (m.metadata.annotations, n.metadata.annotations if n else None) == (
        full[0].metadata.annotations,
        full[1].metadata.annotations if full[1] else None,
    )
    assert (m.preservation, m.mirrored_expiry) == (full[0].preservation, full[0].mirrored_expiry)
