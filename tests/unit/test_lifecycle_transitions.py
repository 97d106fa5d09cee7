"""The machine plan for every transition of a preservation: start, failure, recovery, stop, expiry, deletion."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, NoNode
from machine_preservation.core.plan import (
    DeleteMachine,
    DrainNode,
    MachinePlan,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetMachinePhase,
    SetPreservedCondition,
    SetPreservedTaint,
    SetPreserveExpiry,
)
from machine_preservation.core.preservation_record import DrainRecord, PreservationRecord, format_timestamp

from .lifecycle_helpers import CONFIG, event_reasons, execute, of_type, only, plan, write_kinds, writes
from .preservation_objects import ABSENT, HOUR, NOW, machine, node, preserved_condition, with_phase

RUNNING, FAILED, UNKNOWN, PENDING = (
    v.MachinePhase.RUNNING,
    v.MachinePhase.FAILED,
    v.MachinePhase.UNKNOWN,
    v.MachinePhase.PENDING,
)
T = NOW + 72 * HOUR
KEPT = NOW + 5 * HOUR
CA_SET = {v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true", v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION: "true"}
# The Node's fields of a start (since now, until now + the default 72h, by a user) and of a preservation until KEPT.
STARTED_FIELDS = {
    v.PRESERVED_SINCE_ANNOTATION: format_timestamp(NOW),
    v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(T),
    v.PRESERVED_BY_ANNOTATION: "user",
}
KEPT_FIELDS = {
    v.PRESERVED_SINCE_ANNOTATION: format_timestamp(KEPT - 72 * HOUR),
    v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(KEPT),
    v.PRESERVED_BY_ANNOTATION: "user",
}
STARTED = [("Machine", v.EventReason.PRESERVATION_STARTED), ("Node", v.EventReason.PRESERVATION_STARTED)]
STOPPED = [("Machine", v.EventReason.PRESERVATION_STOPPED), ("Node", v.EventReason.PRESERVATION_STOPPED)]
EXPIRED = [("Machine", v.EventReason.PRESERVATION_EXPIRED), ("Node", v.EventReason.PRESERVATION_EXPIRED)]
# MCM's CRDs keep status.currentStatus.preserveExpiryTime (v0.62's): the expiry is mirrored there too.
MIRROR = dataclasses.replace(CONFIG, mirror_status=True)
# The record a start writes (since now, until now + the default 72h; the CA annotation is ours when we add it).
STARTED_RECORD = PreservationRecord(since=NOW, until=T, by=v.PreservedBy.USER, added_ca_annotation=True)
# A start writes the record first, its announcement pending, and last (before a drain) removes the pending mark
# once the Events are recorded: the node writes in between do not wait for the Events.
RECORD = "PatchMachineAnnotations"
ACKNOWLEDGED = "PatchMachineAnnotations"
START = [RECORD, ACKNOWLEDGED]
ANNOUNCED = PatchMachineAnnotations(remove=(v.PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION,), after_events=True)
RECORD_REMOVED = PatchMachineAnnotations(
    remove=(v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION)
)


PRESERVED_UNTIL_T = "Machine preserved until 2026-08-23 10:00:00 +0000 UTC."
PRESERVED_UNTIL_KEPT = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
DRAINED_KEPT = f"Preserved node drained successfully. {PRESERVED_UNTIL_KEPT}"


def preserved_running_node(**kwargs: object) -> dict[str, object]:
    """A node as a Running machine preserved until KEPT leaves it."""
    condition = preserved_condition(message=PRESERVED_UNTIL_KEPT)
    return {"ca": "true", "ca_marker": "true", "condition": condition, "fields": KEPT_FIELDS, **kwargs}


def steady_priority() -> dict[str, object]:
    return {"priority": "5", "last_priority": ""}


def ours() -> dict[str, object]:
    """A preserved machine in steady state whose record says it added the node's CA annotation."""
    return {**steady_priority(), "added_ca": True}


def machine_patches(result: MachinePlan) -> list[PatchMachineAnnotations]:
    return of_type(result, PatchMachineAnnotations)


def record_written(result: MachinePlan) -> dict[str, str]:
    """The record keys a plan writes (empty: it writes none)."""
    keys = v.PRESERVATION_RECORD_ANNOTATIONS
    return {k: val for patch in machine_patches(result) for k, val in patch.set.items() if k in keys}


def announcing(record: PreservationRecord) -> dict[str, str]:
    """The record keys a start writes first: `record`, its announcement pending."""
    return dataclasses.replace(record, announcement_pending=True).annotations()


def removal_of(m: Machine) -> PatchMachineAnnotations:
    """The last write of a stop: every record key the machine carries."""
    return PatchMachineAnnotations(
        remove=tuple(key for key in v.PRESERVATION_RECORD_ANNOTATIONS if key in m.metadata.annotations)
    )


