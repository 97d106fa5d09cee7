"""The machine plan for every transition of reference §4.2 (numbered as there), as DESIGN.md §3 adapts them."""

from __future__ import annotations

import datetime as dt

import pytest

from machine_preservation.core import vocabulary as v
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
CA_SET = {v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true", v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true"}
STARTED = [("Machine", v.EventReason.PRESERVATION_STARTED), ("Node", v.EventReason.PRESERVATION_STARTED)]
STOPPED = [("Machine", v.EventReason.PRESERVATION_STOPPED), ("Node", v.EventReason.PRESERVATION_STOPPED)]
EXPIRED = [("Machine", v.EventReason.PRESERVATION_EXPIRED), ("Node", v.EventReason.PRESERVATION_EXPIRED)]


PRESERVED_UNTIL_T = "Machine preserved until 2026-08-23 10:00:00 +0000 UTC."
PRESERVED_UNTIL_KEPT = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
DRAINED_KEPT = f"Preserved node drained successfully. {PRESERVED_UNTIL_KEPT}"


def preserved_running_node(**kwargs: object) -> dict[str, object]:
    """A node as a Running machine preserved until KEPT leaves it."""
    return {"ca": "true", "ca_marker": "true", "condition": preserved_condition(message=PRESERVED_UNTIL_KEPT), **kwargs}


def steady_priority() -> dict[str, object]:
    return {"priority": "5", "last_priority": ""}


# 1, 2: effective `now` on a machine that is not Failed
@pytest.mark.parametrize("phase", [RUNNING, UNKNOWN, PENDING, v.MachinePhase.CRASH_LOOP_BACK_OFF, ""])
def test_1_2_now_preserves_any_phase_without_taint_or_drain(phase: str) -> None:
    result = plan(machine(phase=phase, preserve="now"), node(unschedulable=True))
    assert write_kinds(result) == [
        "SetPreserveExpiry",
        "PatchMachineAnnotations",
        "PatchNodeAnnotations",
        "SetPreservedCondition",
    ]
    assert only(result, SetPreserveExpiry).expiry == T
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(set=CA_SET)
    assert only(result, SetPreservedCondition) == SetPreservedCondition(
        status="True", reason="Preserved by user.", message=PRESERVED_UNTIL_T, last_transition_time=NOW
    )
    assert event_reasons(result) == STARTED
    assert result.requeue_after == 72 * HOUR


def test_1_now_on_the_node_syncs_the_machine_annotations() -> None:
    result = plan(machine(preserve="when-failed"), node(preserve="now"))
    patch = only(result, PatchMachineAnnotations)
    assert patch.remove == (v.PRESERVE_ANNOTATION,)
    assert patch.set[v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION] == "now"


def test_2_without_a_node_label_only_the_expiry_and_the_priority() -> None:
    result = plan(machine(node="", preserve="now"))
    assert write_kinds(result) == ["SetPreserveExpiry", "PatchMachineAnnotations"]
    assert event_reasons(result) == [("Machine", v.EventReason.PRESERVATION_STARTED)]
    assert "no node: only the expiry" in of_type(result, RecordEvent)[0].message


# 3, 5, 6: a Failed machine that asks for preservation: expiry, CA annotation, taint, then the drain
@pytest.mark.parametrize(
    ("value", "reason"),
    [("now", "Preserved by user."), ("when-failed", "Preserved by user."), ("auto-preserve", "Preserved by MCM.")],
)
def test_3_5_6_failed_machine_is_preserved_tainted_and_drained(value: str, reason: str) -> None:
    result = plan(machine(phase=FAILED, preserve=value, drain_timeout="30m"), node())
    assert write_kinds(result) == [
        "SetPreserveExpiry",
        "PatchMachineAnnotations",
        "PatchNodeAnnotations",
        "SetPreservedTaint",
        "DrainNode",
    ]
    assert only(result, SetPreservedTaint).present
    assert only(result, DrainNode) == DrainNode(reason=reason, expiry=T, timeout=dt.timedelta(minutes=30))


def test_drain_timeout_falls_back_to_the_config_for_bad_values() -> None:
    for text in (None, "soon", "0s", "-5m"):
        drain = only(plan(machine(phase=FAILED, preserve="now", drain_timeout=text), node()), DrainNode)
        assert drain.timeout == CONFIG.drain_timeout


