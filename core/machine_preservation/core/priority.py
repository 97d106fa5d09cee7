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
from dataclasses import dataclass

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import DEFAULT_MAX_PRESERVE_TIMEOUT
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


@dataclass(frozen=True)
class UnpreservedPriorities:
    """The two highest own priorities among a MachineSet's unpreserved, not deleted machines at one moment:
    enough to answer the ceiling for every machine of the set (the others' maximum leaves out at most one)."""

    top: tuple[tuple[int, str], ...]  # up to two (own priority, machine name), highest first
    computed_at: dt.datetime
    # The earliest preserveExpiryTime still ahead: then a machine becomes unpreserved and the answer may change.
    valid_until: dt.datetime | None

    def ceiling_for(self, machine_name: str) -> int:
        others = [priority for priority, name in self.top if name != machine_name]
        return max(v.DEFAULT_MACHINE_PRIORITY, others[0]) if others else v.DEFAULT_MACHINE_PRIORITY

    def holds_at(self, now: dt.datetime) -> bool:
        """Whether the same machines still count as unpreserved at `now` (given unchanged objects)."""
        return self.computed_at <= now and (self.valid_until is None or now < self.valid_until)


def unpreserved_priorities(
    *,
    machine_set_machines: Sequence[Machine],
    now: dt.datetime,
    max_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT,
) -> UnpreservedPriorities:
    top: list[tuple[int, str]] = []
    valid_until: dt.datetime | None = None
    for m in machine_set_machines:
        if m.metadata.deletion_timestamp is not None:
            continue
        expiry = m.preservation.expiry(max_timeout=max_timeout) if m.preservation is not None else None
        if expiry is not None and expiry > now:
            valid_until = expiry if valid_until is None else min(valid_until, expiry)
            continue
        top.append((own_priority(m), m.metadata.name))
        if len(top) > 2:
            top.sort(reverse=True)
            del top[2:]
    top.sort(reverse=True)
    return UnpreservedPriorities(top=tuple(top), computed_at=now, valid_until=valid_until)


def unpreserved_priority_ceiling(
    *,
    machine: Machine,
    machine_set_machines: Sequence[Machine],
    now: dt.datetime,
    max_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT,
) -> int:
    """The highest own priority among the *other* unpreserved, not deleted machines (at least the default)."""
    summary = unpreserved_priorities(machine_set_machines=machine_set_machines, now=now, max_timeout=max_timeout)
    return summary.ceiling_for(machine.metadata.name)


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
