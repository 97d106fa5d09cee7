"""The node side of the machine plan: CA annotation and marker, Preserved condition, taint, drain and retry."""

from __future__ import annotations

import datetime as dt

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import go_time_string
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.lifecycle import condition_after_drain, plan_after_drain
from machine_preservation.core.models import Machine
from machine_preservation.core.plan import (
    DrainNode,
    MachinePlan,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetPreservedCondition,
    SetPreservedTaint,
)
from machine_preservation.core.preservation_record import DrainRecord, format_timestamp

from .lifecycle_helpers import event_reasons, execute, of_type, only, plan, write_kinds, writes
from .plan_simulator import patched_annotations
from .preservation_objects import ABSENT, HOUR, NOW, machine, node, node_fields_of, preserved_condition, with_phase

FAILED, RUNNING = v.MachinePhase.FAILED, v.MachinePhase.RUNNING
KEPT = NOW + 5 * HOUR
UNTIL_KEPT = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
DRAINED = f"Preserved node drained successfully. {UNTIL_KEPT}"
NOT_DRAINED = f"Preserved node could not be drained. {UNTIL_KEPT}"
CA, MARKER = v.CA_SCALE_DOWN_DISABLED_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
MCM_MARKER = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
STEADY = {"priority": "5", "last_priority": ""}
MINUTE = dt.timedelta(minutes=1)
# The drain record of the current failure: the one place the drain's outcome is read from.
WAS_DRAINED = DrainRecord(outcome=v.DrainOutcome.DRAINED)


def failing(since: dt.datetime, last_attempt: dt.datetime) -> DrainRecord:
    return DrainRecord(outcome=v.DrainOutcome.FAILED, failing_since=since, last_attempt=last_attempt)


def preserved_machine(phase: str = RUNNING, value: str = "now", **kwargs: object) -> Machine:
    return machine(phase=phase, preserve=value, expiry=KEPT, **{**STEADY, **kwargs})


# --- CA annotation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ca", "marker", "mcm_marker", "expected"),
    [
        (ABSENT, ABSENT, ABSENT, PatchNodeAnnotations(set={CA: "true", MARKER: "true"})),
        ("false", ABSENT, ABSENT, PatchNodeAnnotations(set={CA: "true", MARKER: "true"})),  # user's value overwritten
        ("false", "true", ABSENT, PatchNodeAnnotations(set={CA: "true"})),  # drift re-asserted
        ("true", ABSENT, ABSENT, None),  # the user's own "true": no marker, so it survives the stop
        ("true", "true", ABSENT, None),
        # MCM's marker (its rollout's, or ours of an earlier version): taken over in one write, annotation kept.
        ("true", ABSENT, "true", PatchNodeAnnotations(set={MARKER: "true"}, remove=(MCM_MARKER,))),
        ("true", "true", "true", PatchNodeAnnotations(remove=(MCM_MARKER,))),
        (ABSENT, ABSENT, "true", PatchNodeAnnotations(set={CA: "true", MARKER: "true"}, remove=(MCM_MARKER,))),
    ],
)
def test_ca_annotation_while_preserved(
    ca: object, marker: object, mcm_marker: object, expected: PatchNodeAnnotations | None
) -> None:
    m = preserved_machine()
    condition = preserved_condition(message=UNTIL_KEPT)
    result = plan(
        m, node(ca=ca, ca_marker=marker, mcm_marker=mcm_marker, condition=condition, fields=node_fields_of(m))
    )
    assert of_type(result, PatchNodeAnnotations) == ([expected] if expected else [])
    if expected is not None:
        # The record says the annotation is ours before the node says so.
        patch = of_type(result, PatchMachineAnnotations)[0]
        assert patch.set[v.PRESERVED_ADDED_CA_ANNOTATION] == "true"
        assert result.steps.index(patch) < result.steps.index(expected)


