"""What the objects look like after a plan's steps: an in-memory twin of the controller's API writes.

Tests use it to check that planning again after a plan yields nothing. DrainNode changes no object here: its
outcome is the condition of `plan_after_drain`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from machine_preservation.core import conditions
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineSet, Node, Taint
from machine_preservation.core.plan import (
    DeleteMachine,
    MachinePlan,
    MachineSetPlan,
    MachineStep,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    SetMachinePhase,
    SetPreservedCondition,
    SetPreservedTaint,
    SetPreserveExpiry,
)


def patched_annotations(
    annotations: Mapping[str, str], patch: PatchMachineAnnotations | PatchNodeAnnotations
) -> dict[str, str]:
    result = {key: value for key, value in annotations.items() if key not in patch.remove}
    result.update(patch.set)
    return result


def _with_machine_annotations(machine: Machine, patch: PatchMachineAnnotations) -> Machine:
    metadata = machine.metadata.model_copy(
        update={"annotations": patched_annotations(machine.metadata.annotations, patch)}
    )
    return machine.model_copy(update={"metadata": metadata})


def _with_current_status(machine: Machine, **changes: object) -> Machine:
    current = machine.status.current_status.model_copy(update=changes)
    status = machine.status.model_copy(update={"current_status": current})
    return machine.model_copy(update={"status": status})


def apply_machine_step(machine: Machine, step: MachineStep, now: dt.datetime) -> Machine:
    """The Machine after `step` (unchanged for Node steps, Events and drains)."""
    if isinstance(step, PatchMachineAnnotations):
        return _with_machine_annotations(machine, step)
    if isinstance(step, SetPreserveExpiry):
        return _with_current_status(machine, preserve_expiry_time=step.expiry, last_update_time=now)
    if isinstance(step, SetMachinePhase):
        return _with_current_status(machine, phase=step.phase, last_update_time=now)
    if isinstance(step, DeleteMachine):
        return machine.model_copy(update={"metadata": machine.metadata.model_copy(update={"deletion_timestamp": now})})
    return machine


def apply_node_step(node: Node, step: MachineStep, now: dt.datetime) -> Node:
    """The Node after `step` (unchanged for Machine steps, Events and drains)."""
    if isinstance(step, PatchNodeAnnotations):
        metadata = node.metadata.model_copy(
            update={"annotations": patched_annotations(node.metadata.annotations, step)}
        )
        return node.model_copy(update={"metadata": metadata})
    if isinstance(step, SetPreservedTaint):
        kept = [t for t in node.spec.taints if (t.key, t.effect) != (v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)]
        ours = [Taint(key=v.PRESERVED_TAINT_KEY, effect=v.PRESERVED_TAINT_EFFECT, time_added=now)]
        taints = kept + ours if step.present else kept
        return node.model_copy(update={"spec": node.spec.model_copy(update={"taints": taints})})
    if isinstance(step, SetPreservedCondition):
        return conditions.written(node, step)
    return node


def apply_machine_plan(
    *, machine: Machine, node: Node | None, plan: MachinePlan, now: dt.datetime
) -> tuple[Machine, Node | None]:
    for step in (*plan.steps, *(plan.drain.alongside if plan.drain is not None else ())):
        machine = apply_machine_step(machine, step, now)
        if node is not None:
            node = apply_node_step(node, step, now)
    return machine, node


def apply_machine_set_plan(
    *, machine_set: MachineSet, machines: Sequence[Machine], plan: MachineSetPlan
) -> tuple[MachineSet, list[Machine]]:
    patched = [
        _with_machine_annotations(m, plan.machine_annotations[m.metadata.name])
        if m.metadata.name in plan.machine_annotations
        else m
        for m in machines
    ]
    if plan.status is None:
        return machine_set, patched
    status = machine_set.status.model_copy(
        update={
            "auto_preserve_failed_machine_count": plan.status.auto_preserve_failed_machine_count,
            "preserved_failed_replicas": plan.status.preserved_failed_replicas,
        }
    )
    return machine_set.model_copy(update={"status": status}), patched