def removes_the_record(result: MachinePlan) -> bool:
    return any(v.PRESERVED_SINCE_ANNOTATION in patch.remove for patch in machine_patches(result))


# Effective `now` on a machine that is not Failed
@pytest.mark.parametrize("phase", [RUNNING, UNKNOWN, PENDING, v.MachinePhase.CRASH_LOOP_BACK_OFF, ""])
def test_now_preserves_a_machine_that_is_not_failed_without_taint_or_drain(phase: str) -> None:
    result = plan(machine(phase=phase, preserve="now"), node(unschedulable=True))
    assert write_kinds(result) == [RECORD, "PatchNodeAnnotations", "SetPreservedCondition", ACKNOWLEDGED]
    assert record_written(result) == announcing(STARTED_RECORD)
    assert machine_patches(result)[1] == ANNOUNCED
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(set={**CA_SET, **STARTED_FIELDS})
    assert only(result, SetPreservedCondition) == SetPreservedCondition(
        status="True", reason="Preserved by user.", message=PRESERVED_UNTIL_T, last_transition_time=NOW
    )
    assert event_reasons(result) == STARTED
    assert result.requeue_after == 72 * HOUR


def test_now_on_the_node_syncs_the_machine_annotations() -> None:
    result = plan(machine(preserve="when-failed"), node(preserve="now"))
    patch = machine_patches(result)[0]
    assert patch.remove == (v.PRESERVE_ANNOTATION,)
    assert patch.set[v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION] == "now"


def test_the_record_goes_first_and_the_mirror_only_where_the_crd_keeps_it() -> None:
    result = plan(machine(preserve="now"), node(), config=MIRROR)
    assert write_kinds(result) == [
        RECORD,
        "SetPreserveExpiry",
        "PatchNodeAnnotations",
        "SetPreservedCondition",
        ACKNOWLEDGED,
    ]
    assert record_written(result) == announcing(STARTED_RECORD)
    assert only(result, SetPreserveExpiry).expiry == T


def test_without_a_node_label_a_start_writes_only_the_record_and_the_priority() -> None:
    result = plan(machine(node="", preserve="now"))
    assert write_kinds(result) == START
    assert record_written(result) == announcing(dataclasses.replace(STARTED_RECORD, added_ca_annotation=False))
    assert event_reasons(result) == [("Machine", v.EventReason.PRESERVATION_STARTED)]
    assert "no node: only the expiry" in of_type(result, RecordEvent)[0].message


# A Failed machine that asks for preservation: expiry, CA annotation, taint, then the drain
@pytest.mark.parametrize(
    ("value", "reason"),
    [("now", "Preserved by user."), ("when-failed", "Preserved by user."), ("auto-preserve", "Preserved by MCM.")],
)
def test_failed_machine_is_preserved_tainted_and_drained(value: str, reason: str) -> None:
    result = plan(machine(phase=FAILED, preserve=value, drain_timeout="30m"), node(), pods_to_evict=("ns/web-0",))
    # The drain starts once the record, the CA annotation and the taint are written; the condition saying so and
    # the acknowledgement of the start's Events go alongside the evictions.
    assert write_kinds(result) == [
        RECORD,
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "DrainNode",
        "SetPreservedCondition",
        ACKNOWLEDGED,
    ]
    assert only(result, SetPreservedTaint).present
    being_drained = SetPreservedCondition(
        status="False",
        reason=reason,
        message=f"Preserved node is being drained. {PRESERVED_UNTIL_T} Waiting for pods: ns/web-0.",
        last_transition_time=NOW,
    )
    by = v.PreservedBy.AUTO if value == "auto-preserve" else v.PreservedBy.USER
    record = dataclasses.replace(STARTED_RECORD, by=by)
    assert record_written(result) == announcing(record)
    # The Node says so from the start, with the CA annotation: a drain runs.
    fields = {**STARTED_FIELDS, v.PRESERVED_BY_ANNOTATION: by.value, v.PRESERVED_DRAIN_ANNOTATION: "draining"}
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(set={**CA_SET, **fields})
    assert result.drain == DrainNode(
        record=record,
        reason=reason,
        expiry=T,
        timeout=dt.timedelta(minutes=30),
        alongside=(being_drained, ANNOUNCED),
        node_fields=fields,
    )


def test_drain_timeout_falls_back_to_the_config_for_bad_values() -> None:
    for text in (None, "soon", "0s", "-5m"):
        drain = only(plan(machine(phase=FAILED, preserve="now", drain_timeout=text), node()), DrainNode)
        assert drain.timeout == CONFIG.drain_timeout


# `when-failed` on a Running machine: only the node-value sync
def test_when_failed_on_running_machine_changes_nothing_but_the_sync() -> None:
    assert plan(machine(preserve="when-failed"), node()) == MachinePlan()
    result = plan(machine(), node(preserve="when-failed"))
    assert writes(result) == [PatchMachineAnnotations(set={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "when-failed"})]
    assert result.requeue_after is None


