"""The level-based decision for one machine: from a snapshot to the ordered writes that converge it.

`plan_machine` compares what the objects say with what they should say and returns only the differences,
so an already converged machine yields an empty plan (no API writes in steady state). Each step is one
idempotent write; the shell stops at the first failure and plans again from the objects.

The preservation record (Machine annotations, core.preservation_record) is the state; the node's condition,
taint and CA annotation, the mirrored `preserveExpiryTime` and the priority are derived from it. Order, and why:
- start: one Machine write carrying the record (plus the priority raise and node-value sync), then the
  mirror, the CA annotation with the Node's preservation fields (core.node_fields), the taint of a Failed machine,
  and last either the `Preserved` condition or, for a Failed machine not drained yet, the condition "being
  drained" and the drain (whose outcome `plan_after_drain` records, on the Node's fields too);
- stop: the Machine's annotations (on expiry the preserve annotation goes, so the machine is not preserved
  again; the priority is restored), the Node's annotations (CA annotation only when our ownership marker says
  we added it; the preservation's fields, the evidence's name among them), the condition, the taint, the mirror,
  and last the record is removed;
- end of a Failed machine whose preservation expired or was turned off with `false`: the node is cleaned up
  the same way, then the Machine is deleted with its record in place (core.decision explains why).
- release (the extension disabled for the shoot, `MachineContext.released`): the same writes as a stop,
  whatever the value and the phase, except that no preserve annotation is removed or synced and a Failed
  machine is not deleted: with its record gone it is MCM's again, which replaces it as it would without us.
A crash or a conflict between any two steps leaves the record in place, so the next plan makes the same
decision and finishes the job; it never starts a new preservation instead.

Beyond upstream MCM:
- every preserved machine's node state is checked on every plan, not only until the condition is True: a CA
  annotation flipped by a user is re-asserted, and the reason follows the value;
- the drain record belongs to one failure: it is dropped while the machine is not Failed, so a `now`
  machine that fails again is tainted and drained again;
- a failed drain is retried `drain_retry_interval` after the last attempt, and evictions stop after the
  drain timeout (the node counts as drained once the blocking pods are gone);
- a Failed machine in our custody (preserved, or about to be) whose node is healthy again (Ready, none of
  MCM's problem conditions) is moved to Running, and planned for as Running;
- node-side leftovers (a condition not stopped) are cleaned up even without a record, and our taint never
  outlives preservation;
- invalid values are reported once each with a Warning Event (core.invalid_values), not only logged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from machine_preservation.core import conditions, events, node_fields
from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import condition_after_drain
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.decision import RELEASED, PreservationDecision, decide_preservation
from machine_preservation.core.durations import duration_or_default
from machine_preservation.core.invalid_values import report_invalid_values
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
from machine_preservation.core.preservation_record import DrainRecord, PreservationRecord, record_patch
from machine_preservation.core.preserve_value import (
    EffectivePreserveValue,
    ValueOrigin,
    effective_preserve_value,
    last_known_node,
    parse_preserve_value,
)
from machine_preservation.core.priority import priority_patch

__all__ = [
    "MachineContext",
    "condition_after_drain",
    "drain_timeout",
    "is_machines_node",
    "labelled_node",
    "node_is_healthy",
    "not_deleted",
    "plan_after_drain",
    "plan_machine",
]


# The phases of a machine whose Node has registered (MCM moves a machine out of Pending once its Node is Ready).
_HAD_A_NODE = frozenset(
    {v.MachinePhase.RUNNING, v.MachinePhase.UNKNOWN, v.MachinePhase.FAILED, v.MachinePhase.IN_PLACE_UPDATING}
)


@dataclass(frozen=True)
class MachineContext:
    """Everything one machine's plan looks at."""

    machine: Machine
    # The Node the machine's `node` label names, or why there is none: without a Node only the Machine is written.
    # The value in force is then the machine's own, or, where the label names a Node that is gone, the node's
    # value as last applied to the machine (a Node that is gone said nothing new since).
    node: Node | NoNode
    config: PreservationConfig
    now: dt.datetime
    # `priority.unpreserved_priority_ceiling` over the machine's MachineSet.
    unpreserved_priority_ceiling: int
    # The pool's machinePreserveTimeout, where one is known.
    pool_timeout: dt.timedelta | None = None
    # The pods (`namespace/name`) a drain of the node would evict now, for the condition shown while it runs.
    pods_to_evict: Sequence[str] = ()
    # The extension is being disabled for this shoot (or its Extension was deleted): a running preservation
    # stops (`StopCause.RELEASED`) with the writes of any stop (the priority restored, our CA annotation and its
    # markers where the record says we added it, the condition `Preservation stopped.`, the taint, the mirror,
    # last the record) and nothing starts. A Failed machine is not deleted and not moved to Running: once the
    # record is gone MCM replaces it as it would without the product. The preserve annotations on the Machine
    # and the Node are left as they are (not removed, not synced from the node): they are the user's intent,
    # meaningless without the extension, and in force again if it is enabled again (an auto value stays too:
    # re-enabled, auto-preservation takes it back where it is stale).
    released: bool = False

    def __post_init__(self) -> None:
        if self.node is NoNode.NOT_FOUND and not self.machine.node_name:
            raise ValueError("NoNode.NOT_FOUND stands for a node label naming a Node that does not exist")

    @property
    def existing_node(self) -> Node | None:
        return self.node if isinstance(self.node, Node) else None


