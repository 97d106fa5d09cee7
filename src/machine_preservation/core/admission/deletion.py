"""Whether MCM may delete a Machine now: not while it is Failed and preserved, or about to be.

MCM deletes Failed machines it sees without preservation; our controller preserves them a moment later.
To let the controller win that race, a DELETE by one of the MCM identities is denied while the machine is
Failed and either actively preserved (`preserveExpiryTime` in the future) or *pending*: not preserved yet but
its effective preserve value (the machine's annotation, or the node's last-applied value) asks for it, or its
MachineSet's auto-preservation budget has room for it. Everyone else's deletes always pass.

The webhook cannot see the shoot's nodes, so a node's value is known through the machine's last-applied
record only (what the controller last synced from the node).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import Verdict, allow, deny
from machine_preservation.core.auto_preservation import is_being_replaced, plan_auto_preservation
from machine_preservation.core.models import Machine, MachineSet, Node, ObjectMeta
from machine_preservation.core.preserve_value import Preference, effective_preserve_value

_ASKS_FOR_PRESERVATION = (Preference.NOW, Preference.WHEN_FAILED, Preference.AUTO)
_RELEASE_HINT = (
    f"to release it, annotate the machine (or its node) with {v.PRESERVE_ANNOTATION}=false; "
    "a user's delete is not blocked"
)


@dataclass(frozen=True)
class MachineSetView:
    """The machine's MachineSet, its machines, and the other MachineSets of the namespace (rollouts)."""

    machine_set: MachineSet
    machines: Sequence[Machine]
    siblings: Sequence[MachineSet]


def last_known_node(machine: Machine) -> Node | None:
    """The machine's node as far as the machine records it: its last-applied preserve value."""
    if not machine.node_name:
        return None
    last_applied = machine.metadata.annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "")
    annotations = {v.PRESERVE_ANNOTATION: last_applied} if last_applied else {}
    return Node(metadata=ObjectMeta(name=machine.node_name, annotations=annotations))


def _guarded(*, machine: Machine, username: str, settings: AdmissionSettings) -> bool:
    return settings.is_mcm(username) and machine.phase == v.MachinePhase.FAILED


def machine_set_to_read(*, machine: Machine, username: str, settings: AdmissionSettings) -> str:
    """The name of the MachineSet whose budget decides this DELETE, or "" when no read is needed."""
    if not _guarded(machine=machine, username=username, settings=settings) or machine.preserve_expiry_time:
        return ""
    if effective_preserve_value(machine=machine, node=last_known_node(machine)).value != Preference.NONE:
        return ""
    owner = machine.metadata.controller_owner()
    return owner.name if owner is not None and owner.kind == "MachineSet" else ""


def _has_budget_room(*, machine: Machine, view: MachineSetView, now: dt.datetime) -> bool:
    owned = [
        m
        for m in view.machines
        if (owner := m.metadata.controller_owner()) is not None
        and owner.kind == "MachineSet"
        and owner.name == view.machine_set.metadata.name
    ]
    if all(m.metadata.name != machine.metadata.name for m in owned):
        owned.append(machine)
    nodes = {m.node_name: node for m in owned if (node := last_known_node(m)) is not None}
    plan = plan_auto_preservation(
        machine_set=view.machine_set,
        machines=owned,
        nodes=nodes,
        being_replaced=is_being_replaced(view.machine_set, view.siblings),
        now=now,
    )
    return machine.metadata.name in plan.annotate


def judge_machine_deletion(
    *,
    machine: Machine,
    username: str,
    settings: AdmissionSettings,
    now: dt.datetime,
    machine_set: MachineSetView | None = None,
) -> Verdict:
    """Deny MCM's DELETE of a Failed machine that is, or is about to be, preserved; allow everything else.

    `machine_set` is the view read for `machine_set_to_read(...)`; None when none was needed or it is gone.
    """
    if not _guarded(machine=machine, username=username, settings=settings):
        return allow()
    subject = f'machine "{machine.metadata.name}"'
    expiry = machine.preserve_expiry_time
    if expiry is not None:
        if expiry <= now:
            return allow()
        until = expiry.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return deny(f"{subject} is Failed and preserved until {until}; {_RELEASE_HINT}")
    # The expiry is not known yet: the controller sets it when it starts preserving.
    kept_for = machine.spec.machine_preserve_timeout or "the configured machinePreserveTimeout"
    effective = effective_preserve_value(machine=machine, node=last_known_node(machine))
    if effective.value in _ASKS_FOR_PRESERVATION:
        return deny(
            f'{subject} is Failed and about to be preserved (preserve value "{effective.value}" from its '
            f"{effective.source}); it is kept for {kept_for} from the start of its preservation; {_RELEASE_HINT}"
        )
    if machine_set is not None and _has_budget_room(machine=machine, view=machine_set, now=now):
        name = machine_set.machine_set.metadata.name
        return deny(
            f'{subject} is Failed and about to be auto-preserved (MachineSet "{name}" has room in its '
            f"autoPreserveFailedMachineMax); it is kept for {kept_for} from the start of its preservation; "
            f"{_RELEASE_HINT}"
        )
    return allow()