# 4: `when-failed` on a Running machine: only the node-value sync
def test_4_when_failed_on_running_machine_changes_nothing_but_the_sync() -> None:
    assert plan(machine(preserve="when-failed"), node()) == MachinePlan()
    result = plan(machine(), node(preserve="when-failed"))
    assert writes(result) == [PatchMachineAnnotations(set={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "when-failed"})]
    assert result.requeue_after is None


# 7: a Failed machine with `false` or nothing: the machine plan does nothing (MCM or the budget decide)
@pytest.mark.parametrize("value", ["false", "", ABSENT])
def test_7_unpreserved_failed_machine_without_request_is_left_alone(value: object) -> None:
    assert plan(machine(phase=FAILED, preserve=value), node()) == MachinePlan()


# 8: a `now`-preserved Running machine fails: expiry kept, tainted and drained
def test_8_preserved_machine_that_fails_is_drained_with_the_original_expiry() -> None:
    result = plan(
        machine(phase=FAILED, preserve="now", expiry=KEPT, **steady_priority()), node(**preserved_running_node())
    )
    assert write_kinds(result) == ["SetPreservedTaint", "DrainNode"]
    assert only(result, DrainNode).expiry == KEPT
    assert result.requeue_after == 5 * HOUR


# 9 (and quirk Q3): a `now` machine recovers: taint removed, condition back to "Machine preserved until"
def test_9_now_machine_recovered_stays_preserved_untainted_and_ready_to_drain_again() -> None:
    drained = preserved_condition(message=DRAINED_KEPT)
    m = machine(phase=RUNNING, preserve="now", expiry=KEPT, **steady_priority())
    n = node(ca="true", ca_marker="true", tainted=True, condition=drained)
    result = plan(m, n)
    assert write_kinds(result) == ["SetPreservedTaint", "SetPreservedCondition"]
    assert not only(result, SetPreservedTaint).present
    condition = only(result, SetPreservedCondition)
    assert (condition.status, condition.message) == ("True", PRESERVED_UNTIL_KEPT)
    assert condition.last_transition_time == NOW - 10 * HOUR  # status unchanged: transition time kept

    # ... and fails again before expiry: tainted and drained again (upstream would not, Q3)
    m, n = execute(m, n, result)
    assert write_kinds(plan(with_phase(m, FAILED), n)) == ["SetPreservedTaint", "DrainNode"]


# 10: `when-failed` machine recovers: stop, annotation kept
def test_10_when_failed_machine_recovered_stops_and_keeps_its_annotation() -> None:
    m = machine(phase=RUNNING, preserve="when-failed", expiry=KEPT, **steady_priority())
    n = node(ca="true", ca_marker="true", tainted=True, condition=preserved_condition(message=DRAINED_KEPT))
    result = plan(m, n)
    assert write_kinds(result) == [
        "PatchMachineAnnotations",
        "PatchNodeAnnotations",
        "SetPreservedCondition",
        "SetPreservedTaint",
        "SetPreserveExpiry",
    ]
    assert only(result, PatchMachineAnnotations) == PatchMachineAnnotations(
        remove=(v.MACHINE_PRIORITY_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION)
    )
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(
        remove=(v.CA_SCALE_DOWN_DISABLED_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION)
    )
    assert only(result, SetPreservedCondition) == SetPreservedCondition(
        status="False", reason="Preservation stopped.", message="", last_transition_time=NOW
    )
    assert only(result, SetPreserveExpiry).expiry is None
    assert event_reasons(result) == STOPPED
    assert result.requeue_after is None


# 11: auto-preserved machine recovers: stop and the auto value goes
def test_11_auto_preserved_machine_recovered_stops_and_loses_the_auto_value() -> None:
    m = machine(phase=RUNNING, preserve="auto-preserved", expiry=KEPT, **steady_priority())
    result = plan(m, node(**preserved_running_node()))
    patch = only(result, PatchMachineAnnotations)
    assert set(patch.remove) == {
        v.PRESERVE_ANNOTATION,
        v.MACHINE_PRIORITY_ANNOTATION,
        v.LAST_MACHINE_PRIORITY_ANNOTATION,
    }
    assert write_kinds(result)[-1] == "SetPreserveExpiry"