def not_deleted(node: Node | None) -> Node | None:
    """The Node, unless it is being deleted: then it is gone for the plan (nothing is written to it, nothing drained).
    MCM puts a finalizer on every Node and removes it only once the Node's Machine is deleted, so the Node of a
    preserved machine that someone deleted stays, marked for deletion, for as long as the machine is kept."""
    return node if node is None or node.metadata.deletion_timestamp is None else None


def labelled_node(*, machine: Machine, found: Node | None) -> Node | NoNode:
    """The node value of a plan: `found` is the Node the machine's `node` label names (None if not found)."""
    if found is not None:
        return found
    return NoNode.NOT_FOUND if machine.node_name else NoNode.NO_LABEL


def plan_machine(context: MachineContext) -> MachinePlan:
    """Decide one machine."""
    machine, now = context.machine, context.now
    if machine.metadata.deletion_timestamp is not None or machine.phase == v.MachinePhase.TERMINATING:
        return MachinePlan()  # MCM's deletion flow owns it now
    if not context.released and (settled_at := _restored_until_settled(machine, context.config, now)) is not None:
        return MachinePlan(requeue_after=settled_at - now)

    context, steps = _with_own_node_only(context)
    verdict, recovery = _verdict(context)
    steps += recovery
    decision = verdict.decision
    if decision.preserve:
        preserve_steps, drain, retry_at = _preserve(context, verdict)
        steps += preserve_steps
        assert decision.expiry is not None  # a preserve decision always carries its expiry
        wake_at = decision.expiry if retry_at is None else min(decision.expiry, retry_at)
        return MachinePlan(steps=tuple(steps), drain=drain, requeue_after=max(wake_at - now, dt.timedelta(0)))
    steps += _stop_or_idle(context, verdict)
    return MachinePlan(steps=tuple(steps))


def _with_own_node_only(context: MachineContext) -> tuple[MachineContext, list[MachineStep]]:
    """The context, without the node where the label names another machine's node (a mistake, or an attempt to have
    us taint and drain it): that node is left alone, the machine is planned as one without a node, and an Event
    says so."""
    node = context.existing_node
    if node is None or is_machines_node(machine=context.machine, node=node):
        return context, []
    steps: list[MachineStep] = [*events.node_of_another_machine(machine=context.machine, node=node)]
    return dataclasses.replace(context, node=NoNode.NO_LABEL), steps


def _effective_value(context: MachineContext) -> EffectivePreserveValue:
    """The preserve value in force, from the Node whose annotation counts (`_value_node`) and the machine."""
    node = context.existing_node
    value_node = _value_node(context, node)
    effective = effective_preserve_value(machine=context.machine, node=value_node)
    if value_node is not node:  # a recorded value that no Node carries now: nothing on a Node to report
        effective = dataclasses.replace(effective, invalid=tuple(i for i in effective.invalid if i.kind != "Node"))
    return effective