@pytest.mark.parametrize(
    ("added_ca", "ca", "marker", "mcm_marker", "removed"),
    [
        (True, "true", "true", ABSENT, (CA, MARKER)),
        (True, "true", ABSENT, ABSENT, ()),  # not ours: never removed
        (True, "true", "false", ABSENT, ()),  # a marker that is not "true" does not make it ours
        (True, ABSENT, "true", ABSENT, (MARKER,)),  # only what is there
        (False, "true", "true", ABSENT, ()),  # the record does not say this preservation added it
        (True, "true", ABSENT, "true", (CA, MCM_MARKER)),  # our marker of an earlier version
        (True, "true", "true", "true", (CA, MARKER, MCM_MARKER)),  # a rollout marked it again meanwhile
        (False, "true", ABSENT, "true", ()),  # MCM's rollout annotation, never ours: left to MCM
    ],
)
def test_stop_removes_the_ca_annotation_only_with_our_marker(
    added_ca: bool, ca: object, marker: object, mcm_marker: object, removed: tuple[str, ...]
) -> None:
    m = machine(preserve="false", expiry=KEPT, added_ca=added_ca, **STEADY)
    n = node(ca=ca, ca_marker=marker, mcm_marker=mcm_marker, condition=preserved_condition(message=UNTIL_KEPT))
    patches = of_type(plan(m, n), PatchNodeAnnotations)
    assert patches == ([PatchNodeAnnotations(remove=removed)] if removed else [])


def test_unpreserved_machine_never_touches_a_rollout_ca_annotation() -> None:
    # MCM's rollout marks every node of the MachineDeployment: not ours to clean up.
    n = node(
        ca="true", mcm_marker="true", condition=preserved_condition(status="False", reason="Preservation stopped.")
    )
    assert plan(machine(preserve="when-failed"), n) == MachinePlan()


# --- Preserved condition ---------------------------------------------------------------------------------


def test_reason_follows_the_value_without_a_new_drain() -> None:
    # Upstream MCM keeps "Preserved by MCM." after a switch from auto to `now`.
    m = preserved_machine(FAILED, drain=WAS_DRAINED)
    condition = preserved_condition(reason="Preserved by MCM.", message=DRAINED)
    n = node(ca="true", tainted=True, condition=condition, fields=node_fields_of(m, "drained"))
    result = plan(m, n)
    assert writes(result) == [
        SetPreservedCondition(
            status="True", reason="Preserved by user.", message=DRAINED, last_transition_time=NOW - 10 * HOUR
        )
    ]


def test_an_edited_expiry_is_rendered_again_without_a_new_drain() -> None:
    later = KEPT + 24 * HOUR
    n = node(ca="true", tainted=True, condition=preserved_condition(message=DRAINED))
    result = plan(machine(phase=FAILED, preserve="now", expiry=later, drain=WAS_DRAINED, **STEADY), n)
    condition = only(result, SetPreservedCondition)
    assert (
        condition.message
        == "Preserved node drained successfully. Machine preserved until 2026-08-21 15:00:00 +0000 UTC."
    )
    assert of_type(result, DrainNode) == []
    assert result.requeue_after == later - NOW


def test_stop_sets_the_condition_to_stopped_and_never_creates_one() -> None:
    result = plan(machine(node="n1", preserve="false", expiry=KEPT), node())
    assert of_type(result, SetPreservedCondition) == []
    stopped = preserved_condition(status="False", reason="Preservation stopped.", transition=NOW - HOUR)
    assert of_type(plan(machine(preserve="false", expiry=KEPT), node(condition=stopped)), SetPreservedCondition) == []


def test_condition_transition_time_changes_only_with_the_status() -> None:
    n = node(condition=preserved_condition(status="False", message=NOT_DRAINED))
    result = plan(preserved_machine(), n)
    condition = only(result, SetPreservedCondition)
    assert (condition.status, condition.message, condition.last_transition_time) == ("True", UNTIL_KEPT, NOW)


# --- taint ---------------------------------------------------------------------------------------------


def test_taint_only_for_failed_and_other_taints_stay() -> None:
    m, n = preserved_machine(FAILED), node(ca="true")
    result = plan(m, n)
    assert only(result, SetPreservedTaint).present
    _, after = execute(m, n, result)
    assert after is not None
    assert [(t.key, t.effect) for t in after.spec.taints] == [
        ("other", "NoExecute"),
        (v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT),
    ]


def test_orphaned_taint_of_an_unpreserved_machine_is_removed() -> None:
    assert writes(plan(machine(phase=FAILED), node(tainted=True))) == [SetPreservedTaint(present=False)]