# A Failed machine with `false` or nothing: the machine plan does nothing (MCM or the budget decide)
@pytest.mark.parametrize("value", ["false", "", ABSENT])
def test_unpreserved_failed_machine_without_request_is_left_alone(value: object) -> None:
    assert plan(machine(phase=FAILED, preserve=value), node()) == MachinePlan()


# A `now`-preserved Running machine fails: expiry kept, tainted and drained
def test_preserved_machine_that_fails_is_drained_with_the_original_expiry() -> None:
    result = plan(
        machine(phase=FAILED, preserve="now", expiry=KEPT, **steady_priority()), node(**preserved_running_node())
    )
    assert write_kinds(result) == ["PatchNodeAnnotations", "SetPreservedTaint", "DrainNode", "SetPreservedCondition"]
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(set={v.PRESERVED_DRAIN_ANNOTATION: "draining"})
    assert only(result, SetPreservedCondition).message == f"Preserved node is being drained. {PRESERVED_UNTIL_KEPT}"
    assert only(result, DrainNode).expiry == KEPT
    assert result.requeue_after == 5 * HOUR


# A `now` machine recovers: taint removed, condition back to "Machine preserved until"
def test_now_machine_recovered_stays_preserved_untainted_and_ready_to_drain_again() -> None:
    drained = preserved_condition(message=DRAINED_KEPT)
    m = machine(
        phase=RUNNING,
        preserve="now",
        expiry=KEPT,
        drain=DrainRecord(outcome=v.DrainOutcome.DRAINED),
        **steady_priority(),
    )
    fields = {**KEPT_FIELDS, v.PRESERVED_DRAIN_ANNOTATION: "drained"}
    n = node(ca="true", ca_marker="true", tainted=True, condition=drained, fields=fields)
    result = plan(m, n)
    assert write_kinds(result) == [
        "PatchMachineAnnotations",
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "SetPreservedCondition",
    ]
    # The Node no longer tells about a drain: there is none while the machine runs.
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(remove=(v.PRESERVED_DRAIN_ANNOTATION,))
    # the drain record belongs to the failure that ended
    assert only(result, PatchMachineAnnotations) == PatchMachineAnnotations(remove=(v.PRESERVED_DRAIN_ANNOTATION,))
    assert not only(result, SetPreservedTaint).present
    condition = only(result, SetPreservedCondition)
    assert (condition.status, condition.message) == ("True", PRESERVED_UNTIL_KEPT)
    assert condition.last_transition_time == NOW - 10 * HOUR  # status unchanged: transition time kept

    # ... and fails again before expiry: tainted and drained again (upstream MCM would not)
    m, n = execute(m, n, result)
    again = plan(with_phase(m, FAILED), n)
    assert write_kinds(again) == ["PatchNodeAnnotations", "SetPreservedTaint", "DrainNode", "SetPreservedCondition"]
    assert only(again, PatchNodeAnnotations) == PatchNodeAnnotations(set={v.PRESERVED_DRAIN_ANNOTATION: "draining"})


# A `when-failed` machine recovers: stop, annotation kept
def test_when_failed_machine_recovered_stops_and_keeps_its_annotation() -> None:
    m = machine(phase=RUNNING, preserve="when-failed", expiry=KEPT, added_ca=True, **steady_priority())
    n = node(ca="true", ca_marker="true", tainted=True, condition=preserved_condition(message=DRAINED_KEPT))
    result = plan(m, n)
    assert write_kinds(result) == [
        "PatchMachineAnnotations",
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "SetPreservedCondition",
        "PatchMachineAnnotations",
    ]
    first, last = machine_patches(result)
    assert first == PatchMachineAnnotations(remove=(v.MACHINE_PRIORITY_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION))
    # last: until the record goes, an interrupted stop is finished rather than taken for "not preserved"
    assert last == PatchMachineAnnotations(remove=(*RECORD_REMOVED.remove, v.PRESERVED_ADDED_CA_ANNOTATION))
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(
        remove=(v.CA_SCALE_DOWN_DISABLED_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION)
    )
    assert only(result, SetPreservedCondition) == SetPreservedCondition(
        status="False", reason="Preservation stopped.", message="", last_transition_time=NOW
    )
    assert event_reasons(result) == STOPPED
    assert result.requeue_after is None


def test_recovered_when_failed_machine_clears_the_mirror_just_before_the_record() -> None:
    m = machine(phase=RUNNING, preserve="when-failed", expiry=KEPT, mirrored=KEPT, **steady_priority())
    result = plan(m, node(**preserved_running_node()), config=MIRROR)
    assert write_kinds(result)[-2:] == ["SetPreserveExpiry", "PatchMachineAnnotations"]
    assert only(result, SetPreserveExpiry).expiry is None
    assert writes(result)[-1] == RECORD_REMOVED
    # nothing mirrored (a v0.61 CRD pruned it): nothing to clear
    unmirrored = plan(machine(phase=RUNNING, preserve="when-failed", expiry=KEPT), node(), config=MIRROR)
    assert of_type(unmirrored, SetPreserveExpiry) == []