def _decide(
    context: MachineContext, effective: EffectivePreserveValue
) -> tuple[str, PreservationDecision, list[MachineStep]]:
    """The phase the plan is for, the decision, and the writes of a recovery the decision rests on."""
    machine, node, config = context.machine, context.existing_node, context.config
    if context.released:
        return machine.phase, RELEASED, []

    def decide(phase: str) -> PreservationDecision:
        return decide_preservation(
            machine=machine,
            value=effective.value,
            phase=phase,
            config=config,
            now=context.now,
            pool_timeout=context.pool_timeout,
        )

    phase = machine.phase
    decision = decide(phase)
    recovery: list[MachineStep] = []
    # In our custody (preserved, or about to be) and Failed, but the node is healthy again: MCM has not moved
    # the phase back, so we do, and decide on Running. Not while releasing: the phase is MCM's business then.
    in_custody = machine.preservation is not None or decision.preserve
    if phase == v.MachinePhase.FAILED and in_custody and node is not None and node_is_healthy(node=node, config=config):
        recovery = [SetMachinePhase(phase=v.MachinePhase.RUNNING), *events.recovered(machine=machine, node=node)]
        phase = v.MachinePhase.RUNNING
        decision = decide(phase)
    record = machine.preservation
    node_gone = context.node is NoNode.NOT_FOUND and record is not None and record.node_gone_since is not None
    if node_gone and not decision.preserve:
        # MCM asked to delete the machine when its Node went, and was denied while we kept it: the end of the
        # preservation completes that delete, whatever the phase (MCM's next try may be minutes away).
        decision = dataclasses.replace(decision, delete_machine=True)
    return phase, decision, recovery


def _verdict(context: MachineContext) -> tuple[_Verdict, list[MachineStep]]:
    """What the plan decided for the machine, and the writes of a recovery it rests on (they come first)."""
    machine = context.machine
    effective = _effective_value(context)
    phase, decision, recovery = _decide(context, effective)
    machine_patch, invalid_events = (
        (PatchMachineAnnotations(), ())  # the Machine goes: nothing to write on it
        if decision.delete_machine
        else _machine_annotations(
            machine=machine,
            effective=effective,
            decision=decision,
            ceiling=context.unpreserved_priority_ceiling,
            released=context.released,
            machine_speaks=_machine_speaks(context),
        )
    )
    verdict = _Verdict(
        phase=phase,
        effective=effective,
        decision=decision,
        machine_patch=machine_patch,
        invalid_events=invalid_events,
    )
    return verdict, recovery


def plan_after_drain(
    *,
    machine: Machine,
    node: Node,
    drain: DrainNode,
    drained: bool,
    blocking_pods: Sequence[str],
    now: dt.datetime,
    blocked_by: Sequence[str] = (),
) -> MachinePlan:
    """What the shell writes once a DrainNode ended: the condition, the Node's fields, the drain record, the
    outcome's Events. `blocked_by` names the PodDisruptionBudgets (`namespace/name`) that refused evictions.

    The condition and the Node's fields come first: they are what an operator (and the autoscaler's users) wait
    for, and the record's drain only paces the next attempt, so if its write fails after theirs, the next plan
    drains again and finds the node as it left it (an empty node at once). An eviction attempt always updates the
    record (its time paces the next attempt after a failure). A look at a node whose evictions were given up
    (`evict` False) that finds it still blocked writes only when the blocking pods changed, so it costs nothing in
    steady state; it evicts nothing, so the budgets named by the last attempt stay.
    """
    record = drain.record
    if record is None:
        raise ValueError("DrainNode.record is required to record the drain outcome")
    steps: list[MachineStep] = []
    outcome = _drain_outcome(record, evicted=drain.evict, drained=drained, now=now)
    # The plan wrote `record` before its DrainNode, so the machine holds exactly that record now (`machine` is
    # the object as it was before the plan): only the drain's keys change.
    to_set, to_remove = record_patch(current=record.annotations(), record=dataclasses.replace(record, drain=outcome))
    condition = condition_after_drain(
        node=_as_left_by(node, drain.alongside), drain=drain, drained=drained, blocking_pods=blocking_pods, now=now
    )
    if condition is not None:
        steps.append(condition)
    fields = node_fields.fields_after_drain(
        before=drain.node_fields,
        drained=drained,
        pods_left=len(blocking_pods),
        blocked_by=blocked_by if drain.evict else None,
    )
    if not _is_empty(fields_patch := node_fields.fields_patch(current=drain.node_fields, wanted=fields)):
        steps.append(fields_patch)
    if to_set or to_remove:
        steps.append(PatchMachineAnnotations(set=to_set, remove=to_remove))
    # The Events go with a new condition or a new kind of outcome in the record: an attempt whose condition was
    # written but whose record was not (a conflict) left the condition as this one writes it, and its Events unsent.
    kind_changed = (record.drain.outcome if record.drain else None) != (outcome.outcome if outcome else None)
    if condition is not None or kind_changed:
        steps += events.drain_outcome(
            machine=machine,
            node=node,
            drained=drained,
            blocking_pods=blocking_pods,
            gave_up_after=drain.timeout if not drained and not drain.evict else None,
        )
    return MachinePlan(steps=tuple(steps))