# 12: the annotation in control is removed: stop, nothing removed; a Failed machine is left to the budget/MCM
@pytest.mark.parametrize("phase", [RUNNING, FAILED])
def test_12_removed_node_annotation_stops_without_deleting(phase: str) -> None:
    m = machine(phase=phase, last_applied="now", expiry=KEPT, **steady_priority())
    result = plan(m, node(**preserved_running_node(tainted=phase == FAILED)))
    patch = only(result, PatchMachineAnnotations)
    assert patch.set == {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: ""}  # the node is no longer in control
    assert v.PRESERVE_ANNOTATION not in only(result, PatchNodeAnnotations).remove
    assert only(result, SetPreserveExpiry).expiry is None
    assert of_type(result, DeleteMachine) == []
    assert event_reasons(result) == STOPPED


# 13: `false`: stop, `false` stays; a Failed machine is deleted (the node cleaned up first)
def test_13_false_stops_and_a_failed_machine_is_deleted() -> None:
    m = machine(phase=FAILED, preserve="false", expiry=KEPT, **steady_priority())
    n = node(**preserved_running_node(tainted=True))
    result = plan(m, n)
    assert write_kinds(result) == [
        "PatchNodeAnnotations",
        "SetPreservedCondition",
        "SetPreservedTaint",
        "DeleteMachine",
    ]
    assert "The Failed machine is deleted." in of_type(result, RecordEvent)[0].message
    # Once deleting, nothing more to do (MCM's deletion flow owns it).
    m, n = execute(m, n, result)
    assert plan(m, n) == MachinePlan()


def test_13_false_on_a_running_machine_stops_without_deleting() -> None:
    result = plan(machine(preserve="false", expiry=KEPT, **steady_priority()), node(**preserved_running_node()))
    assert write_kinds(result)[-1] == "SetPreserveExpiry"
    assert event_reasons(result) == STOPPED
    assert 'preserve value is "false"' in of_type(result, RecordEvent)[0].message


# 14: expiry reached: stop and remove the annotations everywhere, so it is not preserved again;
# a Failed machine is deleted instead, its annotations left in place until it is gone
@pytest.mark.parametrize("value", ["now", "when-failed", "auto-preserve"])
def test_14_expiry_on_failed_machine_cleans_the_node_and_deletes_it(value: str) -> None:
    m = machine(phase=FAILED, preserve=value, expiry=NOW, **steady_priority())
    result = plan(m, node(**preserved_running_node(tainted=True)))
    assert write_kinds(result) == [
        "PatchNodeAnnotations",
        "SetPreservedCondition",
        "SetPreservedTaint",
        "DeleteMachine",
    ]
    assert event_reasons(result) == EXPIRED


def test_14_a_crash_before_the_delete_leaves_the_same_decision() -> None:
    m, n = machine(phase=FAILED, preserve="now", expiry=NOW, **steady_priority()), node(**preserved_running_node())
    partial = MachinePlan(steps=plan(m, n).steps[:2])
    m, n = execute(m, n, partial)
    assert write_kinds(plan(m, n)) == ["DeleteMachine"]


def test_14_expiry_of_node_annotation_removes_it_on_node_and_machine_before_clearing_the_expiry() -> None:
    m = machine(preserve="now", last_applied="now", expiry=NOW - HOUR, **steady_priority())
    result = plan(m, node(preserve="now", **preserved_running_node()))
    steps = writes(result)
    machine_patch, node_patch = only(result, PatchMachineAnnotations), only(result, PatchNodeAnnotations)
    assert {v.PRESERVE_ANNOTATION, v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION} <= set(machine_patch.remove)
    assert v.PRESERVE_ANNOTATION in node_patch.remove
    clear = only(result, SetPreserveExpiry)
    assert steps.index(machine_patch) < steps.index(clear)
    assert steps.index(node_patch) < steps.index(clear)
    assert steps[-1] == clear


# 15: `false` or nothing when the expiry passes: stop without removing annotations
def test_15_expired_false_stops_without_removing_annotations() -> None:
    result = plan(machine(preserve="false", expiry=NOW - HOUR, **steady_priority()), node(**preserved_running_node()))
    assert v.PRESERVE_ANNOTATION not in only(result, PatchMachineAnnotations).remove
    assert event_reasons(result) == STOPPED


# 16: a machine being deleted (or Terminating) is MCM's
@pytest.mark.parametrize("m", [machine(preserve="now", deleting=True), machine(preserve="now", phase="Terminating")])
def test_16_deleted_machine_gets_no_plan(m: object) -> None:
    assert plan(m, node(tainted=True)) == MachinePlan()  # type: ignore[arg-type]


