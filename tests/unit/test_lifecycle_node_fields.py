"""The Node's preservation fields (core.node_fields): the record's mirror, the drain state and what blocks it, kept
converged by the machine plan and the drain's outcome, and removed with the preservation."""

from __future__ import annotations

import datetime as dt

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.lifecycle import plan_after_drain
from machine_preservation.core.models import Node, NoNode
from machine_preservation.core.node_fields import blocked_by_value, fields_after_drain, fields_patch
from machine_preservation.core.plan import (
    DrainNode,
    MachinePlan,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
)
from machine_preservation.core.preservation_record import DrainRecord

from .lifecycle_helpers import of_type, only, plan, writes
from .preservation_objects import HOUR, NOW, machine, node, node_fields_of, preserved_condition

FAILED, RUNNING = v.MachinePhase.FAILED, v.MachinePhase.RUNNING
KEPT = NOW + 5 * HOUR
MINUTE = dt.timedelta(minutes=1)
UNTIL_KEPT = "Machine preserved until 2026-08-20 15:00:00 +0000 UTC."
NOT_DRAINED = f"Preserved node could not be drained. {UNTIL_KEPT}"
STEADY = {"priority": "5", "last_priority": ""}
SINCE, UNTIL, BY = v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION
STATE = v.PRESERVED_DRAIN_ANNOTATION
PODS_LEFT, BLOCKED_BY = v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION, v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION
EVIDENCE = v.PRESERVED_EVIDENCE_ANNOTATION
RETRY = PreservationConfig().drain_retry_interval
# A drain failing for an hour, last tried just now: its retry is due RETRY from now.
FAILING = DrainRecord(outcome=v.DrainOutcome.FAILED, failing_since=NOW - HOUR, last_attempt=NOW)
# Every field a failed drain leaves on the Node, and the evidence's name.
ALL_OF_THEM = {PODS_LEFT: "2", BLOCKED_BY: "shop/web", EVIDENCE: "kube-system/machine-preservation-evidence-n1"}


def failed_node(fields: dict[str, str], **kwargs: object) -> Node:
    condition = preserved_condition(status="False", message=NOT_DRAINED)
    return node(ca="true", ca_marker="true", tainted=True, condition=condition, fields=fields, **kwargs)


# --- while preserved ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "by"), [("now", "user"), ("when-failed", "user"), ("auto-preserve", "auto")])
def test_a_failed_machines_start_writes_its_fields_with_the_ca_annotation(value: str, by: str) -> None:
    result = plan(machine(phase=FAILED, preserve=value), node())
    patch = only(result, PatchNodeAnnotations)
    assert {key: patch.set[key] for key in (SINCE, UNTIL, BY, STATE)} == {
        SINCE: "2026-08-20T10:00:00Z",
        UNTIL: "2026-08-23T10:00:00Z",
        BY: by,
        STATE: "draining",  # the drain follows the plan's writes
    }
    assert result.drain is not None


def test_a_waiting_failed_drain_keeps_what_its_last_attempt_found() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, drain=FAILING, **STEADY)
    n = failed_node(node_fields_of(m, "failed", pods_left="2", blocked_by="shop/web"))
    assert plan(m, n) == MachinePlan(requeue_after=RETRY)


def test_fields_someone_changed_are_written_back() -> None:
    # Only the controller may write them, but while the webhook is down anyone could.
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, drain=FAILING, **STEADY)
    tampered = {**node_fields_of(m, "drained"), UNTIL: "2030-01-01T00:00:00Z", BY: "auto"}
    result = plan(m, failed_node(tampered), now=NOW + HOUR)  # the retry is due: the outcome says the rest
    assert of_type(result, PatchNodeAnnotations)[0] == PatchNodeAnnotations(
        set={UNTIL: "2026-08-20T15:00:00Z", BY: "user", STATE: "failed"}
    )


def test_a_converged_preserved_node_costs_no_write() -> None:
    m = machine(phase=RUNNING, preserve="now", expiry=KEPT, **STEADY)
    n = node(ca="true", ca_marker="true", condition=preserved_condition(message=UNTIL_KEPT), fields=node_fields_of(m))
    assert plan(m, n) == MachinePlan(requeue_after=5 * HOUR)


