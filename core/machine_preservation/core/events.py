"""The Kubernetes Events the controller records: what happened to a machine's preservation, in words.

Events go on the Machine and, when it exists, on its Node, so `kubectl describe` of either shows them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import gave_up_message, go_time_string
from machine_preservation.core.decision import StopCause
from machine_preservation.core.models import Machine, Node, NoNode
from machine_preservation.core.plan import RecordEvent
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.core.preserve_value import EffectivePreserveValue, InvalidValue

_STOP_MESSAGES = {
    StopCause.OPTED_OUT: 'Preservation stopped: the preserve value is "false".',
    StopCause.NO_PREFERENCE: "Preservation stopped: no preserve value is in force (annotation removed or empty).",
    StopCause.NOT_FAILED: "Preservation stopped: the machine is no longer Failed.",
    StopCause.RELEASED: (
        "Preservation stopped: machine-preservation was disabled for this cluster; the machine is left to "
        "machine-controller-manager."
    ),
}


def on_machine_and_node(
    *,
    machine: Machine,
    node: Node | None,
    event_type: v.EventType,
    reason: v.EventReason,
    message: str,
    once: bool = False,
    key: str = "",
) -> tuple[RecordEvent, ...]:
    targets = [("Machine", machine.metadata.name)] + ([("Node", node.metadata.name)] if node is not None else [])
    return tuple(
        RecordEvent(kind=kind, name=name, type=event_type, reason=reason, message=message, once=once, key=key)
        for kind, name in targets
    )


def observed(*, machine: Machine, node: Node | None, reason: v.EventReason, message: str) -> tuple[RecordEvent, ...]:
    """What MCM did, as seen in its objects: recorded once however often it is seen again."""
    return on_machine_and_node(
        machine=machine, node=node, event_type=v.EventType.NORMAL, reason=reason, message=message, once=True
    )


def started(
    *, machine: Machine, node: Node | NoNode, effective: EffectivePreserveValue, since: dt.datetime, expiry: dt.datetime
) -> tuple[RecordEvent, ...]:
    """Once per preservation (named by its start), however often a restart announces it again."""
    message = (
        f'Machine preserved until {go_time_string(expiry)} (preserve value "{effective.value}" '
        f"from the {effective.source})."
    )
    if node is NoNode.NOT_FOUND:
        message += f' Node "{machine.node_name}" not found: only the expiry is set.'
    elif node is NoNode.NO_LABEL:
        message += " The machine has no node: only the expiry is set."
    return on_machine_and_node(
        machine=machine,
        node=node if isinstance(node, Node) else None,
        event_type=v.EventType.NORMAL,
        reason=v.EventReason.PRESERVATION_STARTED,
        message=message,
        once=True,
        key=f"preserved since {format_timestamp(since)}",
    )


def stopped(
    *, machine: Machine, node: Node | None, cause: StopCause, deleting: bool, node_gone: bool, expiry: dt.datetime
) -> tuple[RecordEvent, ...]:
    """`expiry`: when the preservation that stops was to end."""
    if cause == StopCause.EXPIRED:
        reason = v.EventReason.PRESERVATION_EXPIRED
        message = (
            f"Preservation expired at {go_time_string(expiry)}; the preserve annotation is removed so the "
            "machine is not preserved again."
        )
    else:
        reason = v.EventReason.PRESERVATION_STOPPED
        message = _STOP_MESSAGES[cause]
    if deleting and machine.phase == v.MachinePhase.FAILED:
        message += " The Failed machine is deleted."
    elif deleting and node_gone:
        message += " The machine, whose Node is gone, is deleted."
    return on_machine_and_node(
        machine=machine, node=node, event_type=v.EventType.NORMAL, reason=reason, message=message
    )


def node_of_another_machine(*, machine: Machine, node: Node) -> tuple[RecordEvent, ...]:
    """The machine's `node` label names a Node with another providerID: reported once, on the Machine only."""
    message = (
        f'Label node="{node.metadata.name}" names a Node whose providerID "{node.spec.provider_id}" is not the '
        f'machine\'s ("{machine.spec.provider_id}"): that node is left alone.'
    )
    return on_machine_and_node(
        machine=machine,
        node=None,
        event_type=v.EventType.WARNING,
        reason=v.EventReason.NODE_OF_ANOTHER_MACHINE,
        message=message,
        once=True,
    )