# An auto-preserved machine recovers: stop and the auto value goes
def test_auto_preserved_machine_recovered_stops_and_loses_the_auto_value() -> None:
    m = machine(phase=RUNNING, preserve="auto-preserved", expiry=KEPT, **steady_priority())
    result = plan(m, node(**preserved_running_node()))
    patch = machine_patches(result)[0]
    assert set(patch.remove) == {
        v.PRESERVE_ANNOTATION,
        v.MACHINE_PRIORITY_ANNOTATION,
        v.LAST_MACHINE_PRIORITY_ANNOTATION,
    }
    assert writes(result)[-1] == RECORD_REMOVED


# The annotation in control is removed: stop, nothing removed; a Failed machine is left to the budget/MCM
@pytest.mark.parametrize("phase", [RUNNING, FAILED])
def test_removed_node_annotation_stops_without_deleting(phase: str) -> None:
    m = machine(phase=phase, last_applied="now", expiry=KEPT, **ours())
    result = plan(m, node(**preserved_running_node(tainted=phase == FAILED)))
    patch = machine_patches(result)[0]
    assert patch.set == {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: ""}  # the node is no longer in control
    assert v.PRESERVE_ANNOTATION not in only(result, PatchNodeAnnotations).remove
    assert writes(result)[-1] == removal_of(m)
    assert of_type(result, DeleteMachine) == []
    assert event_reasons(result) == STOPPED


# `false`: stop, `false` stays; a Failed machine is deleted (the node cleaned up first)
def test_false_stops_and_a_failed_machine_is_deleted() -> None:
    m = machine(phase=FAILED, preserve="false", expiry=KEPT, **ours())
    n = node(**preserved_running_node(tainted=True))
    result = plan(m, n)
    assert write_kinds(result) == [
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "SetPreservedCondition",
        "DeleteMachine",
    ]
    assert "The Failed machine is deleted." in of_type(result, RecordEvent)[0].message
    # deleted with its record: a delete that fails (409) is retried, never mistaken for "not preserved"
    assert not removes_the_record(result)
    # Once deleting, nothing more to do (MCM's deletion flow owns it).
    m, n = execute(m, n, result)
    assert plan(m, n) == MachinePlan()


def test_false_on_a_running_machine_stops_without_deleting() -> None:
    result = plan(machine(preserve="false", expiry=KEPT, **steady_priority()), node(**preserved_running_node()))
    assert writes(result)[-1] == RECORD_REMOVED
    assert event_reasons(result) == STOPPED
    assert 'preserve value is "false"' in of_type(result, RecordEvent)[0].message


# Expiry reached: stop and remove the annotations everywhere, so it is not preserved again;
# a Failed machine is deleted instead, its annotations left in place until it is gone
@pytest.mark.parametrize("value", ["now", "when-failed", "auto-preserve"])
def test_expiry_on_failed_machine_cleans_the_node_and_deletes_it(value: str) -> None:
    m = machine(phase=FAILED, preserve=value, expiry=NOW, **ours())
    result = plan(m, node(**preserved_running_node(tainted=True)))
    assert write_kinds(result) == [
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "SetPreservedCondition",
        "DeleteMachine",
    ]
    assert event_reasons(result) == EXPIRED


@pytest.mark.parametrize("done", [0, 1, 2, 3])
def test_a_crash_or_conflict_before_the_delete_leaves_the_same_decision(done: int) -> None:
    m = machine(phase=FAILED, preserve="now", expiry=NOW, added_ca=True, **steady_priority())
    n = node(**preserved_running_node(tainted=True))
    partial = MachinePlan(steps=plan(m, n).steps[:done])
    m, after = execute(m, n, partial)
    again = plan(m, after)
    assert write_kinds(again)[-1] == "DeleteMachine"
    assert record_written(again) == {}, "never a new preservation"


def test_expiry_of_node_annotation_removes_it_on_node_and_machine_before_removing_the_record() -> None:
    m = machine(preserve="now", last_applied="now", expiry=NOW - HOUR, **steady_priority())
    result = plan(m, node(preserve="now", **preserved_running_node()))
    steps = writes(result)
    machine_patch, node_patch = machine_patches(result)[0], only(result, PatchNodeAnnotations)
    assert {v.PRESERVE_ANNOTATION, v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION} <= set(machine_patch.remove)
    assert v.PRESERVE_ANNOTATION in node_patch.remove
    assert steps.index(machine_patch) < steps.index(node_patch)
    assert steps[-1] == RECORD_REMOVED