def _drain_outcome(record: PreservationRecord, *, evicted: bool, drained: bool, now: dt.datetime) -> DrainRecord | None:
    """The record's drain after an attempt: drained, failing since the first failed attempt of this failure, or,
    for a look at a node whose evictions were given up, as it was."""
    if drained:
        return DrainRecord(outcome=v.DrainOutcome.DRAINED)
    if not evicted:
        return record.drain  # evictions given up: nothing new to record
    failing_since = record.drain.failing_since if record.drain is not None else None
    return DrainRecord(outcome=v.DrainOutcome.FAILED, failing_since=failing_since or now, last_attempt=now)


def _as_left_by(node: Node, written: Sequence[MachineStep]) -> Node:
    """`node` with the Preserved condition the drain's `alongside` steps wrote (the "being drained" one), which the
    outcome's condition replaces."""
    step = next((s for s in reversed(written) if isinstance(s, SetPreservedCondition)), None)
    return node if step is None else conditions.written(node, step)


# The phases MCM gives a Machine object it has just been handed before it knows again what the machine is.
_SETTLING = frozenset({"", v.MachinePhase.PENDING, v.MachinePhase.UNKNOWN})


def _restored_until_settled(machine: Machine, config: PreservationConfig, now: dt.datetime) -> dt.datetime | None:
    """For a preserved machine whose Machine object was re-created with its record (Gardener's Worker restore after a
    control-plane migration: the record predates the object) and that MCM has not placed again (no phase, Pending
    or Unknown): the expiry, until which the plan waits. A `when-failed` machine restored while Failed passes
    through those phases before MCM finds it Failed again; read as a recovery they would end its preservation.
    Both times are whole seconds: a record of the object's own second may predate it (preserved, then moved within
    that second), and is waited for too. None: nothing to wait for."""
    record, created = machine.preservation, machine.metadata.creation_timestamp
    if record is None or record.damaged or created is None or record.since > created:
        return None
    expiry = record.expiry(max_timeout=config.max_preserve_timeout)
    return expiry if machine.phase in _SETTLING and expiry > now else None


def _machine_speaks(context: MachineContext) -> bool:
    """The Node is gone and the machine carries a user's value: nobody can annotate a Node that is gone, so the
    machine's word counts (and its record of the node's value goes)."""
    raw = context.machine.metadata.annotations.get(v.PRESERVE_ANNOTATION)
    return context.node is NoNode.NOT_FOUND and raw in v.USER_PRESERVE_VALUES


def _value_node(context: MachineContext, node: Node | None) -> Node | None:
    """The Node whose preserve annotation counts. A Node that is gone is taken as the machine recorded it (unless the
    machine speaks for it), and so is one that came back (a Node of the same name registered again: a new object,
    which carries no annotation of the user's) until the plan has written the value back onto it."""
    if context.node is NoNode.NOT_FOUND:
        return None if _machine_speaks(context) else last_known_node(context.machine)
    record = context.machine.preservation
    if node is None or record is None or record.node_gone_since is None:
        return node
    if v.PRESERVE_ANNOTATION in node.metadata.annotations:
        return node  # the new Node says something of its own
    known = last_known_node(context.machine)
    if known is None or not known.metadata.annotations:
        return node
    annotations = {**node.metadata.annotations, **known.metadata.annotations}
    return node.model_copy(update={"metadata": node.metadata.model_copy(update={"annotations": annotations})})


def is_machines_node(*, machine: Machine, node: Node) -> bool:
    """Whether `node` backs `machine`: their providerIDs agree. Where either is not set yet, nothing tells them
    apart and the label is taken at its word."""
    return (
        not machine.spec.provider_id or not node.spec.provider_id or machine.spec.provider_id == node.spec.provider_id
    )


