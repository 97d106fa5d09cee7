"""Properties of the machine plan over arbitrary machines, nodes, values, phases and times.

The central one is convergence: executing a plan and planning again yields no step, so a converged machine
costs no API write.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.lifecycle import plan_after_drain
from machine_preservation.core.models import Machine, Node, NoNode
from machine_preservation.core.node_fields import STOP_REMOVES
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
from machine_preservation.core.preservation_record import DrainRecord, format_timestamp, parse_timestamp

from .lifecycle_helpers import CONFIG, changing_steps, execute, interrupted, of_type, plan, writes
from .plan_simulator import apply_machine_plan
from .preservation_objects import ABSENT, HOUR, NOW, machine, node, preserved_condition

VALUES = [ABSENT, "", "now", "when-failed", "false", "auto-preserve", "auto-preserved", "yes", " now"]
PHASES = ["Running", "Failed", "Unknown", "Pending", "CrashLoopBackOff", "", "Terminating"]
MINUTE = dt.timedelta(minutes=1)
EXPIRIES = [None, None, NOW - HOUR, NOW, NOW + dt.timedelta(seconds=1), NOW + 5 * HOUR, NOW + 100 * HOUR]
UNTIL = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
CONDITIONS: list[dict[str, Any] | None] = [
    None,
    preserved_condition(message=UNTIL),
    preserved_condition(message=f"Preserved node drained successfully. {UNTIL}"),
    preserved_condition(reason="Preserved by MCM.", message=f"Preserved node drained successfully. {UNTIL}"),
    preserved_condition(status="False", message=f"Preserved node could not be drained. {UNTIL}"),
    preserved_condition(status="False", message=f"Preserved node is being drained. {UNTIL}"),
    preserved_condition(status="False", message=f"Preserved node could not be drained. {UNTIL} Pods blocking: a/b."),
    preserved_condition(status="False", reason="Preservation stopped."),
    preserved_condition(message="Machine preserved until 2030-01-01 00:00:00 +0000 UTC."),
]
# A Node's preservation fields as an earlier preservation, a crash, or someone writing them while the webhook was
# down may have left them.
NODE_FIELDS: list[dict[str, str]] = [
    {},
    {},
    {
        v.PRESERVED_SINCE_ANNOTATION: "2026-08-01T00:00:00Z",
        v.PRESERVED_UNTIL_ANNOTATION: "2026-08-20T15:00:00Z",
        v.PRESERVED_BY_ANNOTATION: "auto",
        v.PRESERVED_DRAIN_ANNOTATION: "failed",
        v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "3",
        v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: "ns/web",
        v.PRESERVED_EVIDENCE_ANNOTATION: "kube-system/evidence",
    },
    {v.PRESERVED_DRAIN_ANNOTATION: "draining", v.PRESERVED_UNTIL_ANNOTATION: "garbage"},
]
DRAINS = [
    None,
    None,
    DrainRecord(outcome=v.DrainOutcome.DRAINED),
    DrainRecord(
        outcome=v.DrainOutcome.FAILED, failing_since=NOW - 3 * HOUR, last_attempt=NOW - dt.timedelta(minutes=5)
    ),
    DrainRecord(outcome=v.DrainOutcome.FAILED, failing_since=NOW - HOUR, last_attempt=NOW - dt.timedelta(seconds=10)),
]
CONFIGS = [CONFIG, dataclasses.replace(CONFIG, mirror_status=True), dataclasses.replace(CONFIG, drain_timeout=HOUR)]
PRIORITY_SETTINGS = st.fixed_dictionaries(
    {
        "priority": st.sampled_from([ABSENT, "1", "2", "3", "5", "10", "abc"]),
        "last_priority": st.sampled_from([ABSENT, ABSENT, "", "1", "7", "abc"]),
    }
)


@st.composite
def snapshots(
    draw: st.DrawFn,
    timeouts: tuple[str | None, ...] = (None, "1h", "bad", "-1h"),
    expiries: tuple[dt.datetime | None, ...] = tuple(EXPIRIES),
    phases: tuple[str, ...] = tuple(PHASES),
    with_node: bool = False,
    values: tuple[str, ...] = tuple(VALUES),
) -> dict[str, Any]:
    has_label = with_node or draw(st.booleans())
    m = machine(
        node="n1" if has_label else "",
        phase=draw(st.sampled_from(phases)),
        expiry=draw(st.sampled_from(expiries)),
        since=draw(st.sampled_from([None, None, NOW - 1000 * HOUR])),  # old enough for the cap to bite
        drain=draw(st.sampled_from(DRAINS)),
        mirrored=draw(st.sampled_from([None, NOW + 5 * HOUR, NOW + 10_000 * HOUR])),
        preserve=draw(st.sampled_from(values)),
        last_applied=draw(st.sampled_from([ABSENT, ABSENT, "", "now", "when-failed", "false", "auto-preserved"])),
        reported_invalid=draw(st.sampled_from([ABSENT, ABSENT, "garbage", '[["Node","yes"]]', '[["Machine","yes"]]'])),
        timeout=draw(st.sampled_from(timeouts)),
        deleting=draw(st.integers(0, 9)) == 0,
        node_gone_since=draw(st.sampled_from([None, None, NOW - HOUR])),
        **draw(PRIORITY_SETTINGS),
    )
    n: Node | None = None
    no_node = NoNode.NO_LABEL
    if has_label and (with_node or draw(st.integers(0, 4)) > 0):
        n = node(
            preserve=draw(st.sampled_from(VALUES)),
            ca=draw(st.sampled_from([ABSENT, "true", "false"])),
            ca_marker=draw(st.sampled_from([ABSENT, "true", "false"])),
            ready=draw(st.sampled_from(["True", "False"])),
            tainted=draw(st.booleans()),
            unschedulable=draw(st.booleans()),
            condition=draw(st.sampled_from(CONDITIONS)),
            fields=draw(st.sampled_from(NODE_FIELDS)),
        )
    elif has_label:
        no_node = draw(st.sampled_from(NoNode))
    return {
        "machine": m,
        "node": n,
        "no_node": no_node,  # why there is no node, when there is none
        "ceiling": draw(st.integers(3, 12)),
        "config": draw(st.sampled_from(CONFIGS)),
        "drained": draw(st.booleans()),
        "now": NOW + dt.timedelta(microseconds=draw(st.sampled_from([0, 1, 999_999]))),
    }


def plan_of(s: dict[str, Any]) -> MachinePlan:
    return replan(s, s["machine"], s["node"])


def replan(s: dict[str, Any], m: Machine, n: Node | None) -> MachinePlan:
    """Plan the snapshot's machine as it is now (same absence of a node, ceiling and time)."""
    node_value = n if n is not None else s["no_node"]
    return plan(m, node_value, ceiling=s["ceiling"], now=s["now"], config=s["config"])