# `false` or nothing when the expiry passes: stop without removing annotations
def test_expired_false_stops_without_removing_annotations() -> None:
    result = plan(machine(preserve="false", expiry=NOW - HOUR, **steady_priority()), node(**preserved_running_node()))
    assert v.PRESERVE_ANNOTATION not in machine_patches(result)[0].remove
    assert event_reasons(result) == STOPPED


# A machine being deleted (or Terminating) is MCM's
@pytest.mark.parametrize("m", [machine(preserve="now", deleting=True), machine(preserve="now", phase="Terminating")])
def test_deleted_machine_gets_no_plan(m: object) -> None:
    assert plan(m, node(tainted=True)) == MachinePlan()  # type: ignore[arg-type]


# The node label names a node that does not exist: the machine's value, expiry only
def test_missing_node_uses_machine_value_and_sets_only_the_record() -> None:
    result = plan(machine(phase=FAILED, preserve="now"), NoNode.NOT_FOUND)
    assert write_kinds(result) == START
    gone = dataclasses.replace(STARTED_RECORD, added_ca_annotation=False, node_gone_since=NOW)
    assert record_written(result) == announcing(gone)
    assert 'Node "n1" not found' in of_type(result, RecordEvent)[0].message
    assert event_reasons(result)[-1] == ("Machine", v.EventReason.PRESERVED_NODE_GONE)


def test_with_the_node_gone_the_machines_own_value_counts() -> None:
    # Nobody can annotate a Node that is gone: a user's value on the machine takes over from the node's.
    result = plan(machine(phase=FAILED, preserve="now", last_applied="false"), NoNode.NOT_FOUND)
    assert record_written(result)[v.PRESERVED_BY_ANNOTATION] == "user"
    assert v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION in machine_patches(result)[0].remove
    released = machine(phase=FAILED, preserve="false", last_applied="now", expiry=KEPT, node_gone_since=NOW, **ours())
    assert any(isinstance(w, DeleteMachine) for w in writes(plan(released, NoNode.NOT_FOUND)))


def test_a_gone_nodes_recorded_false_still_wins_over_no_word() -> None:
    result = plan(machine(phase=FAILED, last_applied="false"), NoNode.NOT_FOUND)
    assert record_written(result) == {}


# The Node of a preserved machine is deleted (a person, a cloud-controller-manager): the machine stays preserved
# by the value the Node carried, nothing is written to the Node, and the record says since when it is gone.
@pytest.mark.parametrize(
    ("phase", "value"), [(RUNNING, "now"), (UNKNOWN, "now"), (FAILED, "now"), (FAILED, "when-failed")]
)
def test_a_preserved_machines_node_gone_keeps_the_preservation(phase: str, value: str) -> None:
    kept = machine(phase=phase, last_applied=value, expiry=KEPT, **ours())
    result = plan(kept, NoNode.NOT_FOUND)
    assert writes(result) == [
        PatchMachineAnnotations(set={v.PRESERVED_NODE_GONE_SINCE_ANNOTATION: "2026-08-20T10:00:00Z"})
    ]
    event = only(result, RecordEvent)
    assert (event.kind, event.type, event.reason) == ("Machine", "Warning", v.EventReason.PRESERVED_NODE_GONE)
    assert 'Node "n1" of the preserved machine is gone' in event.message
    assert "until 2026-08-20 15:00:00 +0000 UTC" in event.message
    assert f"{v.PRESERVE_ANNOTATION}=false" in event.message
    assert result.drain is None
    assert result.requeue_after == KEPT - NOW
    # Seen again (the marker written): nothing to write, nothing to say, and the expiry still wakes it.
    again = plan(machine(phase=phase, last_applied=value, expiry=KEPT, node_gone_since=NOW, **ours()), NoNode.NOT_FOUND)
    assert again.steps == ()
    assert again.requeue_after == KEPT - NOW


@pytest.mark.parametrize("phase", [PENDING, v.MachinePhase.CRASH_LOOP_BACK_OFF, ""])
def test_a_machine_being_created_has_no_node_gone_but_none_registered_yet(phase: str) -> None:
    result = plan(machine(phase=phase, preserve="now", expiry=KEPT, **steady_priority()), NoNode.NOT_FOUND)
    assert result.steps == ()