def test_unschedulable_is_never_touched_through_preserve_recovery_and_stop() -> None:
    m, n = machine(phase=FAILED, preserve="when-failed"), node(unschedulable=True)
    for phase in (FAILED, RUNNING):
        m = with_phase(m, phase)
        m, after = execute(m, n, plan(m, n))
        assert after is not None
        assert after.spec.unschedulable
        n = after
    assert m.preservation is None  # it did stop


# --- drain ---------------------------------------------------------------------------------------------


def test_drained_failed_machine_is_steady() -> None:
    m = preserved_machine(FAILED, drain=WAS_DRAINED)
    n = node(
        ca="true", tainted=True, condition=preserved_condition(message=DRAINED), fields=node_fields_of(m, "drained")
    )
    result = plan(m, n)
    assert result == MachinePlan(requeue_after=5 * HOUR)


def test_a_drained_message_without_a_drain_record_is_not_believed() -> None:
    # Messages are for people: only the record says the drain of this failure is done.
    m = preserved_machine(FAILED)
    n = node(
        ca="true", tainted=True, condition=preserved_condition(message=DRAINED), fields=node_fields_of(m, "drained")
    )
    result = plan(m, n)
    assert write_kinds(result) == ["PatchNodeAnnotations", "DrainNode", "SetPreservedCondition"]
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(set={v.PRESERVED_DRAIN_ANNOTATION: "draining"})
    assert only(result, SetPreservedCondition).message.startswith(v.DRAINING_MESSAGE)


def test_failed_drain_is_retried_after_the_interval_since_the_last_attempt() -> None:
    config = PreservationConfig(drain_retry_interval=2 * MINUTE)
    # The condition changed an hour ago: only the record's last attempt paces the retry.
    m = preserved_machine(FAILED, drain=failing(NOW - HOUR, NOW - MINUTE))
    fields = node_fields_of(m, "failed", pods_left="1")
    n = node(ca="true", tainted=True, condition=preserved_condition(status="False", message=NOT_DRAINED), fields=fields)
    waiting = plan(m, n, config=config)
    assert waiting == MachinePlan(requeue_after=MINUTE)
    due = plan(m, n, config=config, now=NOW + MINUTE)
    assert write_kinds(due) == ["DrainNode"], "a retry keeps the condition: it still names the blockers"
    assert only(due, DrainNode).evict


def test_the_retry_wakes_at_the_expiry_when_that_comes_first() -> None:
    config = PreservationConfig(drain_retry_interval=HOUR)
    n = node(ca="true", tainted=True, condition=preserved_condition(status="False", message=NOT_DRAINED))
    m = machine(phase=FAILED, preserve="now", expiry=NOW + 10 * MINUTE, drain=failing(NOW - HOUR, NOW), **STEADY)
    assert plan(m, n, config=config).requeue_after == 10 * MINUTE


def test_a_failed_drain_message_without_a_drain_record_drains_at_once() -> None:
    # e.g. the record's drain keys were lost: the drain is simply done again, announced as a first attempt
    m = preserved_machine(FAILED)
    fields = node_fields_of(m, "failed", pods_left="1")
    n = node(ca="true", tainted=True, condition=preserved_condition(status="False", message=NOT_DRAINED), fields=fields)
    result = plan(m, n, pods_to_evict=("ns/a",))
    assert write_kinds(result) == ["PatchNodeAnnotations", "DrainNode", "SetPreservedCondition"]
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(
        set={v.PRESERVED_DRAIN_ANNOTATION: "draining"}, remove=(v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION,)
    )
    assert only(result, SetPreservedCondition).message == (
        f"Preserved node is being drained. {UNTIL_KEPT} Waiting for pods: ns/a."
    )
    assert only(result, DrainNode).evict


def test_waiting_drain_still_follows_the_value_reason() -> None:
    failed = preserved_condition(status="False", message=NOT_DRAINED, reason="Preserved by MCM.")
    m = preserved_machine(FAILED, drain=failing(NOW - HOUR, NOW))
    result = plan(m, node(ca="true", tainted=True, condition=failed, fields=node_fields_of(m, "failed")))
    assert writes(result) == [
        SetPreservedCondition(
            status="False", reason="Preserved by user.", message=NOT_DRAINED, last_transition_time=NOW - 10 * HOUR
        )
    ]
    assert result.requeue_after == CONFIG_RETRY