def pending(
    s: dict[str, Any], m: Machine, n: Node | None, *, blocking_pods: tuple[str, ...] = ("ns/p",)
) -> tuple[MachineStep, ...]:
    """What planning the machine as it is now would still change (a look without evictions that changes
    nothing does not count)."""
    return changing_steps(replan(s, m, n), m, n, now=s["now"], drained=s["drained"], blocking_pods=blocking_pods)


def run(s: dict[str, Any]) -> tuple[MachinePlan, Machine, Node | None]:
    first = plan_of(s)
    m, n = execute(s["machine"], s["node"], first, now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
    return first, m, n


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(snapshots())
def test_executing_a_plan_converges_in_one_step(s: dict[str, Any]) -> None:
    _, m, n = run(s)
    assert pending(s, m, n) == ()


@settings(max_examples=150, deadline=None)
@given(snapshots(timeouts=("0s", None)))
def test_even_a_zero_timeout_converges_within_three_rounds(s: dict[str, Any]) -> None:
    m, n = s["machine"], s["node"]
    for _ in range(3):
        if not pending(s, m, n, blocking_pods=()):
            return
        m, n = execute(m, n, replan(s, m, n), now=s["now"], drained=s["drained"])
    assert pending(s, m, n, blocking_pods=()) == ()


@PROPERTY
@given(snapshots())
def test_a_ca_annotation_is_removed_only_with_our_marker(s: dict[str, Any]) -> None:
    removes_ca = any(v.CA_SCALE_DOWN_DISABLED_ANNOTATION in p.remove for p in of_type(plan_of(s), PatchNodeAnnotations))
    if removes_ca:
        assert s["node"].metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION) == "true"