# --- the drain's outcome -----------------------------------------------------------------------------------


MIRROR = {SINCE: "2026-08-17T15:00:00Z", UNTIL: "2026-08-20T15:00:00Z", BY: "user"}


@pytest.mark.parametrize(
    ("before", "drained", "pods_left", "blocked_by", "after"),
    [
        ({**MIRROR, STATE: "draining"}, True, 0, (), {**MIRROR, STATE: "drained"}),
        ({**MIRROR, STATE: "failed", PODS_LEFT: "3", BLOCKED_BY: "a/b"}, True, 0, (), {**MIRROR, STATE: "drained"}),
        (
            {**MIRROR, STATE: "draining"},
            False,
            2,
            ("shop/web",),
            {**MIRROR, STATE: "failed", PODS_LEFT: "2", BLOCKED_BY: "shop/web"},
        ),
        # An attempt that no budget refused (the pods' grace periods run, or an eviction failed otherwise).
        (
            {**MIRROR, STATE: "failed", PODS_LEFT: "3", BLOCKED_BY: "a/b"},
            False,
            1,
            (),
            {**MIRROR, STATE: "failed", PODS_LEFT: "1"},
        ),
        # A look after evictions were given up asks no budget: the last attempt's names stay.
        (
            {**MIRROR, STATE: "failed", PODS_LEFT: "3", BLOCKED_BY: "a/b"},
            False,
            1,
            None,
            {**MIRROR, STATE: "failed", PODS_LEFT: "1", BLOCKED_BY: "a/b"},
        ),
        ({**MIRROR, STATE: "failed"}, False, 1, None, {**MIRROR, STATE: "failed", PODS_LEFT: "1"}),
    ],
)
def test_fields_after_drain(
    before: dict[str, str], drained: bool, pods_left: int, blocked_by: tuple[str, ...] | None, after: dict[str, str]
) -> None:
    assert fields_after_drain(before=before, drained=drained, pods_left=pods_left, blocked_by=blocked_by) == after


def test_the_budgets_are_named_sorted_once_each_and_bounded() -> None:
    names = [f"ns/pdb-{i:02d}" for i in range(15, 0, -1)] + ["ns/pdb-01"]
    assert blocked_by_value(names) == ",".join(f"ns/pdb-{i:02d}" for i in range(1, v.DRAIN_BLOCKED_BY_LIMIT + 1))
    assert blocked_by_value([]) == ""


def test_fields_patch_changes_only_what_differs() -> None:
    current = {**MIRROR, STATE: "failed", PODS_LEFT: "3", "other": "x"}
    assert fields_patch(current=current, wanted={**MIRROR, STATE: "drained"}) == PatchNodeAnnotations(
        set={STATE: "drained"}, remove=(PODS_LEFT,)
    )
    assert fields_patch(current=current, wanted={**MIRROR, STATE: "failed", PODS_LEFT: "3"}) == PatchNodeAnnotations()