def health_to_confirm(*, machine: Machine, node: Node | None, config: PreservationConfig) -> bool:
    """Whether the plan would take a healthy-looking Node at its word against a Failed phase: it would move the
    machine back to Running. MCM failed the machine from its own view of the node, and the Node's watch may run
    behind the Machine's (a watch restarting, a busy shoot API server), so the shell reads the Node afresh before
    planning; a late cache would otherwise undo the failure and delay the preservation by a health timeout."""
    return machine.phase == v.MachinePhase.FAILED and node is not None and node_is_healthy(node=node, config=config)


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
    *,
    machine: Machine,
    effective: EffectivePreserveValue,
    decision: PreservationDecision,
    ceiling: int,
    released: bool = False,
    machine_speaks: bool = False,
) -> tuple[PatchMachineAnnotations, tuple[RecordEvent, ...]]:
    """All Machine annotation changes of this plan as one write, and the Events that go with it.

    Releasing, only the priority is restored: the preserve values stay as the user left them, and invalid ones
    are no longer reported (nothing reads them any more)."""
    if released:
        return priority_patch(machine=machine, preserved=False, auto=False, ceiling=ceiling), ()
    annotations = machine.metadata.annotations
    changes: list[PatchMachineAnnotations] = []
    if decision.remove_annotations:
        present = tuple(
            key for key in (v.PRESERVE_ANNOTATION, v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION) if key in annotations
        )
        changes.append(PatchMachineAnnotations(remove=present))
    elif effective.node_in_control:
        changes.append(_sync_from_node(machine=machine, effective=effective))
    elif machine_speaks and v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION in annotations:
        changes.append(PatchMachineAnnotations(remove=(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION,)))
    changes.append(
        priority_patch(
            machine=machine, preserved=decision.preserve, auto=effective.value == v.PreserveValue.AUTO, ceiling=ceiling
        )
    )
    # A machine value this plan removes (expiry) is no longer there to report.
    removes_machine_value = any(v.PRESERVE_ANNOTATION in change.remove for change in changes)
    invalid = [i for i in effective.invalid if not (i.kind == "Machine" and removes_machine_value)]
    record, invalid_events = report_invalid_values(machine=machine, invalid=invalid)
    changes.append(record)
    return _merge(changes), invalid_events


def _sync_from_node(*, machine: Machine, effective: EffectivePreserveValue) -> PatchMachineAnnotations:
    """The node decides: the machine's own value goes, last-applied := the node's value.

    An invalid machine value is left alone (it is reported instead), and so is the auto value the node
    lets through (core.preserve_value).
    """
    annotations = machine.metadata.annotations
    node_value = effective.node_raw or ""
    machine_raw = annotations.get(v.PRESERVE_ANNOTATION)
    keeps_auto = effective.source == ValueOrigin.MACHINE
    remove: tuple[str, ...] = ()
    if machine_raw is not None and not keeps_auto and parse_preserve_value(machine_raw) is not None:
        remove = (v.PRESERVE_ANNOTATION,)
    current_last_applied = annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "")
    set_ = {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: node_value} if current_last_applied != node_value else {}
    return PatchMachineAnnotations(set=set_, remove=remove)


@dataclass(frozen=True)
class _Verdict:
    """What the plan decided for the machine: the start and the stop writes both follow it."""

    phase: str  # Running once the plan recovers a Failed machine
    effective: EffectivePreserveValue
    decision: PreservationDecision
    machine_patch: PatchMachineAnnotations  # every Machine annotation change of the plan, as one write
    invalid_events: tuple[RecordEvent, ...]


def _preserve(
    context: MachineContext, verdict: _Verdict
) -> tuple[list[MachineStep], DrainNode | None, dt.datetime | None]:
    """The writes that make the machine preserved, the drain that follows them (if any), and when a waiting drain
    retry is due (else None)."""
    node, expiry = context.existing_node, verdict.decision.expiry
    assert expiry is not None  # a preserve decision always carries its expiry
    ca_patch = _ca_annotation_on_preserve(node) if node is not None else PatchNodeAnnotations()
    record, gone_events = _record_on_preserve(context, verdict, expiry=expiry, adds_ca=not _is_empty(ca_patch))
    steps, record, announced = _machine_steps_on_preserve(context, verdict, record, expiry=expiry)
    steps += gone_events
    if node is None:
        return _acknowledged(steps, announced), None, None
    node_steps, record, fields = _node_steps_on_preserve(
        context, verdict, node, record, ca_patch=ca_patch, expiry=expiry
    )
    steps += node_steps
    failed = verdict.phase == v.MachinePhase.FAILED
    if failed and (record.drain is None or record.drain.outcome != v.DrainOutcome.DRAINED):
        return _drain_on_preserve(
            context, verdict, node, record, fields, steps=steps, announced=announced, expiry=expiry
        )
    # Not Failed: also rewrites a "drained" message, so the next failure is drained again.
    message = conditions.drained_message(expiry) if failed else conditions.preserved_until_message(expiry)
    condition = conditions.condition_step(
        current=node.preserved_condition,
        status=conditions.TRUE,
        reason=conditions.reason_for(verdict.effective.value),
        message=message,
        now=context.now,
    )
    if condition is not None:
        steps.append(condition)
    return _acknowledged(steps, announced), None, None