@PROPERTY
@given(snapshots())
def test_unschedulable_is_never_changed(s: dict[str, Any]) -> None:
    _, _, n = run(s)
    if s["node"] is not None:
        assert n is not None
        assert n.spec.unschedulable == s["node"].spec.unschedulable


@PROPERTY
@given(snapshots())
def test_the_record_is_never_extended_or_reset_while_preserved(s: dict[str, Any]) -> None:
    record_writes = [
        patch.set
        for patch in of_type(plan_of(s), PatchMachineAnnotations)
        if {v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION} & set(patch.set)
    ]
    if s["machine"].preservation is not None:
        assert record_writes == []
    for written in record_writes:
        since = parse_timestamp(written[v.PRESERVED_SINCE_ANNOTATION])
        until = parse_timestamp(written[v.PRESERVED_UNTIL_ANNOTATION])
        assert since is not None
        assert until is not None
        assert s["now"] - dt.timedelta(seconds=1) < since <= until <= since + s["config"].max_preserve_timeout


@PROPERTY
@given(snapshots())
def test_the_mirror_shows_the_capped_expiry_and_only_where_the_crd_keeps_it(s: dict[str, Any]) -> None:
    _, m, _ = run(s)
    mirrors = of_type(plan_of(s), SetPreserveExpiry)
    if not s["config"].mirror_status:
        assert mirrors == []
        return
    expiry = m.preservation.expiry(max_timeout=s["config"].max_preserve_timeout) if m.preservation else None
    in_force = expiry is not None and expiry > s["now"]
    if in_force and m.metadata.deletion_timestamp is None and m.phase != v.MachinePhase.TERMINATING:
        assert m.mirrored_expiry == expiry


@PROPERTY
@given(snapshots())
def test_taint_and_drain_only_for_failed_machines_and_only_the_condition_alongside(s: dict[str, Any]) -> None:
    result = plan_of(s)
    failed_now = s["machine"].phase == v.MachinePhase.FAILED and not of_type(result, SetMachinePhase)
    if any(step.present for step in of_type(result, SetPreservedTaint)) or of_type(result, DrainNode):
        assert failed_now
    api_writes = writes(result)
    if result.drain is not None:
        # The drain follows the taint; only what tells about it is written alongside.
        alongside = result.drain.alongside
        assert all(isinstance(step, (SetPreservedCondition, PatchMachineAnnotations)) for step in alongside)
        assert not any(isinstance(step, PatchMachineAnnotations) and step.set for step in alongside)
    if of_type(result, DeleteMachine):
        # A Failed machine, or one whose Node is gone (MCM asked to delete it when its Node went).
        record = s["machine"].preservation
        node_gone = s["node"] is None and s["no_node"] is NoNode.NOT_FOUND and record is not None
        assert failed_now or (node_gone and record.node_gone_since is not None)
        assert isinstance(api_writes[-1], DeleteMachine)


@PROPERTY
@given(snapshots())
def test_requeue_exactly_at_expiry_while_preserved(s: dict[str, Any]) -> None:
    first, m, n = run(s)
    record = m.preservation
    if m.metadata.deletion_timestamp is not None or m.phase == v.MachinePhase.TERMINATING or record is None:
        assert first.requeue_after is None
        return
    expiry = record.expiry(max_timeout=s["config"].max_preserve_timeout)
    if expiry <= s["now"]:
        return  # an expired record is being stopped (the Failed machine deleted)
    wake = expiry
    drain_failed_at = (
        record.drain.last_attempt
        if record.drain is not None and record.drain.outcome == v.DrainOutcome.FAILED
        else None
    )
    if (
        drain_failed_at is not None
        and n is not None
        and m.phase == v.MachinePhase.FAILED
        and not of_type(first, DrainNode)
    ):
        # waiting: a failed drain is retried after the interval, or at expiry if that comes first
        wake = min(expiry, drain_failed_at + CONFIG.drain_retry_interval)
    assert first.requeue_after == max(wake - s["now"], dt.timedelta(0))


