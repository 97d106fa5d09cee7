"""The level-based decision for one machine: from a snapshot to the ordered writes that converge it.

`plan_machine` compares what the objects say with what they should say and returns only the differences,
so an already converged machine yields an empty plan (no API writes in steady state). Each step is one
idempotent write; the shell stops at the first failure and plans again from the objects.

Order, and why:
- start: `preserveExpiryTime` first (it is the record that preservation is active), then the Machine's
  annotations (priority raise, node-value sync), the CA annotation, the taint of a Failed machine, and last
  either the `Preserved` condition or, for a Failed machine, the drain (whose outcome writes the condition);
- stop: the Machine's annotations (removed on expiry so the machine is not preserved again; priority
  restored), the Node's annotations (CA annotation only when our ownership marker says we added it), the
  condition, the taint, and last the expiry is cleared;
- end of a Failed machine whose preservation expired or was turned off with `false`: the node is cleaned up
  the same way, then the Machine is deleted instead of clearing its expiry, and its annotations are left
  alone (core.decision explains why; it also keeps auto-preservation from picking up a Failed, unpreserved
  machine again, upstream quirk Q2).
A crash between any two steps leaves the expiry and the annotations that decided the stop in place, so the
next plan makes the same decision and finishes the job.

Deliberate differences from upstream (reference §3, §11):
- every preserved machine's node state is checked on every plan, not only until the condition is True: a CA
  annotation flipped by a user is re-asserted (DESIGN.md §3), and the reason follows the value (Q4);
- the "drained" record belongs to one failure: while the machine is not Failed the condition says
  "Machine preserved until", so a `now` machine that fails again is tainted and drained again (Q3/Q4);
- a failed drain is retried `drain_retry_interval` after the last attempt (the condition's heartbeat);
- a Failed machine in our custody (preserved, or about to be) whose node is healthy again (Ready, none of
  MCM's problem conditions) is moved to Running (DESIGN.md §3), and planned for as Running;
- node-side leftovers (a condition not stopped) are cleaned up even if the expiry was dropped by someone
  else (MCM's in-place update does, reference §2), and our taint never outlives preservation;
- invalid values are reported once each with a Warning Event (core.invalid_values), not only logged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from machine_preservation.core import conditions, events
from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import condition_after_drain
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.decision import PreservationDecision, decide_preservation
from machine_preservation.core.durations import duration_or_default
from machine_preservation.core.invalid_values import report_invalid_values
from machine_preservation.core.models import Machine, Node, NodeCondition
from machine_preservation.core.plan import (
    DeleteMachine,
    DrainNode,
    MachinePlan,
    MachineStep,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetMachinePhase,
    SetPreservedTaint,
    SetPreserveExpiry,
)
from machine_preservation.core.preserve_value import (
    EffectivePreserveValue,
    Preference,
    Source,
    effective_preserve_value,
    parse_preference,
)
from machine_preservation.core.priority import priority_patch

__all__ = ["condition_after_drain", "drain_timeout", "node_is_healthy", "plan_after_drain", "plan_machine"]


def plan_machine(
    *,
    machine: Machine,
    node: Node | None,
    node_missing: bool,
    config: PreservationConfig,
    now: dt.datetime,
    unpreserved_priority_ceiling: int,
) -> MachinePlan:
    """Decide one machine.

    `node` is the Node named by the machine's `node` label (None when there is no label or it was not
    found); `node_missing` is True when the label names a Node that does not exist: the machine's own value
    is in force and only the expiry is set or cleared (reference §4.2 #19). `unpreserved_priority_ceiling`
    comes from `priority.unpreserved_priority_ceiling` over the machine's MachineSet.
    """
    if node_missing and (node is not None or not machine.node_name):
        raise ValueError("node_missing means: the machine names a node, and that node was not found (node=None)")
    if machine.metadata.deletion_timestamp is not None or machine.phase == v.MachinePhase.TERMINATING:
        return MachinePlan()  # MCM's deletion flow owns it now

    effective = effective_preserve_value(machine=machine, node=node)
    steps: list[MachineStep] = []
    phase = machine.phase
    decision = decide_preservation(machine=machine, value=effective.value, phase=phase, config=config, now=now)
    # In our custody (preserved, or about to be) and Failed, but the node is healthy again: MCM has not moved
    # the phase back, so we do (DESIGN.md §3), and decide on Running.
    in_custody = machine.preserve_expiry_time is not None or decision.preserve
    if phase == v.MachinePhase.FAILED and in_custody and node is not None and node_is_healthy(node=node, config=config):
        steps += [SetMachinePhase(phase=v.MachinePhase.RUNNING), *events.recovered(machine=machine, node=node)]
        phase = v.MachinePhase.RUNNING
        decision = decide_preservation(machine=machine, value=effective.value, phase=phase, config=config, now=now)
    machine_patch, invalid_events = (
        (PatchMachineAnnotations(), ())  # the Machine goes: nothing to write on it
        if decision.delete_machine
        else _machine_annotations(
            machine=machine, effective=effective, decision=decision, ceiling=unpreserved_priority_ceiling
        )
    )
    if decision.preserve:
        preserve_steps, retry_at = _preserve(
            machine=machine,
            node=node,
            node_missing=node_missing,
            effective=effective,
            decision=decision,
            phase=phase,
            machine_patch=machine_patch,
            invalid_events=invalid_events,
            config=config,
            now=now,
        )
        steps += preserve_steps
        assert decision.expiry is not None  # a preserve decision always carries its expiry
        wake_at = decision.expiry if retry_at is None else min(decision.expiry, retry_at)
        return MachinePlan(steps=tuple(steps), requeue_after=max(wake_at - now, dt.timedelta(0)))
    steps += _stop_or_idle(
        machine=machine,
        node=node,
        effective=effective,
        decision=decision,
        machine_patch=machine_patch,
        invalid_events=invalid_events,
        now=now,
    )
    return MachinePlan(steps=tuple(steps))


def plan_after_drain(
    *,
    machine: Machine,
    node: Node,
    drain: DrainNode,
    drained: bool,
    blocking_pods: Sequence[str],
    now: dt.datetime,
) -> MachinePlan:
    """What the shell writes once a DrainNode ended: the condition, then the outcome's Events.

    A look at a node whose evictions were given up (`evict` False) that finds it still blocked writes only
    when the blocking pods changed, so it costs nothing in steady state.
    """
    condition = condition_after_drain(node=node, drain=drain, drained=drained, blocking_pods=blocking_pods, now=now)
    if condition is None:
        return MachinePlan()
    outcome = events.drain_outcome(
        machine=machine, node=node, drained=drained, blocking_pods=blocking_pods, gave_up_after=_gave_up(drain, drained)
    )
    return MachinePlan(steps=(condition, *outcome))


def _gave_up(drain: DrainNode, drained: bool) -> dt.timedelta | None:
    return drain.timeout if not drained and not drain.evict else None


def node_is_healthy(*, node: Node, config: PreservationConfig) -> bool:
    """Ready, and none of the conditions that make MCM call a node unhealthy."""
    ready = node.condition(v.NODE_READY_CONDITION_TYPE)
    if ready is None or ready.status != conditions.TRUE:
        return False
    return not any(
        (condition := node.condition(kind)) is not None and condition.status == conditions.TRUE
        for kind in config.unhealthy_node_conditions
    )


def drain_timeout(*, machine: Machine, config: PreservationConfig) -> dt.timedelta:
    """spec.drainTimeout when it is a valid positive Go duration; else the configured default."""
    return duration_or_default(machine.spec.drain_timeout, default=config.drain_timeout, allow_zero=False)


def _merge(patches: Sequence[PatchMachineAnnotations]) -> PatchMachineAnnotations:
    merged_set: dict[str, str] = {}
    merged_remove: list[str] = []
    for patch in patches:
        merged_set.update(patch.set)
        merged_remove += [key for key in patch.remove if key not in merged_remove]
    return PatchMachineAnnotations(set=merged_set, remove=tuple(key for key in merged_remove if key not in merged_set))


def _is_empty(patch: PatchMachineAnnotations | PatchNodeAnnotations) -> bool:
    return not patch.set and not patch.remove


def _machine_annotations(
    *, machine: Machine, effective: EffectivePreserveValue, decision: PreservationDecision, ceiling: int
) -> tuple[PatchMachineAnnotations, tuple[RecordEvent, ...]]:
    """All Machine annotation changes of this plan as one write, and the Events that go with it."""
    annotations = machine.metadata.annotations
    changes: list[PatchMachineAnnotations] = []
    if decision.remove_annotations:
        present = tuple(
            key for key in (v.PRESERVE_ANNOTATION, v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION) if key in annotations
        )
        changes.append(PatchMachineAnnotations(remove=present))
    elif effective.node_in_control:
        changes.append(_sync_from_node(machine=machine, effective=effective))
    changes.append(
        priority_patch(
            machine=machine, preserved=decision.preserve, auto=effective.value == Preference.AUTO, ceiling=ceiling
        )
    )
    # A machine value this plan removes (expiry) is no longer there to report.
    removes_machine_value = any(v.PRESERVE_ANNOTATION in change.remove for change in changes)
    invalid = [i for i in effective.invalid if not (i.kind == "Machine" and removes_machine_value)]
    record, invalid_events = report_invalid_values(machine=machine, invalid=invalid)
    changes.append(record)
    return _merge(changes), invalid_events


def _sync_from_node(*, machine: Machine, effective: EffectivePreserveValue) -> PatchMachineAnnotations:
    """The node decides: the machine's own value goes, last-applied := the node's value (reference §3 step 9).

    An invalid machine value is left alone (it is reported instead), and so is the auto value the node
    lets through (core.preserve_value).
    """
    annotations = machine.metadata.annotations
    node_value = effective.node_raw or ""
    machine_raw = annotations.get(v.PRESERVE_ANNOTATION)
    keeps_auto = effective.source == Source.MACHINE
    remove: tuple[str, ...] = ()
    if machine_raw is not None and not keeps_auto and parse_preference(machine_raw) is not None:
        remove = (v.PRESERVE_ANNOTATION,)
    current_last_applied = annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "")
    set_ = {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: node_value} if current_last_applied != node_value else {}
    return PatchMachineAnnotations(set=set_, remove=remove)


def _preserve(
    *,
    machine: Machine,
    node: Node | None,
    node_missing: bool,
    effective: EffectivePreserveValue,
    decision: PreservationDecision,
    phase: str,
    machine_patch: PatchMachineAnnotations,
    invalid_events: tuple[RecordEvent, ...],
    config: PreservationConfig,
    now: dt.datetime,
) -> tuple[list[MachineStep], dt.datetime | None]:
    """The writes that make the machine preserved, and when a waiting drain retry is due (else None)."""
    expiry = decision.expiry
    assert expiry is not None  # a preserve decision always carries its expiry
    steps: list[MachineStep] = []
    if decision.starts:
        steps.append(SetPreserveExpiry(expiry=expiry))
        steps += events.started(
            machine=machine, node=node, node_missing=node_missing, effective=effective, expiry=expiry
        )
    if not _is_empty(machine_patch):
        steps.append(machine_patch)
    steps += invalid_events
    if node is None:
        return steps, None

    if node.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) != v.CA_SCALE_DOWN_DISABLED_VALUE:
        steps.append(
            PatchNodeAnnotations(
                set={
                    v.CA_SCALE_DOWN_DISABLED_ANNOTATION: v.CA_SCALE_DOWN_DISABLED_VALUE,
                    v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: v.CA_SCALE_DOWN_DISABLED_VALUE,
                }
            )
        )
    failed = phase == v.MachinePhase.FAILED
    if failed != node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
        steps.append(SetPreservedTaint(present=failed))

    reason = conditions.reason_for(effective.value)
    current = node.preserved_condition
    retry_at: dt.datetime | None = None
    if not failed:
        # Also rewrites a "drained" message: the next failure must be drained again (quirk Q3).
        condition = conditions.condition_step(
            current=current,
            status=conditions.TRUE,
            reason=reason,
            message=conditions.preserved_until_message(expiry),
            now=now,
        )
    elif current is not None and conditions.is_drained(current):
        condition = conditions.condition_step(
            current=current,
            status=conditions.TRUE,
            reason=reason,
            message=conditions.drained_message(expiry),
            now=now,
            last_heartbeat_time=current.last_heartbeat_time,
        )
    else:
        retry_at = _drain_retry_at(current=current, expiry=expiry, config=config)
        if current is None or retry_at is None or retry_at <= now:
            timeout = drain_timeout(machine=machine, config=config)
            evict = not conditions.evictions_exhausted(current, timeout=timeout, expiry=expiry, now=now)
            steps.append(DrainNode(reason=reason, expiry=expiry, timeout=timeout, evict=evict))
            return steps, None
        # Waiting for the next attempt after a failed drain: only the reason follows the value meanwhile.
        condition = conditions.condition_step(
            current=current,
            status=conditions.FALSE,
            reason=reason,
            message=current.message,
            now=now,
            last_heartbeat_time=current.last_heartbeat_time,
        )
    if condition is not None:
        steps.append(condition)
    return steps, retry_at


def _drain_retry_at(
    *, current: NodeCondition | None, expiry: dt.datetime, config: PreservationConfig
) -> dt.datetime | None:
    """When the next drain is due after a failed one (None: no failed drain of this preservation on record,
    drain now; a failure recorded for an earlier preservation names another expiry and does not pace this one)."""
    if (
        current is None
        or not conditions.is_drain_failed(current)
        or conditions.preserved_until_message(expiry) not in current.message
        or current.last_heartbeat_time is None
    ):
        return None
    return current.last_heartbeat_time + config.drain_retry_interval


def _stop_or_idle(
    *,
    machine: Machine,
    node: Node | None,
    effective: EffectivePreserveValue,
    decision: PreservationDecision,
    machine_patch: PatchMachineAnnotations,
    invalid_events: tuple[RecordEvent, ...],
    now: dt.datetime,
) -> list[MachineStep]:
    """The writes that end a preservation (if there is one to end) and keep an unpreserved machine clean."""
    expiry = machine.preserve_expiry_time
    current = node.preserved_condition if node is not None else None
    # The expiry is the record; a condition still saying "preserved" is one too (the expiry may have been
    # dropped by someone else, e.g. MCM's in-place update, reference §2).
    stopping = expiry is not None or conditions.shows_preservation(current)
    steps: list[MachineStep] = []
    if not _is_empty(machine_patch):
        steps.append(machine_patch)
    steps += invalid_events
    if node is not None:
        if stopping:
            node_patch = _node_annotations_on_stop(node=node, effective=effective, decision=decision)
            if not _is_empty(node_patch):
                steps.append(node_patch)
            stopped = conditions.condition_step(
                current=current,
                status=conditions.FALSE,
                reason=v.ConditionReason.PRESERVATION_STOPPED,
                message="",
                now=now,
            )
            if current is not None and stopped is not None:
                steps.append(stopped)
        if node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
            steps.append(SetPreservedTaint(present=False))
    if not stopping:
        return steps
    assert decision.stop_cause is not None  # a stop decision always says why
    if decision.delete_machine:
        steps.append(DeleteMachine())
    elif expiry is not None:
        steps.append(SetPreserveExpiry(expiry=None))
    steps += events.stopped(machine=machine, node=node, cause=decision.stop_cause, deleting=decision.delete_machine)
    return steps


def _node_annotations_on_stop(
    *, node: Node, effective: EffectivePreserveValue, decision: PreservationDecision
) -> PatchNodeAnnotations:
    annotations = node.metadata.annotations
    remove: list[str] = []
    if annotations.get(v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION) == v.CA_SCALE_DOWN_DISABLED_VALUE:
        # Ours: we (or MCM's rollout, which uses the same marker) added it. Without the marker it is not ours.
        remove += [
            key
            for key in (v.CA_SCALE_DOWN_DISABLED_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION)
            if key in annotations
        ]
    if decision.remove_annotations and effective.source == Source.NODE and effective.node_raw:
        remove.append(v.PRESERVE_ANNOTATION)
    return PatchNodeAnnotations(remove=tuple(remove))