def _record_on_preserve(
    context: MachineContext, verdict: _Verdict, *, expiry: dt.datetime, adds_ca: bool
) -> tuple[PreservationRecord, tuple[RecordEvent, ...]]:
    """The record the preservation is to carry (its start pending announcement, the CA annotation it adds, the drain
    of the current failure, since when the Node is gone), and the Events of a Node noticed gone."""
    record = verdict.decision.record
    assert record is not None  # a preserve decision always carries its record
    if verdict.phase != v.MachinePhase.FAILED and record.drain is not None:
        record = dataclasses.replace(record, drain=None)  # the drain belongs to one failure
    # A Node that is gone is noticed in the record (where operators and the deletion guard look) and announced once.
    # A machine being created (Pending, CrashLoopBackOff, no phase yet) has no Node yet: nothing is gone.
    gone_events: tuple[RecordEvent, ...] = ()
    if context.node is NoNode.NOT_FOUND and verdict.phase in _HAD_A_NODE and record.node_gone_since is None:
        gone_since = context.now.astimezone(dt.UTC).replace(microsecond=0)
        record = dataclasses.replace(record, node_gone_since=gone_since)
        gone_events = events.node_gone(machine=context.machine, since=gone_since, expiry=expiry)
    if verdict.decision.starts:
        record = dataclasses.replace(record, announcement_pending=True)
    if adds_ca:
        record = dataclasses.replace(record, added_ca_annotation=True)  # recorded before the node write
    return record, gone_events


def _machine_steps_on_preserve(
    context: MachineContext, verdict: _Verdict, record: PreservationRecord, *, expiry: dt.datetime
) -> tuple[list[MachineStep], PreservationRecord, bool]:
    """The Machine's writes of a preservation: its annotations with the record, the start's announcement, the mirror
    and the invalid values' Events; the record as the announcement leaves it, and whether it is announced now."""
    machine = context.machine
    to_set, to_remove = record_patch(current=machine.metadata.annotations, record=record)
    steps: list[MachineStep] = []
    machine_patch = _merge([PatchMachineAnnotations(set=to_set, remove=to_remove), verdict.machine_patch])
    if not _is_empty(machine_patch):
        steps.append(machine_patch)
    # The start is announced right after the record: once the record is written the start is over, so a
    # later write that fails (the mirror's resourceVersion conflicts whenever MCM updated the status) must not
    # come between them. The record says the announcement is pending until the Events are recorded, so a
    # restart in between announces it (the Events are named after the start: never twice).
    announced = record.announcement_pending
    if announced:
        steps += events.started(
            machine=machine, node=context.node, effective=verdict.effective, since=record.since, expiry=expiry
        )
        record = dataclasses.replace(record, announcement_pending=False)
    if context.config.mirror_status and machine.mirrored_expiry != expiry:
        steps.append(SetPreserveExpiry(expiry=expiry))
    steps += verdict.invalid_events
    return steps, record, announced


def _node_steps_on_preserve(
    context: MachineContext,
    verdict: _Verdict,
    node: Node,
    record: PreservationRecord,
    *,
    ca_patch: PatchNodeAnnotations,
    expiry: dt.datetime,
) -> tuple[list[MachineStep], PreservationRecord, dict[str, str]]:
    """The Node's annotations (the CA annotation, the preservation's fields, the value written back onto a Node that
    returned) and taint, and the record's note of a gone Node removed once it is back; the record as they leave it,
    and the fields they leave on the Node."""
    failed = verdict.phase == v.MachinePhase.FAILED
    steps: list[MachineStep] = []
    current = node.metadata.annotations
    # The record's note of a gone Node goes below; the fields mirror only since, until and by, which it leaves.
    fields = node_fields.preserved_fields(record=record, expiry=expiry, failed=failed, current=current)
    fields_patch = node_fields.fields_patch(current=current, wanted=fields)
    node_patch = PatchNodeAnnotations(
        set={**ca_patch.set, **fields_patch.set, **_value_back_on_node(context, verdict)},
        remove=(*ca_patch.remove, *fields_patch.remove),
    )
    if not _is_empty(node_patch):
        steps.append(node_patch)
    if failed != node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
        steps.append(SetPreservedTaint(present=failed))
    back_since = record.node_gone_since
    if back_since is not None:
        record = dataclasses.replace(record, node_gone_since=None)
        steps.append(PatchMachineAnnotations(remove=(v.PRESERVED_NODE_GONE_SINCE_ANNOTATION,)))
        steps += events.node_returned(machine=context.machine, node=node, since=back_since, expiry=expiry)
    return steps, record, fields