def node_gone(*, machine: Machine, since: dt.datetime, expiry: dt.datetime) -> tuple[RecordEvent, ...]:
    """The preserved machine's Node is gone: once per disappearance (named by when it was noticed), on the Machine."""
    message = (
        f'Node "{machine.node_name}" of the preserved machine is gone. The machine stays preserved until '
        f"{go_time_string(expiry)}: machine-controller-manager's deletes of it are denied, and a Node of that name "
        f"that registers again is preserved. To release it, annotate the machine with {v.PRESERVE_ANNOTATION}=false."
    )
    return on_machine_and_node(
        machine=machine,
        node=None,
        event_type=v.EventType.WARNING,
        reason=v.EventReason.PRESERVED_NODE_GONE,
        message=message,
        once=True,
        key=f"node gone since {format_timestamp(since)}",
    )


def node_returned(*, machine: Machine, node: Node, since: dt.datetime, expiry: dt.datetime) -> tuple[RecordEvent, ...]:
    """A Node of the gone Node's name registered again; `since`: when the old one was noticed gone."""
    message = f'Node "{node.metadata.name}" is back: the preservation until {go_time_string(expiry)} applies to it.'
    return on_machine_and_node(
        machine=machine,
        node=node,
        event_type=v.EventType.NORMAL,
        reason=v.EventReason.PRESERVED_NODE_RETURNED,
        message=message,
        once=True,
        key=f"node back, gone since {format_timestamp(since)}",
    )


def recovered(*, machine: Machine, node: Node) -> tuple[RecordEvent, ...]:
    message = f'Node "{node.metadata.name}" is healthy again: machine phase set from Failed to Running.'
    return on_machine_and_node(
        machine=machine,
        node=node,
        event_type=v.EventType.NORMAL,
        reason=v.EventReason.MACHINE_RECOVERED,
        message=message,
    )


def drain_outcome(
    *,
    machine: Machine,
    node: Node,
    drained: bool,
    blocking_pods: Sequence[str],
    gave_up_after: dt.timedelta | None = None,
) -> tuple[RecordEvent, ...]:
    """`gave_up_after`: the drain timeout, when evictions have stopped (the message says so)."""
    if drained:
        return on_machine_and_node(
            machine=machine,
            node=node,
            event_type=v.EventType.NORMAL,
            reason=v.EventReason.PRESERVED_NODE_DRAINED,
            message=f'Preserved node "{node.metadata.name}" drained.',
        )
    blockers = f"; pods blocking: {', '.join(sorted(set(blocking_pods)))}" if blocking_pods else ""
    return on_machine_and_node(
        machine=machine,
        node=node,
        event_type=v.EventType.WARNING,
        reason=v.EventReason.PRESERVED_NODE_DRAIN_FAILED,
        message=f'Preserved node "{node.metadata.name}" could not be drained{blockers}.'
        + (f" {gave_up_message(gave_up_after)}" if gave_up_after is not None else ""),
    )


def invalid_value(invalid: InvalidValue) -> RecordEvent:
    allowed = ", ".join(f'"{value}"' for value in v.USER_ALLOWED_VALUES)
    return RecordEvent(
        kind=invalid.kind,
        name=invalid.name,
        type=v.EventType.WARNING,
        reason=v.EventReason.INVALID_PRESERVE_VALUE,
        message=(
            f'Preserve annotation {v.PRESERVE_ANNOTATION}="{invalid.value}" on {invalid.kind} "{invalid.name}" is '
            f"invalid and ignored (treated as absent); allowed values: {allowed}."
        ),
    )