def test_a_pdb_blocked_drain_names_the_pods_left_and_the_budget_and_a_look_keeps_the_budget() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=KEPT, drain=FAILING, drain_timeout="30m", **STEADY)
    assert m.preservation is not None
    before = node_fields_of(m, "failed", pods_left="1")
    drain = DrainNode(record=m.preservation, reason="Preserved by user.", expiry=KEPT, timeout=HOUR, node_fields=before)
    n = failed_node(before)
    attempt = plan_after_drain(
        machine=m,
        node=n,
        drain=drain,
        drained=False,
        blocking_pods=["shop/web-0", "shop/web-1"],
        now=NOW + RETRY,
        blocked_by=["shop/web"],
    )
    assert only(attempt, PatchNodeAnnotations) == PatchNodeAnnotations(set={PODS_LEFT: "2", BLOCKED_BY: "shop/web"})
    # The Node's write comes before the record's: what the SRE reads is not held up by a conflict on the Machine.
    kinds = [type(step).__name__ for step in writes(attempt)]
    assert kinds.index("PatchNodeAnnotations") < kinds.index("PatchMachineAnnotations")
    said = node_fields_of(m, "failed", pods_left="2", blocked_by="shop/web")
    look = DrainNode(
        record=m.preservation, reason="Preserved by user.", expiry=KEPT, timeout=HOUR, evict=False, node_fields=said
    )
    unchanged = plan_after_drain(
        machine=m,
        node=failed_node(said),
        drain=look,
        drained=False,
        blocking_pods=["shop/web-0", "shop/web-1"],
        now=NOW,
        blocked_by=["ignored/for-a-look"],
    )
    assert of_type(unchanged, PatchNodeAnnotations) == []
    one_left = plan_after_drain(
        machine=m, node=failed_node(said), drain=look, drained=False, blocking_pods=["shop/web-1"], now=NOW
    )
    assert only(one_left, PatchNodeAnnotations) == PatchNodeAnnotations(set={PODS_LEFT: "1"})


# --- the end of a preservation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "released", "deletes"),
    [("false", False, False), ("now", True, False), ("expired", False, True)],
    ids=["stopped", "released", "ended-failed"],
)
def test_the_end_removes_every_field_with_the_ca_annotation_before_the_record(
    value: str, released: bool, deletes: bool
) -> None:
    expired = value == "expired"
    preserve, expiry = ("now", NOW - HOUR) if expired else (value, KEPT)
    # `false` on a Failed machine ends it (deleted): stopped, the machine runs.
    phase = RUNNING if value == "false" else FAILED
    m = machine(phase=phase, preserve=preserve, expiry=expiry, drain=FAILING, added_ca=True, **STEADY)
    n = failed_node({**node_fields_of(m, "failed"), **ALL_OF_THEM})
    result = plan(m, n, released=released)
    patch = only(result, PatchNodeAnnotations)
    assert set(patch.remove) == {
        v.CA_SCALE_DOWN_DISABLED_ANNOTATION,
        v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
        SINCE,
        UNTIL,
        BY,
        STATE,
        *ALL_OF_THEM,
    }
    steps = writes(result)
    last = steps[-1]
    if deletes:
        assert type(last).__name__ == "DeleteMachine"
    else:
        assert isinstance(last, PatchMachineAnnotations)
        assert SINCE in last.remove
    assert steps.index(patch) < len(steps) - 1


def test_leftover_fields_of_no_preservation_are_removed_once() -> None:
    n = node(fields={STATE: "failed", PODS_LEFT: "2", EVIDENCE: "kube-system/e"})
    result = plan(machine(phase=RUNNING), n)
    assert writes(result) == [PatchNodeAnnotations(remove=(STATE, PODS_LEFT, EVIDENCE))]
    assert plan(machine(phase=RUNNING), node()) == MachinePlan()


def test_another_machines_node_is_never_written() -> None:
    # The label names a Node whose providerID is another machine's: it is left alone.
    m = machine(phase=FAILED, preserve="now").model_copy()
    m = m.model_copy(update={"spec": m.spec.model_copy(update={"provider_id": "aws:///eu/i-1"})})
    other = node(fields={STATE: "failed"})
    other = other.model_copy(update={"spec": other.spec.model_copy(update={"provider_id": "aws:///eu/i-2"})})
    result = plan(m, other)
    assert of_type(result, PatchNodeAnnotations) == []
    assert result.drain is None


def test_a_gone_node_is_not_written_and_its_successor_gets_the_fields() -> None:
    m = machine(phase=RUNNING, preserve="now", expiry=KEPT, **STEADY)
    assert of_type(plan(m, NoNode.NOT_FOUND), PatchNodeAnnotations) == []
    gone = machine(phase=RUNNING, last_applied="now", expiry=KEPT, node_gone_since=NOW - HOUR, **STEADY)
    back = only(plan(gone, node()), PatchNodeAnnotations)
    assert {key: back.set[key] for key in (SINCE, UNTIL, BY)} == node_fields_of(m)