CONFIG_RETRY = PreservationConfig().drain_retry_interval


@pytest.mark.parametrize(
    ("failing_for", "evict"),
    [(29 * MINUTE, True), (30 * MINUTE, False), (5 * HOUR, False)],
)
def test_evictions_stop_once_the_drain_has_failed_for_the_drain_timeout(failing_for: dt.timedelta, evict: bool) -> None:
    # The condition's transition time says "just now": only the record's failing-since counts.
    failed = preserved_condition(status="False", message=NOT_DRAINED, transition=NOW)
    n = node(ca="true", tainted=True, condition=failed)
    m = preserved_machine(FAILED, drain_timeout="30m", drain=failing(NOW - failing_for, NOW - 5 * MINUTE))
    drain = only(plan(m, n), DrainNode)
    assert (drain.evict, drain.timeout) == (evict, 30 * MINUTE)


def test_the_configured_drain_timeout_applies_without_a_spec_value() -> None:
    config = PreservationConfig(drain_timeout=HOUR)
    n = node(ca="true", tainted=True, condition=preserved_condition(status="False", message=NOT_DRAINED))
    at_the_limit = preserved_machine(FAILED, drain=failing(NOW - HOUR, NOW - 5 * MINUTE))
    assert (
        only(plan(at_the_limit, n, config=config), DrainNode).evict,
        only(plan(at_the_limit, n), DrainNode).evict,
    ) == (
        False,
        True,  # the default (2h) has not passed yet
    )


@pytest.mark.parametrize("transition", [NOW - 10 * HOUR, NOW], ids=["old-failure", "failure-just-now"])
def test_a_failure_shown_for_an_earlier_preservation_neither_paces_nor_ends_this_ones_drain(
    transition: dt.datetime,
) -> None:
    # The earlier preservation's record (with its drain) went with its stop; the node still shows its failure.
    earlier = f"Preserved node could not be drained. Machine preserved until {go_time_string(KEPT - 5 * HOUR)}."
    failed = preserved_condition(status="False", message=earlier, transition=transition)
    result = plan(machine(phase=FAILED, preserve="now", **STEADY), node(ca="true", tainted=True, condition=failed))
    drain = only(result, DrainNode)
    assert drain.evict, "a new preservation gets the full drain timeout, and its first attempt at once"
    assert drain.record is not None
    assert drain.record.drain is None
    assert only(result, SetPreservedCondition).message.startswith(v.DRAINING_MESSAGE)


def test_the_drain_timeout_counts_from_the_first_failure_not_from_a_success() -> None:
    # A True condition (drained, or preserved while Running) never counts as failing, however old.
    running_preserved = preserved_condition(message=UNTIL_KEPT, transition=NOW - 10 * HOUR)
    drain = only(plan(preserved_machine(FAILED), node(ca="true", tainted=True, condition=running_preserved)), DrainNode)
    assert drain.evict


GAVE_UP = "Evictions stopped after the drain timeout (30m0s); the node counts as drained once these pods are gone."


def given_up(**kwargs: object) -> tuple[Machine, DrainNode]:
    """A Failed machine whose drain has failed for longer than its 30m timeout, and the look its plan makes."""
    m = preserved_machine(FAILED, drain=failing(NOW - HOUR, NOW - 2 * HOUR), drain_timeout="30m", **kwargs)
    assert m.preservation is not None
    return m, DrainNode(
        record=m.preservation,
        reason="Preserved by user.",
        expiry=KEPT,
        timeout=30 * MINUTE,
        evict=False,
        node_fields=node_fields_of(m, "failed", pods_left="1", blocked_by="ns/budget"),
    )