def test_a_preservation_whose_node_is_gone_ends_at_its_expiry() -> None:
    gone = machine(phase=FAILED, last_applied="now", expiry=NOW, node_gone_since=NOW - HOUR, **ours())
    result = plan(gone, NoNode.NOT_FOUND)
    assert writes(result) == [DeleteMachine()]
    assert [(e.kind, e.reason) for e in of_type(result, RecordEvent)] == [
        ("Machine", v.EventReason.PRESERVATION_EXPIRED)
    ]
    # MCM asked to delete the machine when its Node went: the end of the preservation completes that, in any phase.
    running = machine(phase=RUNNING, last_applied="now", expiry=NOW, node_gone_since=NOW - HOUR, **ours())
    stopped = plan(running, NoNode.NOT_FOUND)
    assert writes(stopped) == [DeleteMachine()]
    assert "The machine, whose Node is gone, is deleted." in only(stopped, RecordEvent).message
    # Releasing (the extension disabled) leaves it to MCM, as everything else.
    released = plan(running, NoNode.NOT_FOUND, released=True)
    assert DeleteMachine() not in writes(released)
    assert removal_of(running) in writes(released)


def test_a_node_that_comes_back_is_preserved_again_by_the_value_it_carried() -> None:
    # A new Node object of the same name (the VM registered again) carries no annotation of the user's.
    back = machine(phase=RUNNING, last_applied="now", expiry=KEPT, node_gone_since=NOW - HOUR, **ours())
    result = plan(back, node())
    assert write_kinds(result) == [
        "PatchNodeAnnotations",
        "PatchMachineAnnotations",
        "SetPreservedCondition",
    ]
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(
        set={**CA_SET, **KEPT_FIELDS, v.PRESERVE_ANNOTATION: "now"}
    )
    assert machine_patches(result) == [PatchMachineAnnotations(remove=(v.PRESERVED_NODE_GONE_SINCE_ANNOTATION,))]
    assert event_reasons(result) == [
        ("Machine", v.EventReason.PRESERVED_NODE_RETURNED),
        ("Node", v.EventReason.PRESERVED_NODE_RETURNED),
    ]
    # Executed, the machine and its node are where any preserved machine is: nothing more to write.
    m, n = execute(back, node(), result)
    assert writes(plan(m, n)) == []


def test_a_failed_machines_node_that_comes_back_is_tainted_and_drained() -> None:
    back = machine(phase=FAILED, last_applied="when-failed", expiry=KEPT, node_gone_since=NOW - HOUR, **ours())
    result = plan(back, node())
    assert write_kinds(result)[:3] == ["PatchNodeAnnotations", "SetPreservedTaint", "PatchMachineAnnotations"]
    assert result.drain is not None
    assert result.drain.record is not None
    assert result.drain.record.node_gone_since is None


def test_a_node_that_comes_back_saying_false_releases_the_machine() -> None:
    back = machine(phase=FAILED, last_applied="now", expiry=KEPT, node_gone_since=NOW - HOUR, **ours())
    result = plan(back, node(preserve="false"))
    assert any(isinstance(w, DeleteMachine) for w in writes(result))
    assert event_reasons(result)[-2:] == STOPPED


def test_missing_node_stop_removes_the_preserve_annotation_then_the_record() -> None:
    result = plan(machine(preserve="now", expiry=NOW - HOUR), NoNode.NOT_FOUND)
    assert writes(result) == [PatchMachineAnnotations(remove=(v.PRESERVE_ANNOTATION,)), RECORD_REMOVED]


def test_a_node_not_found_needs_a_node_label_naming_it() -> None:
    with pytest.raises(ValueError, match="node label naming a Node"):
        plan(machine(node="", preserve="now"), NoNode.NOT_FOUND)


# No node label: only the record is written and removed
def test_no_node_label_stop_only_removes_the_record() -> None:
    result = plan(machine(node="", preserve="false", expiry=KEPT))
    assert writes(result) == [RECORD_REMOVED]
    mirrored = plan(machine(node="", preserve="false", expiry=KEPT, mirrored=KEPT), config=MIRROR)
    assert writes(mirrored) == [SetPreserveExpiry(expiry=None), RECORD_REMOVED]


# Node `""` = no preference, invalid = absent + Warning (upstream MCM stops acting on the machine instead)
def test_empty_node_value_overrides_the_machine_and_stops() -> None:
    m = machine(preserve="now", expiry=KEPT, **steady_priority())
    result = plan(m, node(preserve="", **preserved_running_node()))
    assert writes(result)[-1] == RECORD_REMOVED
    assert v.PRESERVE_ANNOTATION in machine_patches(result)[0].remove  # the node decides


def test_invalid_node_value_is_ignored_and_reported_once() -> None:
    m = machine(preserve="now", expiry=KEPT, **steady_priority())
    n = node(preserve="yes", **preserved_running_node())
    result = plan(m, n)
    assert not removes_the_record(result)  # the machine's `now` still counts
    assert writes(result) == [
        PatchMachineAnnotations(set={v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION: '[["Node","yes"]]'})
    ]
    warning = only(result, RecordEvent)
    assert (warning.kind, warning.name, warning.type, warning.reason) == (
        "Node",
        "n1",
        "Warning",
        "InvalidPreserveValue",
    )
    assert '"yes"' in warning.message
    assert '"now", "when-failed", "false"' in warning.message
    m, n = execute(m, n, result)
    assert plan(m, n).steps == ()  # reported: no repeat


