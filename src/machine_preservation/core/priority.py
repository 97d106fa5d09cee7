"""Scale-down priority of preserved machines (`machinepriority.machine.sapcloud.io`).

MCM deletes machines of lower priority first (default 3; the cluster-autoscaler marks a machine for deletion
with 1). A preserved machine gets a priority above every unpreserved machine of its MachineSet: the
*ceiling* (the highest priority among the others) + 1 when auto-preserved, + 2 when preserved by a user, so
a scale-down takes unpreserved machines first, then auto-preserved ones, then manual ones. Replica counts
are still honoured: MCM deletes preserved machines when it must.

- The value before raising is remembered in LAST_MACHINE_PRIORITY_ANNOTATION (`""` = there was none) and
  restored when preservation ends; a machine carrying that record counts with its remembered value.
- A value below the default (CA's deletion mark) is never raised, and never overwritten by a restore.
- The ceiling leaves out the machine itself and every preserved machine, so a machine's raised value does
  not depend on its own or other raised values (no feedback, one write per change).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine
from machine_preservation.core.plan import PatchMachineAnnotations

AUTO_PRESERVED_STEP = 1
MANUALLY_PRESERVED_STEP = 2


def parse_priority(raw: str | None) -> int:
    """The priority MCM reads from the annotation: the default when absent or not an integer."""
    if raw is None:
        return v.DEFAULT_MACHINE_PRIORITY
    try:
        return int(raw)
    except ValueError:
        return v.DEFAULT_MACHINE_PRIORITY


def own_priority(machine: Machine) -> int:
    """The machine's priority apart from preservation: the remembered one while we have raised it."""
    annotations = machine.metadata.annotations
    if v.LAST_MACHINE_PRIORITY_ANNOTATION in annotations:
        return parse_priority(annotations[v.LAST_MACHINE_PRIORITY_ANNOTATION] or None)
    return parse_priority(annotations.get(v.MACHINE_PRIORITY_ANNOTATION))


def unpreserved_priority_ceiling(*, machine: Machine, machine_set_machines: Sequence[Machine], now: dt.datetime) -> int:
    """The highest own priority among the *other* unpreserved, not deleted machines (at least the default)."""
    others = [
        own_priority(m)
        for m in machine_set_machines
        if m.metadata.name != machine.metadata.name
        and m.metadata.deletion_timestamp is None
        and not (m.preserve_expiry_time is not None and m.preserve_expiry_time > now)
    ]
    return max([v.DEFAULT_MACHINE_PRIORITY, *others])


def preserved_priority(*, ceiling: int, auto: bool) -> int:
    return ceiling + (AUTO_PRESERVED_STEP if auto else MANUALLY_PRESERVED_STEP)


def priority_patch(*, machine: Machine, preserved: bool, auto: bool, ceiling: int) -> PatchMachineAnnotations:
    """The annotation changes that give the machine its priority (empty when it already has it)."""
    annotations = machine.metadata.annotations
    current_raw = annotations.get(v.MACHINE_PRIORITY_ANNOTATION)
    below_default = parse_priority(current_raw) < v.DEFAULT_MACHINE_PRIORITY
    remembered = annotations.get(v.LAST_MACHINE_PRIORITY_ANNOTATION)
    if preserved:
        if below_default:
            return PatchMachineAnnotations()  # the CA's deletion mark (or a user's low value) wins
        target = str(preserved_priority(ceiling=ceiling, auto=auto))
        if remembered is None:
            return PatchMachineAnnotations(
                set={v.MACHINE_PRIORITY_ANNOTATION: target, v.LAST_MACHINE_PRIORITY_ANNOTATION: current_raw or ""}
            )
        if current_raw != target:
            return PatchMachineAnnotations(set={v.MACHINE_PRIORITY_ANNOTATION: target})
        return PatchMachineAnnotations()
    if remembered is None:
        return PatchMachineAnnotations()
    if below_default:  # a deletion mark set while preserved stays
        return PatchMachineAnnotations(remove=(v.LAST_MACHINE_PRIORITY_ANNOTATION,))
    if remembered == "":  # the machine had no priority before
        return PatchMachineAnnotations(remove=(v.MACHINE_PRIORITY_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION))
    return PatchMachineAnnotations(
        set={v.MACHINE_PRIORITY_ANNOTATION: remembered}, remove=(v.LAST_MACHINE_PRIORITY_ANNOTATION,)
    )