def test_a_look_after_giving_up_says_so_once_and_then_writes_nothing() -> None:
    m, drain = given_up()
    failing_condition = preserved_condition(
        status="False", message=f"{NOT_DRAINED} Pods blocking the drain: ns/a.", transition=NOW - HOUR
    )
    first = plan_after_drain(
        machine=m, node=node(condition=failing_condition), drain=drain, drained=False, blocking_pods=["ns/a"], now=NOW
    )
    assert of_type(first, PatchMachineAnnotations) == [], "a look is not an attempt: the record's last attempt stays"
    condition = only(first, SetPreservedCondition)
    assert condition.message == f"{NOT_DRAINED} Pods blocking the drain: ns/a. {GAVE_UP}"
    assert (condition.status, condition.last_transition_time) == ("False", NOW - HOUR)
    assert [e.message for e in of_type(first, RecordEvent)] == [
        f'Preserved node "n1" could not be drained; pods blocking: ns/a. {GAVE_UP}'
    ] * 2
    said = preserved_condition(status="False", message=condition.message, transition=NOW - HOUR)
    again = plan_after_drain(
        machine=m, node=node(condition=said), drain=drain, drained=False, blocking_pods=["ns/a"], now=NOW
    )
    assert again == MachinePlan(), "still blocked by the same pods: nothing to write, no event"
    fewer = plan_after_drain(
        machine=m, node=node(condition=said), drain=drain, drained=False, blocking_pods=["ns/b"], now=NOW
    )
    assert write_kinds(fewer) == ["SetPreservedCondition"]
    assert only(fewer, SetPreservedCondition).message == f"{NOT_DRAINED} Pods blocking the drain: ns/b. {GAVE_UP}"


def test_a_look_that_finds_the_node_empty_marks_it_drained() -> None:
    m, drain = given_up()
    said = preserved_condition(status="False", message=f"{NOT_DRAINED} {GAVE_UP}", transition=NOW - HOUR)
    result = plan_after_drain(
        machine=m, node=node(condition=said), drain=drain, drained=True, blocking_pods=(), now=NOW
    )
    assert write_kinds(result) == ["SetPreservedCondition", "PatchNodeAnnotations", "PatchMachineAnnotations"]
    assert only(result, PatchNodeAnnotations) == PatchNodeAnnotations(
        set={v.PRESERVED_DRAIN_ANNOTATION: "drained"},
        remove=(v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION, v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION),
    )
    assert only(result, PatchMachineAnnotations) == PatchMachineAnnotations(
        set={v.PRESERVED_DRAIN_ANNOTATION: "drained"},
        remove=(v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION, v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION),
    )
    condition = only(result, SetPreservedCondition)
    assert (condition.status, condition.message, condition.last_transition_time) == ("True", DRAINED, NOW)
    assert event_reasons(result) == [
        ("Machine", v.EventReason.PRESERVED_NODE_DRAINED),
        ("Node", v.EventReason.PRESERVED_NODE_DRAINED),
    ]
    drained, steady = execute(m, node(ca="true", tainted=True, condition=said, fields=drain.node_fields), result)
    assert drained.preservation is not None
    assert drained.preservation.drain == WAS_DRAINED
    assert plan(drained, steady) == MachinePlan(requeue_after=5 * HOUR)


def test_condition_after_drain_success() -> None:
    drain = DrainNode(reason="Preserved by MCM.", expiry=KEPT)
    condition = condition_after_drain(node=node(), drain=drain, drained=True, blocking_pods=["a/b"], now=NOW)
    assert condition == SetPreservedCondition(
        status="True", reason="Preserved by MCM.", message=DRAINED, last_transition_time=NOW
    )


def test_condition_after_drain_failure_names_the_blocking_pods_sorted_and_bounded() -> None:
    pods = [f"ns/p{i:02d}" for i in range(12, 0, -1)] + ["ns/p01"]
    n = node(condition=preserved_condition(status="False", message=NOT_DRAINED, transition=NOW - HOUR))
    condition = condition_after_drain(
        node=n, drain=DrainNode(reason="Preserved by user.", expiry=KEPT), drained=False, blocking_pods=pods, now=NOW
    )
    listed = ", ".join(f"ns/p{i:02d}" for i in range(1, 11))
    assert condition.message == f"{NOT_DRAINED} Pods blocking the drain: {listed} and 2 more."
    assert condition.message.startswith(v.DRAIN_FAILED_MESSAGE)
    assert (condition.status, condition.last_transition_time) == ("False", NOW - HOUR)  # status unchanged


def test_condition_after_drain_failure_without_pods() -> None:
    condition = condition_after_drain(
        node=node(), drain=DrainNode(reason="Preserved by user.", expiry=KEPT), drained=False, blocking_pods=(), now=NOW
    )
    assert condition.message == NOT_DRAINED