# Invalid or empty value on the machine, node not in control: treated as unannotated
@pytest.mark.parametrize("value", ["", "yes"])
def test_empty_or_invalid_machine_value_stops_preservation(value: str) -> None:
    result = plan(machine(preserve=value, expiry=KEPT, **steady_priority()), node(**preserved_running_node()))
    assert writes(result)[-1] == RECORD_REMOVED
    patch = machine_patches(result)[0]
    assert v.PRESERVE_ANNOTATION not in patch.remove  # left in place (reported if invalid)
    assert (v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION in patch.set) == (value == "yes")


# A preserved Failed machine whose node is healthy again is moved to Running by us
def test_recovery_moves_the_phase_then_plans_for_running() -> None:
    m = machine(phase=FAILED, preserve="when-failed", expiry=KEPT, **steady_priority())
    n = node(
        ready="True", tainted=True, ca="true", ca_marker="true", condition=preserved_condition(message=DRAINED_KEPT)
    )
    result = plan(m, n)
    assert writes(result)[0] == SetMachinePhase(phase=RUNNING)
    assert event_reasons(result)[:2] == [
        ("Machine", v.EventReason.MACHINE_RECOVERED),
        ("Node", v.EventReason.MACHINE_RECOVERED),
    ]
    assert writes(result)[-1] == RECORD_REMOVED  # when-failed stops on recovery
    assert of_type(result, DeleteMachine) == []


@pytest.mark.parametrize(
    "n",
    [
        node(ready="False"),
        node(ready="Unknown"),
        node(ready="True", extra_conditions=({"type": "ReadonlyFilesystem", "status": "True"},)),
        node(ready="True", extra_conditions=({"type": "DiskPressure", "status": "True"},)),
    ],
)
def test_no_recovery_while_the_node_is_unhealthy(n: object) -> None:
    result = plan(machine(phase=FAILED, preserve="now", expiry=KEPT), n)  # type: ignore[arg-type]
    assert of_type(result, SetMachinePhase) == []


def test_no_recovery_for_machines_we_do_not_preserve() -> None:
    assert of_type(plan(machine(phase=FAILED, preserve="false"), node(ready="True")), SetMachinePhase) == []


def test_recovery_before_expiry_stop_keeps_a_healthy_machine() -> None:
    result = plan(machine(phase=FAILED, preserve="now", expiry=NOW - HOUR), node(ready="True"))
    assert writes(result)[0] == SetMachinePhase(phase=RUNNING)
    assert of_type(result, DeleteMachine) == []
    assert writes(result)[-1] == RECORD_REMOVED


def test_failed_machine_about_to_be_preserved_whose_node_is_healthy_is_recovered_first() -> None:
    result = plan(machine(phase=FAILED, preserve="now"), node(ready="True"))
    assert write_kinds(result) == [
        "SetMachinePhase",
        RECORD,
        "PatchNodeAnnotations",
        "SetPreservedCondition",
        ACKNOWLEDGED,
    ]  # preserved as Running: no taint, no drain
    assert record_written(result) == announcing(STARTED_RECORD)


def test_start_event_names_the_value_and_where_it_came_from() -> None:
    result = plan(machine(), node(preserve="now"))
    assert of_type(result, RecordEvent)[0].message == (
        'Machine preserved until 2026-08-23 10:00:00 +0000 UTC (preserve value "now" from the node).'
    )


# Old × new value, as a user observes it; the plan is memoryless, so "old" matters only through "preserved".
def outcome(result: MachinePlan) -> str:
    if of_type(result, DeleteMachine):
        return "stop+delete"
    if v.PRESERVED_SINCE_ANNOTATION in record_written(result):
        return "start"
    if removes_the_record(result):
        return "stop"
    return "keep-or-nothing"


@pytest.mark.parametrize(
    ("old", "new", "phase", "expected"),
    [
        ("none", "now", RUNNING, "start"),
        ("none", "now", FAILED, "start"),
        ("none", "when-failed", RUNNING, "keep-or-nothing"),
        ("none", "when-failed", FAILED, "start"),
        ("none", "auto-preserve", FAILED, "start"),
        ("none", "false", FAILED, "keep-or-nothing"),  # MCM replaces it
        ("now", "when-failed", RUNNING, "stop"),
        ("now", "when-failed", FAILED, "keep-or-nothing"),
        ("now", "auto-preserve", RUNNING, "stop"),
        ("now", "auto-preserve", FAILED, "keep-or-nothing"),
        ("now", "false", RUNNING, "stop"),
        ("now", "false", FAILED, "stop+delete"),
        ("now", ABSENT, RUNNING, "stop"),
        ("now", ABSENT, FAILED, "stop"),  # left to auto-preservation or MCM
        ("when-failed", "now", FAILED, "keep-or-nothing"),
        ("when-failed", "auto-preserve", FAILED, "keep-or-nothing"),
        ("when-failed", "false", FAILED, "stop+delete"),
        ("auto-preserve", "now", FAILED, "keep-or-nothing"),
        ("auto-preserve", "when-failed", FAILED, "keep-or-nothing"),
        ("auto-preserve", "false", FAILED, "stop+delete"),
        ("auto-preserve", ABSENT, FAILED, "stop"),
        ("false", "now", RUNNING, "start"),
        ("false", "when-failed", FAILED, "start"),
        ("false", ABSENT, FAILED, "keep-or-nothing"),
    ],
)
def test_a_value_change_acts_on_the_new_value_and_whether_preserved(
    old: object, new: object, phase: str, expected: str
) -> None:
    preserved = old != "none" and (old == "now" or (phase == FAILED and old != "false"))
    m = machine(phase=phase, preserve=new, expiry=KEPT if preserved else None)
    assert outcome(plan(m, node())) == expected


