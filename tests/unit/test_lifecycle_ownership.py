"""What the controller acts on only when it is its own: the auto value is never taken from a Node, a CA
annotation is removed only when the preservation's record says it added it (a node-side marker alone proves
nothing), and a node is touched only when its providerID is the machine's."""

from __future__ import annotations

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.plan import (
    DrainNode,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetPreservedCondition,
    SetPreservedTaint,
)

from .lifecycle_helpers import execute, of_type, plan
from .preservation_objects import HOUR, NOW, machine, node


def with_provider_ids(m: Machine, n: Node, *, machine_id: str, node_id: str) -> tuple[Machine, Node]:
    return (
        m.model_copy(update={"spec": m.spec.model_copy(update={"provider_id": machine_id})}),
        n.model_copy(update={"spec": n.spec.model_copy(update={"provider_id": node_id})}),
    )


def annotated(obj: Machine | Node, **annotations: str) -> Machine | Node:
    metadata = obj.metadata.model_copy(update={"annotations": {**obj.metadata.annotations, **annotations}})
    return obj.model_copy(update={"metadata": metadata})


def node_steps(steps: tuple[object, ...]) -> list[object]:
    kinds = (PatchNodeAnnotations, SetPreservedTaint, SetPreservedCondition, DrainNode)
    return [step for step in steps if isinstance(step, kinds)]


@pytest.mark.parametrize("value", ["auto-preserve", "auto-preserved"])
def test_the_auto_value_on_a_node_is_reported_and_ignored(value: str) -> None:
    result = plan(machine(phase="Failed"), node(preserve=value))
    assert not any(v.PRESERVED_SINCE_ANNOTATION in patch.set for patch in of_type(result, PatchMachineAnnotations)), (
        "a node-side auto value must not start a preservation"
    )
    warnings = [e for e in of_type(result, RecordEvent) if e.reason == v.EventReason.INVALID_PRESERVE_VALUE]
    assert [(e.kind, e.name) for e in warnings] == [("Node", "n1")]


def test_the_auto_value_on_the_machine_still_preserves() -> None:
    result = plan(machine(phase="Failed", preserve="auto-preserve"), node())
    assert any(v.PRESERVED_SINCE_ANNOTATION in patch.set for patch in of_type(result, PatchMachineAnnotations))


def test_adding_the_ca_annotation_is_recorded_with_the_preservation() -> None:
    m, n = machine(phase="Running", preserve="now"), node()
    preserved, _ = execute(m, n, plan(m, n))
    assert preserved.preservation is not None
    assert preserved.preservation.added_ca_annotation


def test_a_ca_annotation_the_user_set_is_not_recorded_as_ours_nor_removed() -> None:
    m, n = machine(phase="Running", preserve="now"), node(ca="true")
    preserved, preserved_node = execute(m, n, plan(m, n))
    assert preserved.preservation is not None
    assert not preserved.preservation.added_ca_annotation
    assert preserved_node is not None
    # ... even if someone adds the marker afterwards: on stop the annotation stays.
    marked = annotated(preserved_node, **{v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true"})
    stopping = annotated(preserved, **{v.PRESERVE_ANNOTATION: "false"})
    assert isinstance(marked, Node)
    assert isinstance(stopping, Machine)
    _, stopped_node = execute(stopping, marked, plan(stopping, marked))
    assert stopped_node is not None
    assert stopped_node.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"


def test_a_ca_annotation_we_added_is_removed_on_stop() -> None:
    m, n = machine(phase="Running", preserve="now"), node()
    preserved, preserved_node = execute(m, n, plan(m, n))
    stopping = annotated(preserved, **{v.PRESERVE_ANNOTATION: "false"})
    assert isinstance(stopping, Machine)
    _, stopped_node = execute(stopping, preserved_node, plan(stopping, preserved_node))
    assert stopped_node is not None
    assert v.CA_SCALE_DOWN_DISABLED_ANNOTATION not in stopped_node.metadata.annotations
    assert v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION not in stopped_node.metadata.annotations


@pytest.mark.parametrize("phase", ["Running", "Failed"])
def test_a_node_of_another_machine_is_left_alone_and_reported_once(phase: str) -> None:
    m, n = with_provider_ids(
        machine(phase=phase, preserve="now"), node(), machine_id="fake:///m1", node_id="fake:///other"
    )
    result = plan(m, n)
    assert node_steps(result.steps) == []
    warnings = [e for e in of_type(result, RecordEvent) if e.reason == v.EventReason.NODE_OF_ANOTHER_MACHINE]
    assert len(warnings) == 1
    assert warnings[0].once
    assert warnings[0].kind == "Machine"
    assert "fake:///other" in warnings[0].message
    # the machine itself is still preserved (as one without a node)
    assert any(v.PRESERVED_SINCE_ANNOTATION in patch.set for patch in of_type(result, PatchMachineAnnotations))


@pytest.mark.parametrize(
    ("machine_id", "node_id"), [("fake:///m1", "fake:///m1"), ("", "fake:///x"), ("fake:///m1", "")]
)
def test_a_matching_or_unset_provider_id_lets_the_node_be_preserved(machine_id: str, node_id: str) -> None:
    m, n = with_provider_ids(machine(phase="Failed", preserve="now"), node(), machine_id=machine_id, node_id=node_id)
    result = plan(m, n)
    assert node_steps(result.steps) != []
    assert not [e for e in of_type(result, RecordEvent) if e.reason == v.EventReason.NODE_OF_ANOTHER_MACHINE]


def test_a_preserved_machine_whose_label_moves_to_another_machines_node_leaves_that_node_untouched() -> None:
    m, n = machine(phase="Failed", expiry=NOW + HOUR, preserve="now"), node()
    m, n = with_provider_ids(m, n, machine_id="fake:///m1", node_id="fake:///m2")
    result = plan(m, n)
    assert node_steps(result.steps) == []
    assert result.requeue_after == HOUR
