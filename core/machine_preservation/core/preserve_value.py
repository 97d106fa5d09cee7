"""Which preserve value is in force for a machine: node over machine, with the last-applied record.

Rules (upstream MCM's, except for `""` and the auto value):
- the node is *in control* when it carries the annotation with a valid value (`""` included: a node's
  `""` overrides the machine's annotation) or when the machine's last-applied record is non-empty
  (then a removed node annotation means "stop": effective value `""`);
- otherwise the machine's own annotation counts;
- a missing node object leaves the machine's value in force, together with the node's value as last applied to
  the machine (`last_known_node`): a Node that is gone said nothing new since;
- an invalid value (anything outside the allowed set) is treated as absent and reported; so is the auto value
  on a Node (the controller writes it on Machines only, so on a Node someone else wrote it);
- the auto value on the machine survives a node in control that expresses no preference (`""`, or a
  removed annotation): "no preference" is what lets auto-preservation apply, and the auto value is the
  controller's decision, not a user's value the node overrides. Without this the MachineSet would grant the
  auto value and the machine sync would delete it again, over and over (as upstream MCM does for a Failed
  machine whose node carries a value).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node, NodeMeta

_VALUES = {
    **{value.value: value for value in v.PreserveValue},
    v.UPSTREAM_AUTO_PRESERVE_VALUE: v.PreserveValue.AUTO,
}


class ValueOrigin(StrEnum):
    """The object whose preserve annotation is in force."""

    NODE = "node"
    MACHINE = "machine"


@dataclass(frozen=True)
class InvalidValue:
    """A preserve annotation whose value is not allowed; treated as absent."""

    kind: str  # "Node" or "Machine"
    name: str
    value: str


@dataclass(frozen=True)
class EffectivePreserveValue:
    value: v.PreserveValue
    source: ValueOrigin
    node_in_control: bool
    invalid: tuple[InvalidValue, ...] = ()
    # The node's annotation as written when it is valid; None when absent, invalid or no node.
    node_raw: str | None = None


def parse_preserve_value(raw: str | None) -> v.PreserveValue | None:
    """The value a raw annotation stands for (an absent one: NONE); None when the value is invalid."""
    if raw is None:
        return v.PreserveValue.NONE
    return _VALUES.get(raw)


def is_auto_value(raw: str | None) -> bool:
    return raw in v.AUTO_PRESERVE_VALUES


def effective_preserve_value(*, machine: Machine, node: Node | None) -> EffectivePreserveValue:
    invalid: list[InvalidValue] = []
    machine_raw = machine.metadata.annotations.get(v.PRESERVE_ANNOTATION)
    machine_value = parse_preserve_value(machine_raw)
    if machine_value is None:
        invalid.append(InvalidValue("Machine", machine.metadata.name, machine_raw or ""))
        machine_value = v.PreserveValue.NONE

    if node is None:
        return EffectivePreserveValue(machine_value, ValueOrigin.MACHINE, node_in_control=False, invalid=tuple(invalid))

    node_raw = node.metadata.annotations.get(v.PRESERVE_ANNOTATION)
    node_value = parse_preserve_value(node_raw)
    # The auto value is the controller's, written on Machines only: on a Node someone else wrote it.
    if node_value is None or node_value == v.PreserveValue.AUTO:
        invalid.append(InvalidValue("Node", node.metadata.name, node_raw or ""))
        node_raw, node_value = None, v.PreserveValue.NONE
    last_applied = machine.metadata.annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "")
    node_in_control = node_raw is not None or last_applied != ""
    if node_in_control and not (node_value == v.PreserveValue.NONE and machine_value == v.PreserveValue.AUTO):
        return EffectivePreserveValue(node_value, ValueOrigin.NODE, True, tuple(invalid), node_raw)
    return EffectivePreserveValue(machine_value, ValueOrigin.MACHINE, node_in_control, tuple(invalid), node_raw)


def last_known_node(machine: Machine) -> Node | None:
    """The machine's node as far as the machine records it: its name and last-applied preserve value. It stands in
    for a Node that is gone, and for the webhook, which cannot see the shoot's Nodes. None: no node label."""
    if not machine.node_name:
        return None
    last_applied = machine.metadata.annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "")
    annotations = {v.PRESERVE_ANNOTATION: last_applied} if last_applied else {}
    return Node(metadata=NodeMeta(name=machine.node_name, annotations=annotations))
