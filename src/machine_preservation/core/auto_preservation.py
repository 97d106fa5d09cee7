"""Auto-preservation per MachineSet: which Failed machines get the auto value, which lose it.

Differences from upstream (§6 of the reference), on purpose:
- the budget is counted live from the machines, not from the previous reconcile's status counter,
  so lowering the max never releases one machine too many (upstream quirk Q3);
- a machine whose *effective* value (node included) is manual or `false` is never a candidate, so
  node-annotated machines do not ping-pong (quirk Q6);
- the auto value on a machine that is not Failed and not preserved is released (quirk Q5);
- machines of a MachineSet that a rollout is replacing are not auto-preserved (DESIGN.md §3).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineSet, Node
from machine_preservation.core.preserve_value import Preference, effective_preserve_value, is_auto_value

_EPOCH = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class AutoPreservationPlan:
    annotate: tuple[str, ...]  # machine names to give the auto value, newest failures first
    release: tuple[str, ...]  # machine names to take the auto value from
    count: int  # machines carrying the auto value once the plan is applied


def _created(machine: Machine) -> dt.datetime:
    return machine.metadata.creation_timestamp or _EPOCH


def _failed_since(machine: Machine) -> dt.datetime:
    # "Newest failures first": the time the machine entered its current phase, else its creation.
    return machine.status.current_status.last_update_time or _created(machine)


def is_being_replaced(machine_set: MachineSet, siblings: Sequence[MachineSet]) -> bool:
    """Whether a rollout is replacing this MachineSet: its MachineDeployment owns a newer one."""
    owner = machine_set.metadata.controller_owner()
    if owner is None or owner.kind != "MachineDeployment":
        return False
    mine = machine_set.metadata.creation_timestamp or _EPOCH
    return any(
        (other.metadata.controller_owner() or owner).uid == owner.uid
        and other.metadata.uid != machine_set.metadata.uid
        and other.metadata.deletion_timestamp is None
        and (other.metadata.creation_timestamp or _EPOCH) > mine
        for other in siblings
    )


def plan_auto_preservation(
    *,
    machine_set: MachineSet,
    machines: Sequence[Machine],
    nodes: Mapping[str, Node],
    being_replaced: bool,
    now: dt.datetime,
) -> AutoPreservationPlan:
    """Decide the auto value for every machine of one MachineSet."""
    live = [m for m in machines if m.metadata.deletion_timestamp is None]
    limit = 0 if being_replaced else max(machine_set.spec.auto_preserve_failed_machine_max, 0)

    holders: list[Machine] = []
    release: list[str] = []
    for machine in live:
        if not is_auto_value(machine.metadata.annotations.get(v.PRESERVE_ANNOTATION)):
            continue
        preserved = machine.preserve_expiry_time is not None and machine.preserve_expiry_time > now
        if machine.phase != v.MachinePhase.FAILED and not preserved:
            release.append(machine.metadata.name)  # stale claim on a healthy machine
        else:
            holders.append(machine)

    if len(holders) > limit:
        holders.sort(key=_created)  # oldest released first
        excess = len(holders) - limit
        release += [m.metadata.name for m in holders[:excess]]
        return AutoPreservationPlan(annotate=(), release=tuple(release), count=limit)

    candidates = [
        m
        for m in live
        if m.phase == v.MachinePhase.FAILED
        and m.preserve_expiry_time is None
        and effective_preserve_value(machine=m, node=nodes.get(m.node_name)).value == Preference.NONE
    ]
    candidates.sort(key=_failed_since, reverse=True)
    annotate = tuple(m.metadata.name for m in candidates[: limit - len(holders)])
    return AutoPreservationPlan(annotate=annotate, release=tuple(release), count=len(holders) + len(annotate))