def test_condition_after_drain_needs_the_expiry() -> None:
    with pytest.raises(ValueError, match="expiry"):
        condition_after_drain(node=node(), drain=DrainNode(), drained=True, blocking_pods=(), now=NOW)


def test_plan_after_drain_writes_the_condition_and_node_fields_then_the_record_then_events() -> None:
    m = preserved_machine(FAILED)
    assert m.preservation is not None
    drain = DrainNode(
        record=m.preservation, reason="Preserved by user.", expiry=KEPT, node_fields=node_fields_of(m, "draining")
    )
    result = plan_after_drain(
        machine=m,
        node=node(),
        drain=drain,
        drained=False,
        blocking_pods=["ns/web-0", "ns/web-1"],
        now=NOW,
        blocked_by=["ns/web"],
    )
    assert write_kinds(result) == ["SetPreservedCondition", "PatchNodeAnnotations", "PatchMachineAnnotations"]
    assert result.steps[1] == PatchNodeAnnotations(
        set={
            v.PRESERVED_DRAIN_ANNOTATION: "failed",
            v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "2",
            v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: "ns/web",
        }
    )
    assert isinstance(result.steps[2], PatchMachineAnnotations)
    assert result.steps[2].set == {
        v.PRESERVED_DRAIN_ANNOTATION: "failed",
        v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION: format_timestamp(NOW),
        v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION: format_timestamp(NOW),
    }
    assert event_reasons(result) == [
        ("Machine", v.EventReason.PRESERVED_NODE_DRAIN_FAILED),
        ("Node", v.EventReason.PRESERVED_NODE_DRAIN_FAILED),
    ]
    assert all(e.type == "Warning" and "ns/web-0" in e.message for e in of_type(result, RecordEvent))
    # Converged: the Node says the outcome, no field of the preservation is lost.
    assert patched_annotations(drain.node_fields, result.steps[1]) == node_fields_of(
        m, "failed", pods_left="2", blocked_by="ns/web"
    )
    success = plan_after_drain(machine=m, node=node(), drain=drain, drained=True, blocking_pods=(), now=NOW)
    assert {e.type for e in of_type(success, RecordEvent)} == {"Normal"}


def test_a_drain_retried_after_its_records_conflict_writes_the_condition_again_and_sends_the_events() -> None:
    # An attempt wrote "drained" and then its record write met a conflict (MCM writes the Machine's status after
    # every Node change): the retry starts as a first attempt, says "being drained" alongside, and its outcome
    # must say "drained" again and send the Events, which the failed attempt never sent.
    m = preserved_machine(FAILED)
    n = node(ca="true", ca_marker="true", tainted=True, condition=preserved_condition(message=DRAINED))
    retry = plan(m, n)
    assert retry.drain is not None
    assert only(retry, SetPreservedCondition).message.startswith(v.DRAINING_MESSAGE)
    outcome = plan_after_drain(machine=m, node=n, drain=retry.drain, drained=True, blocking_pods=(), now=NOW)
    assert write_kinds(outcome) == ["SetPreservedCondition", "PatchNodeAnnotations", "PatchMachineAnnotations"]
    assert only(outcome, SetPreservedCondition).message == DRAINED
    assert event_reasons(outcome) == [
        ("Machine", v.EventReason.PRESERVED_NODE_DRAINED),
        ("Node", v.EventReason.PRESERVED_NODE_DRAINED),
    ]


def test_the_events_of_an_outcome_already_in_the_condition_go_with_the_record_that_is_new() -> None:
    m = preserved_machine(FAILED)
    assert m.preservation is not None
    drain = DrainNode(
        record=m.preservation, reason="Preserved by user.", expiry=KEPT, node_fields=node_fields_of(m, "drained")
    )
    n = node(condition=preserved_condition(message=DRAINED))
    outcome = plan_after_drain(machine=m, node=n, drain=drain, drained=True, blocking_pods=(), now=NOW)
    assert write_kinds(outcome) == ["PatchMachineAnnotations"]
    assert event_reasons(outcome) == [
        ("Machine", v.EventReason.PRESERVED_NODE_DRAINED),
        ("Node", v.EventReason.PRESERVED_NODE_DRAINED),
    ]
    # A failure as the record already has it, with the same pods: the record's time moves, no Event.
    still = preserved_machine(FAILED, drain=failing(NOW - HOUR, NOW - MINUTE))
    assert still.preservation is not None
    blocked = node(
        condition=preserved_condition(
            status="False", message=f"{NOT_DRAINED} Pods blocking the drain: ns/a.", transition=NOW - HOUR
        )
    )
    again = plan_after_drain(
        machine=still,
        node=blocked,
        drain=DrainNode(
            record=still.preservation,
            reason="Preserved by user.",
            expiry=KEPT,
            node_fields=node_fields_of(still, "failed", pods_left="1"),
        ),
        drained=False,
        blocking_pods=["ns/a"],
        now=NOW,
    )
    assert write_kinds(again) == ["PatchMachineAnnotations"]
    assert event_reasons(again) == []


