"""Restoring the CA scale-down-disabled annotation on preserved nodes (core.admission.ca_guard)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.ca_guard import (
    MCM_MARKER_WARNING,
    RESTORED_WARNING,
    guard_ca_annotation,
    guard_mcm_marker,
    is_preserved_node,
)
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import PatchOperation, Verdict
from machine_preservation.core.models import Node

CONTROLLER = "system:serviceaccount:mp:controller"
CA = v.CA_SCALE_DOWN_DISABLED_ANNOTATION
MARKER = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
MCM_MARKER = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
CA_POINTER = "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled"


def node(annotations: dict[str, str] | None = None, preserved: str | None = None) -> Node:
    document: dict[str, Any] = {"metadata": {"name": "n1", "annotations": annotations or {}}}
    if preserved is not None:
        document["status"] = {"conditions": [{"type": "Preserved", "status": preserved}]}
    return Node.model_validate(document)


PRESERVED_BY_MARKER = {CA: "true", MARKER: "true"}


def guard(
    old: Node | None, new: Node, *, username: str = "alice", present: bool = True, native: bool = False
) -> Verdict:
    settings = AdmissionSettings(controller_username=CONTROLLER, mcm_native_preservation=native)
    return guard_ca_annotation(
        old_node=old, new_node=new, annotations_present=present, username=username, settings=settings
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (node(PRESERVED_BY_MARKER), node({MARKER: "true"})),  # removed
        (node(PRESERVED_BY_MARKER), node({CA: "false", MARKER: "true"})),  # flipped
        (node(PRESERVED_BY_MARKER), node({CA: "True", MARKER: "true"})),  # case matters to the CA
        (node({CA: "true"}, preserved="True"), node({}, preserved="True")),  # preserved by condition
        (node({}, preserved="True"), node({CA: "no"}, preserved="True")),  # set wrong where it was missing
    ],
)
def test_changes_away_from_true_on_preserved_nodes_are_patched_back(old: Node, new: Node) -> None:
    verdict = guard(old, new)
    assert verdict.allowed
    assert verdict.patch == (PatchOperation("add", CA_POINTER, "true"),)
    assert verdict.warnings == (RESTORED_WARNING,)
    assert len(RESTORED_WARNING) <= 120


def test_without_an_annotations_map_the_whole_map_is_added() -> None:
    verdict = guard(node(PRESERVED_BY_MARKER), node({}), present=False)
    assert verdict.patch == (PatchOperation("add", "/metadata/annotations", {CA: "true"}),)


@pytest.mark.parametrize(
    ("old", "new", "username"),
    [
        (node(PRESERVED_BY_MARKER), node({MARKER: "true"}), CONTROLLER),  # the controller stops preservation
        (node({CA: "true"}), node({}), "alice"),  # not preserved: the user's own annotation
        (node({CA: "true"}, preserved="False"), node({}, preserved="False"), "alice"),  # preservation stopped
        (node(PRESERVED_BY_MARKER), node({**PRESERVED_BY_MARKER, "x": "y"}), "alice"),  # untouched
        (node({CA: "false", MARKER: "true"}), node({CA: "false", MARKER: "true", "x": "1"}), "alice"),  # not changed
        (node({MARKER: "true"}), node({CA: "true", MARKER: "true"}), "alice"),  # set to true
    ],
)
def test_everything_else_passes_untouched(old: Node, new: Node, username: str) -> None:
    verdict = guard(old, new, username=username)
    assert verdict.allowed
    assert verdict.patch == ()
    assert verdict.warnings == ()


def test_create_has_nothing_to_guard() -> None:
    assert guard(None, node({CA: "false", MARKER: "true"})).patch == ()


def test_a_request_dropping_marker_and_annotation_together_is_still_guarded() -> None:
    assert guard(node(PRESERVED_BY_MARKER), node({})).patch == (PatchOperation("add", CA_POINTER, "true"),)


@pytest.mark.parametrize(
    ("candidate", "native", "preserved"),
    [
        (node({MARKER: "true"}), False, True),
        (node({MARKER: ""}), False, True),
        (node({MARKER: "true"}), True, True),
        (node({}, preserved="True"), False, True),
        (node({}, preserved="False"), False, False),
        (node({CA: "true"}), False, False),
        # MCM's marker: its preservation where it preserves natively, else only its rollout's annotation.
        (node({CA: "true", MCM_MARKER: "true"}), True, True),
        (node({CA: "true", MCM_MARKER: "true"}), False, False),
    ],
)
def test_what_counts_as_preserved(candidate: Node, native: bool, preserved: bool) -> None:
    assert is_preserved_node(candidate, mcm_native_preservation=native) is preserved


def test_a_rollouts_annotation_is_not_guarded_without_native_preservation() -> None:
    rollout = node({CA: "true", MCM_MARKER: "true"})
    assert guard(rollout, node({MCM_MARKER: "true"})).patch == ()
    assert guard(rollout, node({MCM_MARKER: "true"}), native=True).patch == (PatchOperation("add", CA_POINTER, "true"),)


values = st.one_of(st.none(), st.sampled_from(["true", "false", "", "True", "1"]))


@given(before=values, after=values, marker=st.booleans(), condition=st.sampled_from([None, "True", "False"]))
def test_after_the_patch_the_annotation_is_true_or_was_left_alone(
    before: str | None, after: str | None, marker: bool, condition: str | None
) -> None:
    def make(value: str | None) -> Node:
        annotations = {CA: value} if value is not None else {}
        if marker:
            annotations[MARKER] = "true"
        return node(annotations, preserved=condition)

    verdict = guard(make(before), make(after))
    assert verdict.allowed
    protected = marker or condition == "True"
    if verdict.patch:
        assert protected
        assert after != "true"
        assert before != after
    elif protected:
        assert after == "true" or after == before


# --- MCM's rollout marker on nodes we preserve ---------------------------------------------------------------

MCM = "system:serviceaccount:kube-system:machine-controller-manager"
MCM_POINTER = "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled-by-mcm"


def guard_marker(old: Node | None, new: Node, *, username: str = MCM, native: bool = False) -> Verdict:
    settings = AdmissionSettings(
        controller_username=CONTROLLER, mcm_usernames=frozenset({MCM}), mcm_native_preservation=native
    )
    return guard_mcm_marker(old_node=old, new_node=new, username=username, settings=settings)


def test_mcm_adding_its_marker_to_a_node_we_preserve_is_patched_out() -> None:
    verdict = guard_marker(node(PRESERVED_BY_MARKER), node({**PRESERVED_BY_MARKER, MCM_MARKER: "true"}))
    assert verdict.allowed
    assert verdict.patch == (PatchOperation("remove", MCM_POINTER),)
    assert verdict.patch[0].as_json() == {"op": "remove", "path": MCM_POINTER}
    assert verdict.warnings == (MCM_MARKER_WARNING,)


@pytest.mark.parametrize(
    ("old", "new", "username", "native"),
    [
        (node({CA: "true"}), node({CA: "true", MCM_MARKER: "true"}), MCM, False),  # not ours: MCM's rollout as usual
        (node(PRESERVED_BY_MARKER), node({**PRESERVED_BY_MARKER, MCM_MARKER: "true"}), "alice", False),  # not MCM
        (node(PRESERVED_BY_MARKER), node({**PRESERVED_BY_MARKER, MCM_MARKER: "true"}), MCM, True),  # MCM's own
        (node({**PRESERVED_BY_MARKER, MCM_MARKER: "true"}), node({**PRESERVED_BY_MARKER, MCM_MARKER: "x"}), MCM, False),
        (
            node(PRESERVED_BY_MARKER),
            node({CA: "true", MCM_MARKER: "true"}),
            MCM,
            False,
        ),  # ours dropped: denied elsewhere
        (node(PRESERVED_BY_MARKER), node(PRESERVED_BY_MARKER), MCM, False),  # nothing added
    ],
)
def test_everything_else_keeps_mcms_marker(old: Node, new: Node, username: str, native: bool) -> None:
    verdict = guard_marker(old, new, username=username, native=native)
    assert verdict.allowed
    assert verdict.patch == ()
    assert verdict.warnings == ()


@given(
    ours_before=st.booleans(),
    ours_after=st.booleans(),
    marker_before=st.booleans(),
    marker_after=st.booleans(),
    by_mcm=st.booleans(),
    native=st.booleans(),
)
def test_the_marker_is_patched_out_exactly_when_mcm_adds_it_to_a_node_we_preserve(
    ours_before: bool, ours_after: bool, marker_before: bool, marker_after: bool, by_mcm: bool, native: bool
) -> None:
    def make(ours: bool, marker: bool) -> Node:
        return node({CA: "true", **({MARKER: "true"} if ours else {}), **({MCM_MARKER: "true"} if marker else {})})

    verdict = guard_marker(
        make(ours_before, marker_before),
        make(ours_after, marker_after),
        username=MCM if by_mcm else "alice",
        native=native,
    )
    expected = by_mcm and not native and ours_before and ours_after and marker_after and not marker_before
    assert verdict.allowed
    assert bool(verdict.patch) is expected