# 17, 19: the node label names a node that does not exist: the machine's value, expiry only
def test_19_missing_node_uses_machine_value_and_sets_only_the_expiry() -> None:
    result = plan(machine(phase=FAILED, preserve="now", last_applied="false"), None, node_missing=True)
    assert write_kinds(result) == ["SetPreserveExpiry", "PatchMachineAnnotations"]
    assert 'Node "n1" not found' in of_type(result, RecordEvent)[0].message


def test_19_missing_node_stop_clears_expiry_and_removes_annotations_on_expiry() -> None:
    result = plan(machine(preserve="now", expiry=NOW - HOUR), None, node_missing=True)
    assert writes(result) == [PatchMachineAnnotations(remove=(v.PRESERVE_ANNOTATION,)), SetPreserveExpiry(expiry=None)]


def test_node_missing_must_describe_a_named_node_that_was_not_found() -> None:
    with pytest.raises(ValueError, match="node_missing"):
        plan(machine(preserve="now"), node(), node_missing=True)
    with pytest.raises(ValueError, match="node_missing"):
        plan(machine(node="", preserve="now"), None, node_missing=True)


# 20: no node label: only the expiry is set and cleared
def test_20_no_node_stop_only_clears_the_expiry() -> None:
    result = plan(machine(node="", preserve="false", expiry=KEPT))
    assert writes(result) == [SetPreserveExpiry(expiry=None)]


# 21 (DESIGN §3 instead of upstream's freeze): node `""` = no preference, invalid = absent + Warning
def test_21_empty_node_value_overrides_the_machine_and_stops() -> None:
    m = machine(preserve="now", expiry=KEPT, **steady_priority())
    result = plan(m, node(preserve="", **preserved_running_node()))
    assert only(result, SetPreserveExpiry).expiry is None
    assert v.PRESERVE_ANNOTATION in only(result, PatchMachineAnnotations).remove  # the node decides


def test_21_invalid_node_value_is_ignored_and_reported_once() -> None:
    m = machine(preserve="now", expiry=KEPT, **steady_priority())
    n = node(preserve="yes", **preserved_running_node())
    result = plan(m, n)
    assert of_type(result, SetPreserveExpiry) == []  # the machine's `now` still counts
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


# 22: invalid or empty value on the machine, node not in control: treated as unannotated
@pytest.mark.parametrize("value", ["", "yes"])
def test_22_empty_or_invalid_machine_value_stops_preservation(value: str) -> None:
    result = plan(machine(preserve=value, expiry=KEPT, **steady_priority()), node(**preserved_running_node()))
    assert only(result, SetPreserveExpiry).expiry is None
    patch = only(result, PatchMachineAnnotations)
    assert v.PRESERVE_ANNOTATION not in patch.remove  # left in place (reported if invalid)
    assert (v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION in patch.set) == (value == "yes")


# DESIGN §3: a preserved Failed machine whose node is healthy again is moved to Running by us
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
    assert only(result, SetPreserveExpiry).expiry is None  # when-failed stops on recovery
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
    assert only(result, SetPreserveExpiry).expiry is None


def test_failed_machine_about_to_be_preserved_whose_node_is_healthy_is_recovered_first() -> None:
    result = plan(machine(phase=FAILED, preserve="now"), node(ready="True"))
    assert write_kinds(result) == [
        "SetMachinePhase",
        "SetPreserveExpiry",
        "PatchMachineAnnotations",
        "PatchNodeAnnotations",
        "SetPreservedCondition",
    ]  # preserved as Running: no taint, no drain


def test_start_event_names_the_value_and_where_it_came_from() -> None:
    result = plan(machine(), node(preserve="now"))
    assert of_type(result, RecordEvent)[0].message == (
        'Machine preserved until 2026-08-23 10:00:00 +0000 UTC (preserve value "now" from the node).'
    )


# §5.4 old × new, as a user observes it; the plan is memoryless, so "old" matters only through "preserved".
def outcome(result: MachinePlan) -> str:
    expiry_steps = of_type(result, SetPreserveExpiry)
    if of_type(result, DeleteMachine):
        return "stop+delete"
    if expiry_steps and expiry_steps[0].expiry is not None:
        return "start"
    if expiry_steps:
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
def test_5_4_old_by_new(old: object, new: object, phase: str, expected: str) -> None:
    preserved = old != "none" and (old == "now" or (phase == FAILED and old != "false"))
    m = machine(phase=phase, preserve=new, expiry=KEPT if preserved else None)
    assert outcome(plan(m, node())) == expected