def _drain_on_preserve(
    context: MachineContext,
    verdict: _Verdict,
    node: Node,
    record: PreservationRecord,
    fields: dict[str, str],
    *,
    steps: list[MachineStep],
    announced: bool,
    expiry: dt.datetime,
) -> tuple[list[MachineStep], DrainNode | None, dt.datetime | None]:
    """For a Failed machine not drained yet: `steps` and the drain that follows them, or, while a failed attempt
    waits for its retry, `steps` with the condition kept and when the retry is due."""
    config, now, drain = context.config, context.now, record.drain
    reason = conditions.reason_for(verdict.effective.value)
    current = node.preserved_condition
    retry_at = drain.last_attempt + config.drain_retry_interval if drain and drain.last_attempt else None
    if retry_at is not None and retry_at > now:
        # Waiting for the next attempt after a failed one: the condition keeps the blockers it names, only
        # the reason follows the value meanwhile.
        waiting = conditions.condition_step(
            current=current,
            status=conditions.FALSE,
            reason=reason,
            message=current.message if current is not None else conditions.drain_failed_message(expiry, ()),
            now=now,
        )
        return _acknowledged([*steps, *([waiting] if waiting is not None else [])], announced), None, retry_at
    timeout = drain_timeout(machine=context.machine, config=config)
    gave_up = drain is not None and drain.failing_since is not None and now >= drain.failing_since + timeout
    alongside: list[MachineStep] = []
    if drain is None:
        # The first attempt: say what it waits for while it runs (an attempt may take minutes).
        draining = conditions.condition_step(
            current=current,
            status=conditions.FALSE,
            reason=reason,
            message=conditions.draining_message(expiry, context.pods_to_evict),
            now=now,
        )
        alongside += [draining] if draining is not None else []
    # The record, the CA annotation and the taint come first (new pods stay away); what only tells about the
    # drain is written while the evictions run.
    return (
        steps,
        DrainNode(
            record=record,
            reason=reason,
            expiry=expiry,
            timeout=timeout,
            evict=not gave_up,
            alongside=tuple(_acknowledged(alongside, announced)),
            node_fields=fields,
        ),
        None,
    )


def _value_back_on_node(context: MachineContext, verdict: _Verdict) -> dict[str, str]:
    """For a Node back after it was gone: the preserve value it was preserved by, to write back onto it before the
    record forgets that it was gone (else the next plan would read the annotation's absence as "stop")."""
    record, node, effective = context.machine.preservation, context.existing_node, verdict.effective
    if node is None or record is None or record.node_gone_since is None or verdict.decision.remove_annotations:
        return {}
    if v.PRESERVE_ANNOTATION in node.metadata.annotations or effective.source != ValueOrigin.NODE:
        return {}
    return {v.PRESERVE_ANNOTATION: effective.node_raw} if effective.node_raw else {}


def _acknowledged(steps: list[MachineStep], announced: bool) -> list[MachineStep]:
    """The writes with the removal of the pending announcement last: it waits for the Events to be recorded, and
    no other write needs to wait for it, so the node is protected without waiting for them."""
    if not announced:
        return steps
    return [*steps, PatchMachineAnnotations(remove=(v.PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION,), after_events=True)]


