"""Auto-preservation per MachineSet: which Failed machines get the auto value, which lose it; status counters.

Rules:
- at most `spec.autoPreserveFailedMachineMax` machines of a MachineSet carry the auto value (a negative max
  counts as 0); newest failures are granted first; when the max is lowered the oldest (by creation) are
  released first;
- only the auto value counts against the budget and only it is ever released: a machine whose effective
  value is `now`/`when-failed` (manual) or `false` (opted out) is never a candidate;
- a MachineSet that a rollout is replacing grants no new auto values (its Failed machines are replaced as
  usual); the ones it already granted stay within its max.

Differences from upstream, on purpose:
- the budget is counted live from the machines, not from the previous reconcile's status counter, so
  lowering the max never releases one machine too many (upstream computes the room from the stored count,
  which the releasing reconcile writes unchanged, and releases once more);
- a candidate's *effective* value (node included) must be "no preference", so a machine whose node carries a
  value is not granted the auto value only for the machine plan to remove it again, over and over;
- the auto value on a machine that is neither Failed nor preserved is released (upstream keeps it, and it
  holds a slot of the budget);
- a machine whose preservation is ending (expiry set, value gone) is not a candidate until the stop is done,
  and a Failed machine whose preservation expired is deleted by the machine plan, not re-granted (upstream
  re-grants it when its MachineSet sees it before the deletion, and it is preserved again).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import DEFAULT_MAX_PRESERVE_TIMEOUT, PreservationConfig
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node
from machine_preservation.core.plan import (
    MachineSetPlan,
    PatchMachineAnnotations,
    PatchMachineDeploymentStatus,
    PatchMachineSetStatus,
    RecordEvent,
)
from machine_preservation.core.preserve_value import effective_preserve_value, is_auto_value

_EPOCH = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class AutoPreservationPlan:
    annotate: tuple[str, ...]  # machine names to give the auto value, newest failures first
    release: tuple[str, ...]  # machine names to take the auto value from
    count: int  # machines carrying the auto value once the plan is applied


def _created(machine: Machine) -> tuple[dt.datetime, str]:
    return machine.metadata.creation_timestamp or _EPOCH, machine.metadata.name


def _failed_since(machine: Machine) -> tuple[dt.datetime, dt.datetime, str]:
    # "Newest failures first": the time the machine entered its current phase, else its creation.
    created, name = _created(machine)
    return machine.status.current_status.last_update_time or created, created, name


def _revision(machine_set: MachineSet) -> int:
    try:
        return int(machine_set.metadata.annotations.get(v.MACHINE_SET_REVISION_ANNOTATION, "0"))
    except ValueError:
        return 0


def _rollout_rank(machine_set: MachineSet) -> tuple[int, dt.datetime]:
    # MCM raises the revision of the MachineSet it rolls out to (a rollback included); the creation time
    # decides when revisions are absent.
    return _revision(machine_set), machine_set.metadata.creation_timestamp or _EPOCH


def is_being_replaced(machine_set: MachineSet, siblings: Sequence[MachineSet]) -> bool:
    """Whether a rollout is replacing this MachineSet: its MachineDeployment owns a newer revision."""
    owner = machine_set.metadata.controller_owner()
    if owner is None or owner.kind != "MachineDeployment":
        return False
    mine = _rollout_rank(machine_set)
    for other in siblings:
        other_owner = other.metadata.controller_owner()
        if (
            other_owner is not None
            and other_owner.uid == owner.uid
            and other.metadata.name != machine_set.metadata.name
            and other.metadata.deletion_timestamp is None
            and _rollout_rank(other) > mine
        ):
            return True
    return False


def _actively_preserved(machine: Machine, now: dt.datetime, max_timeout: dt.timedelta) -> bool:
    record = machine.preservation
    return record is not None and not record.expired(now=now, max_timeout=max_timeout)


def plan_auto_preservation(
    *,
    machine_set: MachineSet,
    machines: Sequence[Machine],
    nodes: Mapping[str, Node],
    being_replaced: bool,
    now: dt.datetime,
    max_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT,
    limit: int | None = None,
) -> AutoPreservationPlan:
    """Decide the auto value for every machine of one MachineSet (`machines`: the ones it owns;
    `nodes`: their Nodes by name, where known; `limit`: the MachineSet's autoPreserveFailedMachineMax where it is
    known from elsewhere than its spec, e.g. the Shoot; `max_timeout`: the cap on every expiry)."""
    live = [m for m in machines if m.metadata.deletion_timestamp is None]
    limit = max(machine_set.spec.auto_preserve_failed_machine_max if limit is None else limit, 0)

    holders: list[Machine] = []
    release: list[str] = []
    for machine in live:
        if not is_auto_value(machine.metadata.annotations.get(v.PRESERVE_ANNOTATION)):
            continue
        if machine.phase != v.MachinePhase.FAILED and not _actively_preserved(machine, now, max_timeout):
            release.append(machine.metadata.name)  # stale claim on a machine that is not Failed
        else:
            holders.append(machine)

    if len(holders) >= limit:
        excess = sorted(holders, key=_created)[: len(holders) - limit]  # oldest released first
        return AutoPreservationPlan(
            annotate=(), release=tuple(release + [m.metadata.name for m in excess]), count=len(holders) - len(excess)
        )
    if being_replaced:
        return AutoPreservationPlan(annotate=(), release=tuple(release), count=len(holders))

    candidates = [
        m
        for m in live
        if m.phase == v.MachinePhase.FAILED
        and m.preservation is None
        and effective_preserve_value(machine=m, node=nodes.get(m.node_name)).value == v.PreserveValue.NONE
    ]
    candidates.sort(key=_failed_since, reverse=True)
    annotate = tuple(m.metadata.name for m in candidates[: limit - len(holders)])
    return AutoPreservationPlan(annotate=annotate, release=tuple(release), count=len(holders) + len(annotate))


def preserved_failed_replicas(*, machines: Sequence[Machine]) -> int:
    """Machines in phase Failed with a preservation record (expired ones included), not being deleted."""
    return sum(
        1
        for m in machines
        if m.metadata.deletion_timestamp is None and m.phase == v.MachinePhase.FAILED and m.preservation is not None
    )


def plan_machine_set(
    *,
    machine_set: MachineSet,
    machines: Sequence[Machine],
    nodes: Mapping[str, Node],
    being_replaced: bool,
    config: PreservationConfig,
    now: dt.datetime,
    limit: int | None = None,
) -> MachineSetPlan:
    """The auto values to grant and release (Machine annotation patches by name), the status counters
    when they change (autoPreserveFailedMachineCount, preservedFailedReplicas) and an Event per change."""
    auto = plan_auto_preservation(
        machine_set=machine_set,
        machines=machines,
        nodes=nodes,
        being_replaced=being_replaced,
        now=now,
        max_timeout=config.max_preserve_timeout,
        limit=limit,
    )
    name = machine_set.metadata.name
    limit = machine_set.spec.auto_preserve_failed_machine_max if limit is None else limit
    patches: dict[str, PatchMachineAnnotations] = {}
    events: list[RecordEvent] = []
    for machine_name in auto.annotate:
        patches[machine_name] = PatchMachineAnnotations(set={v.PRESERVE_ANNOTATION: config.auto_value})
        events.append(
            _event(
                machine_name,
                v.EventReason.AUTO_PRESERVATION_GRANTED,
                f'Failed machine auto-preserved by MachineSet "{name}" (autoPreserveFailedMachineMax {limit}).',
            )
        )
    phases = {m.metadata.name: m.phase for m in machines}
    for machine_name in auto.release:
        patches[machine_name] = PatchMachineAnnotations(remove=(v.PRESERVE_ANNOTATION,))
        why = (
            f"its autoPreserveFailedMachineMax ({limit}) is exceeded (the oldest machines are released first)"
            if phases[machine_name] == v.MachinePhase.FAILED
            else "the machine is not Failed"
        )
        events.append(
            _event(machine_name, v.EventReason.AUTO_PRESERVATION_RELEASED, f'Released by MachineSet "{name}": {why}.')
        )
    status = PatchMachineSetStatus(
        auto_preserve_failed_machine_count=auto.count,
        preserved_failed_replicas=preserved_failed_replicas(machines=machines),
    )
    current = PatchMachineSetStatus(
        auto_preserve_failed_machine_count=machine_set.status.auto_preserve_failed_machine_count,
        preserved_failed_replicas=machine_set.status.preserved_failed_replicas,
    )
    mirrored = status if config.mirror_status and status != current else None
    return MachineSetPlan(machine_annotations=patches, status=mirrored, events=tuple(events))


def plan_machine_deployment(
    *, machine_deployment: MachineDeployment, machine_sets: Sequence[MachineSet]
) -> PatchMachineDeploymentStatus | None:
    """status.preservedFailedReplicas = the sum over its MachineSets' status; None when already so."""
    total = sum(ms.status.preserved_failed_replicas for ms in machine_sets)
    if total == machine_deployment.status.preserved_failed_replicas:
        return None
    return PatchMachineDeploymentStatus(preserved_failed_replicas=total)


def _event(machine_name: str, reason: v.EventReason, message: str) -> RecordEvent:
    return RecordEvent(kind="Machine", name=machine_name, type=v.EventType.NORMAL, reason=reason, message=message)