@PROPERTY
@given(snapshots())
def test_patches_never_set_and_remove_the_same_key(s: dict[str, Any]) -> None:
    for patch in (*of_type(plan_of(s), PatchMachineAnnotations), *of_type(plan_of(s), PatchNodeAnnotations)):
        assert not set(patch.set) & set(patch.remove)
        assert patch.set or patch.remove  # no empty writes


@PROPERTY
@given(snapshots())
def test_warnings_only_for_invalid_values_failed_drains_and_gone_nodes(s: dict[str, Any]) -> None:
    for event in of_type(plan_of(s), RecordEvent):
        assert event.type in ("Normal", "Warning")
        if event.type == "Warning" and event.reason == v.EventReason.PRESERVED_NODE_GONE:
            assert s["node"] is None
            assert s["no_node"] is NoNode.NOT_FOUND
        elif event.type == "Warning":
            assert event.reason in (v.EventReason.INVALID_PRESERVE_VALUE, v.EventReason.PRESERVED_NODE_DRAIN_FAILED)


@PROPERTY
@given(snapshots(with_node=True))
def test_a_converged_node_tells_exactly_the_preservation(s: dict[str, Any]) -> None:
    before = s["machine"]
    assume(before.phase != "Terminating" and before.metadata.deletion_timestamp is None)  # MCM's deletion flow's
    # A restored machine MCM has not placed again: the plan waits, writing nothing.
    settling = before.preservation is not None and before.preservation.since <= before.metadata.creation_timestamp
    assume(not (settling and before.phase in ("", "Pending", "Unknown")))
    _, m, n = run(s)
    assert n is not None
    fields = {key: value for key, value in n.metadata.annotations.items() if key in STOP_REMOVES}
    record = m.preservation
    if record is None or m.metadata.deletion_timestamp is not None:
        assert fields == {}, "no preservation: the node tells of none"
        return
    expiry = record.expiry(max_timeout=s["config"].max_preserve_timeout)
    assert fields[v.PRESERVED_SINCE_ANNOTATION] == format_timestamp(record.since)
    assert fields[v.PRESERVED_UNTIL_ANNOTATION] == format_timestamp(expiry)
    assert fields[v.PRESERVED_BY_ANNOTATION] == record.by.value
    state = fields.get(v.PRESERVED_DRAIN_ANNOTATION)
    if m.phase != v.MachinePhase.FAILED:
        assert state is None
    elif record.drain is None:
        assert state == "draining"
    else:
        assert state == record.drain.outcome.value
    if state != "failed":
        assert v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION not in fields
        assert v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION not in fields


def essentials(m: Machine, n: Node | None) -> tuple[object, ...]:
    """What a converged state is judged by (timestamps and Events aside)."""
    machine_state = (
        m.metadata.annotations,
        m.phase,
        m.mirrored_expiry,
        m.metadata.deletion_timestamp is not None,
    )
    if n is None:
        return machine_state
    condition = n.preserved_condition
    return (
        *machine_state,
        n.metadata.annotations,
        [(t.key, t.effect) for t in n.spec.taints],
        n.spec.unschedulable,
        None if condition is None else (condition.status, condition.reason, condition.message),
    )