# Gardener's Worker restore re-creates a migrated shoot's Machines with their annotations (the record predates the
# object) and without status: until MCM has placed a machine again, its preservation waits as it is.
@pytest.mark.parametrize("phase", ["", PENDING, UNKNOWN])
@pytest.mark.parametrize("value", ["when-failed", "now"])
def test_a_restored_preservation_waits_until_mcm_has_placed_the_machine(phase: str, value: str) -> None:
    restored = machine(
        phase=phase,
        last_applied=value,
        expiry=KEPT,
        created=NOW - HOUR,
        since=NOW - 2 * HOUR,
        drain=DrainRecord(outcome=v.DrainOutcome.DRAINED),
        **ours(),
    )
    result = plan(restored, node(tainted=True, preserve=value, **preserved_running_node()))
    assert result.steps == ()
    assert result.drain is None
    assert result.requeue_after == KEPT - NOW


@pytest.mark.parametrize("phase", ["", PENDING, UNKNOWN])
def test_a_preservation_restored_within_the_second_it_started_waits_too(phase: str) -> None:
    # Preserved, migrated and re-created within one second (the e2e migration on a busy machine): the record's start
    # and the object's creation are the same whole second, and the record may well predate the object.
    restored = machine(
        phase=phase,
        last_applied="when-failed",
        expiry=KEPT,
        created=NOW - HOUR,
        since=NOW - HOUR,
        drain=DrainRecord(outcome=v.DrainOutcome.DRAINED),
        **ours(),
    )
    result = plan(restored, node(tainted=True, preserve="when-failed", **preserved_running_node()))
    assert not removes_the_record(result)
    assert result.steps == ()
    assert result.requeue_after == KEPT - NOW


def test_a_restored_machine_mcm_finds_failed_again_stays_preserved_as_it_was() -> None:
    restored = machine(
        phase=FAILED,
        last_applied="when-failed",
        expiry=KEPT,
        created=NOW - HOUR,
        since=NOW - 2 * HOUR,
        drain=DrainRecord(outcome=v.DrainOutcome.DRAINED),
        **ours(),
    )
    drained = preserved_condition(message=f"Preserved node drained successfully. {PRESERVED_UNTIL_KEPT}")
    fields = {
        v.PRESERVED_SINCE_ANNOTATION: format_timestamp(NOW - 2 * HOUR),
        v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(KEPT),
        v.PRESERVED_BY_ANNOTATION: "user",
        v.PRESERVED_DRAIN_ANNOTATION: "drained",
    }
    n = node(tainted=True, preserve="when-failed", ca="true", ca_marker="true", condition=drained, fields=fields)
    result = plan(restored, n)
    assert writes(result) == []
    assert not removes_the_record(result)


def test_a_restored_machine_found_healthy_is_planned_as_any_machine() -> None:
    # Running: MCM has placed it; a `when-failed` preservation then ends as on any recovery.
    restored = machine(
        phase=RUNNING, last_applied="when-failed", expiry=KEPT, created=NOW - HOUR, since=NOW - 2 * HOUR, **ours()
    )
    assert removes_the_record(plan(restored, node(preserve="when-failed", **preserved_running_node())))


def test_a_machine_preserved_after_it_was_created_does_not_wait() -> None:
    unknown = machine(
        phase=UNKNOWN, last_applied="when-failed", expiry=KEPT, created=NOW - 3 * HOUR, since=NOW - 2 * HOUR, **ours()
    )
    assert removes_the_record(plan(unknown, node(preserve="when-failed", **preserved_running_node())))


def test_releasing_does_not_wait_for_a_restored_machine() -> None:
    restored = machine(phase="", last_applied="now", expiry=KEPT, created=NOW - HOUR, since=NOW - 2 * HOUR, **ours())
    assert removes_the_record(plan(restored, node(preserve="now", **preserved_running_node()), released=True))