def _stop_or_idle(context: MachineContext, verdict: _Verdict) -> list[MachineStep]:
    """The writes that end a preservation (if there is one to end) and keep an unpreserved machine clean."""
    machine, node, config, now = context.machine, context.existing_node, context.config, context.now
    effective, decision = verdict.effective, verdict.decision
    record = machine.preservation
    current = node.preserved_condition if node is not None else None
    # The record is the state; a condition still saying "preserved" is a leftover to clean up as well.
    stopping = record is not None or conditions.shows_preservation(current)
    steps: list[MachineStep] = []
    if not _is_empty(verdict.machine_patch):
        steps.append(verdict.machine_patch)
    steps += verdict.invalid_events
    if node is not None:
        if stopping:
            node_patch = _node_annotations_on_stop(
                node=node,
                effective=effective,
                decision=decision,
                added_ca=record is not None and record.added_ca_annotation,
            )
            node_patch = PatchNodeAnnotations(
                set={**node_patch.set, **_value_back_on_node(context, verdict)}, remove=node_patch.remove
            )
            if not _is_empty(node_patch):
                steps.append(node_patch)
        elif leftovers := tuple(key for key in node_fields.STOP_REMOVES if key in node.metadata.annotations):
            steps.append(PatchNodeAnnotations(remove=leftovers))  # no preservation: its fields never outlive it
        # Right after the annotations: the executor writes the two as one.
        if node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
            steps.append(SetPreservedTaint(present=False))
        if stopping:
            stopped = conditions.condition_step(
                current=current,
                status=conditions.FALSE,
                reason=v.ConditionReason.PRESERVATION_STOPPED,
                message="",
                now=now,
            )
            if current is not None and stopped is not None:
                steps.append(stopped)
    if record is not None and decision.delete_machine:
        steps.append(DeleteMachine())  # with its record: a failed delete is retried, never re-preserved
    elif record is not None:
        if config.mirror_status and machine.mirrored_expiry is not None:
            steps.append(SetPreserveExpiry(expiry=None))
        _, to_remove = record_patch(current=machine.metadata.annotations, record=None)
        steps.append(PatchMachineAnnotations(remove=to_remove))  # last: until here the stop is repeatable
    if record is not None:
        assert decision.stop_cause is not None  # a stop decision always says why
        steps += events.stopped(
            machine=machine,
            node=node,
            cause=decision.stop_cause,
            deleting=decision.delete_machine,
            node_gone=context.node is NoNode.NOT_FOUND,
            expiry=record.expiry(max_timeout=config.max_preserve_timeout),
        )
    return steps


def _ca_annotation_on_preserve(node: Node) -> PatchNodeAnnotations:
    """The node write that makes the CA annotation ours, or nothing where it is ours or someone else's already.

    Missing or not `"true"`: we add it with our marker. `"true"` with MCM's marker: MCM's rollout annotation (or
    our marker of an earlier version of the product), which MCM v0.61 removes from a complete MachineDeployment's
    nodes; we take it over by swapping the marker in one write, so the annotation itself never goes.
    """
    annotations = node.metadata.annotations
    ca_true = annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == v.CA_SCALE_DOWN_DISABLED_VALUE
    mcm_marked = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION in annotations
    if ca_true and not mcm_marked:
        return PatchNodeAnnotations()
    wanted = {
        v.CA_SCALE_DOWN_DISABLED_ANNOTATION: v.CA_SCALE_DOWN_DISABLED_VALUE,
        v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION: v.CA_SCALE_DOWN_DISABLED_VALUE,
    }
    return PatchNodeAnnotations(
        set={key: value for key, value in wanted.items() if annotations.get(key) != value},
        remove=(v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,) if mcm_marked else (),
    )


def _node_annotations_on_stop(
    *, node: Node, effective: EffectivePreserveValue, decision: PreservationDecision, added_ca: bool
) -> PatchNodeAnnotations:
    annotations = node.metadata.annotations
    remove: list[str] = []
    markers = (v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION)
    if added_ca and any(annotations.get(key) == v.CA_SCALE_DOWN_DISABLED_VALUE for key in markers):
        # Ours: this preservation added it (its record says so), and a marker is still there (without one,
        # someone took the annotation over since). MCM's marker counts too: an earlier version of the product
        # wrote it, or MCM's rollout did, which would remove the annotation itself once the rollout completes.
        remove += [key for key in (v.CA_SCALE_DOWN_DISABLED_ANNOTATION, *markers) if key in annotations]
    remove += [key for key in node_fields.STOP_REMOVES if key in annotations]
    on_node = effective.node_raw and v.PRESERVE_ANNOTATION in annotations  # not a value only recorded for it
    if decision.remove_annotations and effective.source == ValueOrigin.NODE and on_node:
        remove.append(v.PRESERVE_ANNOTATION)
    return PatchNodeAnnotations(remove=tuple(remove))