def test_the_start_is_announced_before_the_mirror_whose_write_may_conflict() -> None:
    # A 409 on the mirror ends the plan after the record is written; the retry finds the record and does not
    # announce the start, so the Events must already be out.
    m, n = machine(phase=RUNNING, preserve="now"), node()
    kinds = [type(step).__name__ for step in plan(m, n, config=PreservationConfig(mirror_status=True)).steps]
    assert kinds[0] == "PatchMachineAnnotations"
    assert "SetPreserveExpiry" in kinds
    assert max(i for i, k in enumerate(kinds) if k == "RecordEvent") < kinds.index("SetPreserveExpiry")


def test_a_drain_in_the_plan_that_starts_the_preservation_rewrites_only_the_drain_keys() -> None:
    # The shell asks with the machine as it was before the plan, which wrote the record first: the outcome
    # must not write since, until and by a second time.
    m, n = machine(phase=FAILED, preserve="now"), node()
    assert m.preservation is None
    started = plan(m, n)
    drain = only(started, DrainNode)
    assert drain.record is not None
    result = plan_after_drain(machine=m, node=n, drain=drain, drained=True, blocking_pods=(), now=NOW)
    patch = only(result, PatchMachineAnnotations)
    assert patch.set == {v.PRESERVED_DRAIN_ANNOTATION: "drained"}
    assert patch.remove == ()


def test_plan_after_drain_needs_the_record() -> None:
    with pytest.raises(ValueError, match="record"):
        plan_after_drain(
            machine=machine(), node=node(), drain=DrainNode(expiry=KEPT), drained=True, blocking_pods=(), now=NOW
        )


def test_drain_outcome_converges() -> None:
    m, n = machine(phase=FAILED, preserve="now"), node()
    m, after = execute(m, n, plan(m, n))
    assert plan(m, after).steps == ()


# --- orphans ---------------------------------------------------------------------------------------------


def test_condition_still_preserved_without_a_record_is_cleaned_up() -> None:
    # e.g. the record was removed by hand while the webhook was down: the node is cleaned up, but without a
    # record nothing says this preservation added the CA annotation, so it stays; there is no preservation
    # (no expiry, no cause) to report as stopped.
    n = node(ca="true", ca_marker="true", tainted=True, condition=preserved_condition(message=UNTIL_KEPT))
    result = plan(machine(phase=RUNNING, preserve="when-failed"), n)
    assert write_kinds(result) == ["SetPreservedTaint", "SetPreservedCondition"]
    assert only(result, SetPreservedCondition).reason == v.ConditionReason.PRESERVATION_STOPPED
    assert event_reasons(result) == []


# --- Go time format --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (dt.datetime(2026, 8, 23, 10, 0, tzinfo=dt.UTC), "2026-08-23 10:00:00 +0000 UTC"),
        (dt.datetime(2026, 8, 23, 10, 0, 0, 500000, tzinfo=dt.UTC), "2026-08-23 10:00:00.5 +0000 UTC"),
        (dt.datetime(2026, 8, 23, 10, 0, 0, 120, tzinfo=dt.UTC), "2026-08-23 10:00:00.00012 +0000 UTC"),
        (dt.datetime(2026, 8, 23, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))), "2026-08-23 10:00:00 +0000 UTC"),
        (dt.datetime(2026, 8, 23, 10, 0), "2026-08-23 10:00:00 +0000 UTC"),  # naive: taken as UTC
    ],
)
def test_go_time_string(moment: dt.datetime, text: str) -> None:
    assert go_time_string(moment) == text