def converge(s: dict[str, Any], m: Machine, n: Node | None) -> tuple[Machine, Node | None]:
    for _ in range(4):
        if not pending(s, m, n):
            return m, n
        m, n = execute(m, n, replan(s, m, n), now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
    raise AssertionError("no convergence after a crash")


@PROPERTY
@given(snapshots(), st.integers(0, 12))
def test_a_crash_after_any_write_converges_to_the_same_state(s: dict[str, Any], crash_after: int) -> None:
    first = plan_of(s)
    _, m_full, n_full = run(s)
    prefix = interrupted(first, crash_after)
    m, n = execute(s["machine"], s["node"], prefix, now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
    m, n = converge(s, m, n)
    assert essentials(m, n) == essentials(m_full, n_full)


@settings(PROPERTY, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(snapshots(phases=("Failed",), with_node=True, values=("now", "when-failed")), st.integers(0, 3))
def test_a_crash_after_any_write_of_a_drains_outcome_converges_to_the_same_state(
    s: dict[str, Any], crash_after: int
) -> None:
    first = plan_of(s)
    assume(first.drain is not None)
    assert first.drain is not None
    _, m_full, n_full = run(s)
    m, n = apply_machine_plan(machine=s["machine"], node=s["node"], plan=interrupted(first, 99), now=s["now"])
    assert n is not None
    outcome = plan_after_drain(
        machine=m, node=n, drain=first.drain, drained=s["drained"], blocking_pods=("ns/p",), now=s["now"]
    )
    m, n = apply_machine_plan(machine=m, node=n, plan=interrupted(outcome, crash_after), now=s["now"])
    m, n = converge(s, m, n)
    assert essentials(m, n) == essentials(m_full, n_full)


def starts(result: MachinePlan) -> bool:
    """Whether a plan starts a preservation: it writes a record's start, or says so."""
    writes_since = any(v.PRESERVED_SINCE_ANNOTATION in p.set for p in of_type(result, PatchMachineAnnotations))
    says_so = any(e.reason == v.EventReason.PRESERVATION_STARTED for e in of_type(result, RecordEvent))
    return writes_since or says_so


def ends(result: MachinePlan) -> bool:
    """Whether a plan ends the preservation: it removes the record, or deletes the Failed machine with it."""
    removes = any(v.PRESERVED_SINCE_ANNOTATION in p.remove for p in of_type(result, PatchMachineAnnotations))
    return removes or bool(of_type(result, DeleteMachine))


@PROPERTY
@given(snapshots(), st.integers(0, 12))
def test_a_stop_interrupted_after_any_step_is_finished_never_a_new_preservation(s: dict[str, Any], done: int) -> None:
    """A crash after `done` writes, or a conflict (409) on the next one, leaves the objects as after the
    first `done` writes: the record is still there, so planning again finishes the stop."""
    first = plan_of(s)
    assume(s["machine"].preservation is not None and ends(first))
    prefix = interrupted(first, done)
    m, n = execute(s["machine"], s["node"], prefix, now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
    for _ in range(4):
        again = replan(s, m, n)
        assert not starts(again), "an interrupted stop must not start a new preservation"
        if not pending(s, m, n):
            break
        m, n = execute(m, n, again, now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
    assert m.preservation is None or m.metadata.deletion_timestamp is not None


@PROPERTY
@given(snapshots(expiries=(NOW - HOUR, NOW)), st.integers(0, 12))  # expired: most such snapshots stop at expiry
def test_a_stop_at_expiry_interrupted_after_any_step_is_still_reported_as_the_expiry(
    s: dict[str, Any], done: int
) -> None:
    """A crash or a conflict part-way through a stop at expiry (e.g. after the node's annotation went, before the
    record did): the plan that finishes it reports the expiry too, never a stop for another cause."""
    first = plan_of(s)
    assume(any(e.reason == v.EventReason.PRESERVATION_EXPIRED for e in of_type(first, RecordEvent)))
    prefix = interrupted(first, done)
    m, n = execute(s["machine"], s["node"], prefix, now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
    for _ in range(4):
        again = replan(s, m, n)
        stops = {e.reason for e in of_type(again, RecordEvent)} & {
            v.EventReason.PRESERVATION_STOPPED,
            v.EventReason.PRESERVATION_EXPIRED,
        }
        assert stops <= {v.EventReason.PRESERVATION_EXPIRED}, [type(step).__name__ for step in prefix.steps]
        if not pending(s, m, n):
            break
        m, n = execute(m, n, again, now=s["now"], drained=s["drained"], blocking_pods=("ns/p",))
