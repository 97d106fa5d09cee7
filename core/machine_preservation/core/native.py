"""With an MCM that preserves natively (v0.62+): hand our running preservations over, then only observe.

MCM then owns the lifecycle (expiry in `status.currentStatus.preserveExpiryTime`, condition, taint, CA
annotation, drain, auto-preservation with the value `auto-preserved`); the controller writes none of it.

Hand-over: a machine still carrying our record (preserved before MCM was upgraded) gets its expiry written
where MCM reads it and our auto value respelled as MCM's (MCM ignores `auto-preserve` and would stop the
preservation), then our record is removed, in that order, so a crash in between repeats the hand-over. The
priority our preservation raised is restored in the same write as the record's removal: MCM sorts preserved
machines last itself, and once we only observe nothing would lower it after MCM's preservation ends. Our taint
(`node.machine.sapcloud.io/preserved`) goes before the record: MCM v0.62 does not know it (it cordons instead)
and would never remove it, so it would outlive the preservation. The node keeps our condition and CA
annotation: they use MCM's keys and messages, so MCM carries on from them (a drained node is not drained again).
Our ownership marker of the CA annotation becomes MCM's (`…-by-mcm`), in one write that leaves the annotation
itself in place, so that MCM removes it by that marker when its preservation stops, as it would its own; the same
write removes the Node's fields of our preservation (core.node_fields), which would outlive our record. A node
whose providerID is not the machine's is not touched.

Observation: Events from what MCM's objects show, each recorded once (`RecordEvent.once`): a preservation
starting (the expiry appears; the message names it, so each preservation is distinct) and ending (the node's
condition turns to `Preservation stopped.`; named by its transition time).
"""

from __future__ import annotations

import datetime as dt

from machine_preservation.core import events
from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import go_time_string, is_stopped
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.lifecycle import is_machines_node
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.node_fields import FIELDS
from machine_preservation.core.plan import (
    MachinePlan,
    MachineStep,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    SetPreservedTaint,
    SetPreserveExpiry,
)
from machine_preservation.core.preservation_record import record_patch
from machine_preservation.core.priority import priority_patch


def plan_native(*, machine: Machine, node: Node | None, config: PreservationConfig) -> MachinePlan:
    """The hand-over writes of a machine that still has our record; else only the observed Events."""
    if machine.metadata.deletion_timestamp is not None or machine.phase == v.MachinePhase.TERMINATING:
        return MachinePlan()
    record = machine.preservation
    if record is not None:
        return _hand_over(machine=machine, node=node, config=config)
    return MachinePlan(steps=_observed(machine=machine, node=node))


def _hand_over(*, machine: Machine, node: Node | None, config: PreservationConfig) -> MachinePlan:
    record = machine.preservation
    assert record is not None
    expiry = record.expiry(max_timeout=config.max_preserve_timeout)
    steps: list[MachineStep] = []
    if machine.mirrored_expiry != expiry:
        steps.append(SetPreserveExpiry(expiry=expiry))
    if node is not None and not is_machines_node(machine=machine, node=node):
        node = None
    patch = _node_patch_on_hand_over(node) if node is not None else None
    if patch is not None and (patch.set or patch.remove):
        steps.append(patch)
    # Right after the annotations: the executor writes the two as one.
    if node is not None and node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
        steps.append(SetPreservedTaint(present=False))
    annotations = machine.metadata.annotations
    respell = (
        {v.PRESERVE_ANNOTATION: v.UPSTREAM_AUTO_PRESERVE_VALUE}
        if annotations.get(v.PRESERVE_ANNOTATION) == v.PreserveValue.AUTO.value
        else {}
    )
    _, remove = record_patch(current=annotations, record=None)
    restore = priority_patch(machine=machine, preserved=False, auto=False, ceiling=v.DEFAULT_MACHINE_PRIORITY)
    steps.append(PatchMachineAnnotations(set={**respell, **restore.set}, remove=(*restore.remove, *remove)))
    steps += events.on_machine_and_node(
        machine=machine,
        node=node,
        event_type=v.EventType.NORMAL,
        reason=v.EventReason.PRESERVATION_HANDED_OVER,
        message=(
            f"Preservation until {go_time_string(expiry)} handed over to machine-controller-manager, "
            "which preserves machines itself."
        ),
    )
    return MachinePlan(steps=tuple(steps))


def _node_patch_on_hand_over(node: Node) -> PatchNodeAnnotations:
    """Our CA marker made MCM's, and the Node's fields of our preservation removed (they tell of our record, which
    goes; MCM tells its own preservation by its condition and expiry). The evidence's name stays with its writer."""
    annotations = node.metadata.annotations
    ours = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION in annotations
    return PatchNodeAnnotations(
        set={v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: v.CA_SCALE_DOWN_DISABLED_VALUE} if ours else {},
        remove=(
            *((v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,) if ours else ()),
            *(key for key in FIELDS if key in annotations),
        ),
    )


def _observed(*, machine: Machine, node: Node | None) -> tuple[MachineStep, ...]:
    expiry = machine.mirrored_expiry
    if expiry is not None:
        return events.observed(
            machine=machine,
            node=node,
            reason=v.EventReason.PRESERVATION_STARTED,
            message=f"machine-controller-manager preserves the machine until {go_time_string(expiry)}.",
        )
    condition = node.preserved_condition if node is not None else None
    if condition is not None and is_stopped(condition) and condition.last_transition_time is not None:
        return events.observed(
            machine=machine,
            node=node,
            reason=v.EventReason.PRESERVATION_STOPPED,
            message=(
                "machine-controller-manager stopped the preservation at "
                f"{go_time_string(condition.last_transition_time)}."
            ),
        )
    return ()


def observed_expiry(machine: Machine, now: dt.datetime) -> dt.datetime | None:
    """MCM's expiry while it is in the future (for metrics)."""
    expiry = machine.mirrored_expiry
    return expiry if expiry is not None and expiry > now else None
