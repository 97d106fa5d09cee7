"""The controller's cached Node (`models.cached_node`): it keeps only what the product reads of a Node, so every
plan made from it is the plan made from the whole Node."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.lifecycle import node_is_healthy
from machine_preservation.core.models import CACHED_CONDITIONS_LIMIT, CACHED_VALUE_LIMIT, Node, cached_node
from machine_preservation.core.native import plan_native

from .lifecycle_helpers import CONFIG
from .test_lifecycle_properties import replan, snapshots

CONDITION_KINDS = [
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "KernelDeadlock",
    "ReadonlyFilesystem",
    "NetworkUnavailable",
    "FrequentKubeletRestart",
]
STATUSES = ["True", "False", "Unknown"]
FOREIGN_ANNOTATIONS = {
    "node.alpha.kubernetes.io/ttl": "0",
    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    "node.machine.sapcloud.io/last-applied-anno-labels-taints": '{"metadata":{"labels":{"a":"b"}}}',
    "cluster-autoscaler.kubernetes.io/other": "x",
}
CONFIGS = [
    CONFIG,
    dataclasses.replace(CONFIG, unhealthy_node_conditions=("FrequentKubeletRestart", "MemoryPressure")),
    dataclasses.replace(CONFIG, unhealthy_node_conditions=()),
]

extra_conditions = st.lists(
    st.builds(
        lambda kind, status, heartbeat: {
            "type": kind,
            "status": status,
            "reason": f"{kind}Reason",
            "message": f"the kubelet says {kind} is {status}",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": "2026-11-20T10:00:00Z",
        },
        st.sampled_from(CONDITION_KINDS[1:]),
        st.sampled_from(STATUSES),
        st.sampled_from(["2026-11-26T10:00:00Z", "2026-11-26T10:05:00Z"]),
    ),
    max_size=4,
    unique_by=lambda c: c["type"],
)


def with_noise(node: Node, conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """`node` as the API serves it, with what other components write beside the product's parts."""
    raw = node.model_dump(by_alias=True, mode="json")
    raw["metadata"]["labels"] = {"kubernetes.io/hostname": raw["metadata"]["name"], "worker.gardener.cloud/pool": "a"}
    raw["metadata"]["annotations"] = {**FOREIGN_ANNOTATIONS, **raw["metadata"]["annotations"]}
    raw["status"]["conditions"] = [*raw["status"]["conditions"], *conditions]
    raw["status"]["images"] = [{"names": ["registry/image:1"], "sizeBytes": 1}]
    raw["spec"]["podCIDR"] = "100.96.0.0/24"
    return raw


@settings(max_examples=400, deadline=None)
@given(snapshot=snapshots(), conditions=extra_conditions, config=st.sampled_from(CONFIGS))
def test_every_plan_from_the_cached_node_is_the_plan_from_the_whole_node(
    snapshot: dict[str, Any], conditions: list[dict[str, Any]], config: Any
) -> None:
    if snapshot["node"] is None:
        return
    snapshot = {**snapshot, "config": dataclasses.replace(snapshot["config"], **_unhealthy(config))}
    raw = with_noise(snapshot["node"], conditions)
    whole, cached = Node.model_validate(copy.deepcopy(raw)), cached_node(raw)

    assert replan(snapshot, snapshot["machine"], cached) == replan(snapshot, snapshot["machine"], whole)
    assert node_is_healthy(node=cached, config=snapshot["config"]) == node_is_healthy(
        node=whole, config=snapshot["config"]
    )
    assert plan_native(machine=snapshot["machine"], node=cached, config=snapshot["config"]) == plan_native(
        machine=snapshot["machine"], node=whole, config=snapshot["config"]
    )


def _unhealthy(config: Any) -> dict[str, Any]:
    return {"unhealthy_node_conditions": config.unhealthy_node_conditions}


def test_what_the_cache_keeps() -> None:
    raw = {
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "resourceVersion": "42",
            "deletionTimestamp": "2026-11-26T10:00:00Z",
            "labels": {"kubernetes.io/hostname": "n1"},
            "ownerReferences": [{"kind": "X", "name": "x", "uid": "x"}],
            "annotations": {
                **FOREIGN_ANNOTATIONS,
                v.PRESERVE_ANNOTATION: "now",
                v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true",
            },
        },
        "spec": {
            "providerID": "aws:///i-1",
            "taints": [
                {"key": "k", "effect": "NoSchedule"},
                {"key": v.PRESERVED_TAINT_KEY, "effect": "NoExecute"},
                {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT, "timeAdded": "2026-11-26T09:00:00Z"},
            ],
            "unschedulable": True,
        },
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ready",
                    "lastHeartbeatTime": "2026-11-26T10:00:00Z",
                },
                {"type": "MemoryPressure", "status": "False", "reason": "Fine", "message": "fine"},
                {"type": "KernelDeadlock", "status": "True", "reason": "Deadlock", "message": "deadlocked"},
                {
                    "type": v.PRESERVED_CONDITION_TYPE,
                    "status": "True",
                    "reason": "Preserved by user.",
                    "message": "Machine preserved until 2026-11-27 10:00:00 +0000 UTC.",
                    "lastTransitionTime": "2026-11-26T09:00:00Z",
                    "lastHeartbeatTime": "2026-11-26T10:00:00Z",
                },
            ],
            "images": [{"names": ["x"], "sizeBytes": 1}],
        },
    }
    node = cached_node(raw)

    assert (node.metadata.name, node.metadata.uid, node.metadata.resource_version) == ("n1", "u1", "42")
    assert node.metadata.deletion_timestamp is not None
    assert {field.name for field in dataclasses.fields(node.metadata)} == {  # no labels, owner references, ...
        "name",
        "generate_name",
        "uid",
        "resource_version",
        "annotations",
        "annotated",
        "deletion_timestamp",
    }
    assert node.metadata.annotations == {v.PRESERVE_ANNOTATION: "now", v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true"}
    assert (node.spec.provider_id, node.spec.unschedulable, node.spec.has_taints) == ("aws:///i-1", True, True)
    assert [(t.key, t.effect, t.index) for t in node.spec.taints] == [
        (v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT, 2)
    ]
    assert node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
    assert [(c.type, c.status, c.reason, c.message) for c in node.status.conditions] == [
        ("Ready", "True", "", ""),
        ("KernelDeadlock", "True", "", ""),
        (
            v.PRESERVED_CONDITION_TYPE,
            "True",
            "Preserved by user.",
            "Machine preserved until 2026-11-27 10:00:00 +0000 UTC.",
        ),
    ]
    preserved = node.preserved_condition
    assert preserved is not None
    assert preserved.last_transition_time is not None
    assert preserved.last_heartbeat_time is None


def test_a_hostile_node_is_cached_bounded() -> None:
    # A shoot owner's Node: thousands of taints, labels and True conditions, long messages and long values in the
    # annotations the product reads. The cache keeps a bounded part of it, whatever its size.
    long = "x" * 100_000
    raw = {
        "metadata": {
            "name": "n1",
            "labels": {f"label-{i}": long[:60] for i in range(1_000)},
            "annotations": {v.PRESERVE_ANNOTATION: long, v.PRESERVED_SINCE_ANNOTATION: "2026-11-26T09:00:00Z"},
        },
        "spec": {
            "providerID": long,
            "taints": [{"key": f"owner/taint-{i}", "value": long[:100], "effect": "NoSchedule"} for i in range(5_000)],
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "message": long},
                {"type": v.PRESERVED_CONDITION_TYPE, "status": "True", "reason": long, "message": long},
                *({"type": f"Owner{i}", "status": "True", "message": long} for i in range(100)),
            ],
            "images": [{"names": [f"registry/image-{i}:1"], "sizeBytes": 1} for i in range(500)],
        },
    }

    node = cached_node(raw)

    assert node.metadata.annotations == {
        v.PRESERVE_ANNOTATION: long[:CACHED_VALUE_LIMIT],
        v.PRESERVED_SINCE_ANNOTATION: "2026-11-26T09:00:00Z",
    }
    assert (node.spec.taints, node.spec.has_taints) == ((), True)
    assert len(node.spec.provider_id) == CACHED_VALUE_LIMIT
    assert [c.type for c in node.status.conditions] == [
        "Ready",
        v.PRESERVED_CONDITION_TYPE,
        *(f"Owner{i}" for i in range(CACHED_CONDITIONS_LIMIT)),
    ]
    preserved = node.preserved_condition
    assert preserved is not None
    assert (len(preserved.reason), len(preserved.message)) == (CACHED_VALUE_LIMIT, CACHED_VALUE_LIMIT)
    assert len(node.model_dump_json()) < 8 * CACHED_VALUE_LIMIT


def test_a_node_without_taints_says_so() -> None:
    assert not cached_node({"metadata": {"name": "n1"}, "spec": {"taints": []}}).spec.has_taints
    assert not Node.model_validate({"metadata": {"name": "n1"}}).spec.has_taints
    assert Node.model_validate({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}).spec.has_taints


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"metadata": None, "spec": None, "status": None},
        {"metadata": {"annotations": None}, "status": {"conditions": None}},
        {"metadata": {"annotations": []}, "status": {"conditions": ["not an object"]}},
    ],
)
def test_absent_or_malformed_parts_count_as_empty(raw: dict[str, Any]) -> None:
    node = cached_node(raw)

    assert node.metadata.annotations == {}
    assert node.status.conditions == []


@pytest.mark.parametrize(
    "condition",
    [{"status": "True"}, {"type": "Ready"}, {"type": 3, "status": "True"}],
)
def test_a_condition_without_type_or_status_does_not_parse(condition: dict[str, Any]) -> None:
    # The informer skips an object that does not parse (a ValueError), as it does for the whole model.
    with pytest.raises(ValueError, match="conditions"):
        cached_node({"metadata": {"name": "n1"}, "status": {"conditions": [condition]}})
    with pytest.raises(ValueError, match="conditions"):
        Node.model_validate({"metadata": {"name": "n1"}, "status": {"conditions": [condition]}})


def test_the_vocabulary_lists_every_annotation() -> None:
    named = {value for name, value in vars(v).items() if name.endswith("_ANNOTATION")}

    assert named
    assert named == v.ANNOTATIONS


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, False),
        ({}, False),
        (FOREIGN_ANNOTATIONS, True),  # none kept, but the map exists
        ({v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true"}, True),
    ],
)
def test_the_cached_node_knows_whether_the_node_has_annotations(
    annotations: dict[str, str] | None, expected: bool
) -> None:
    metadata: dict[str, Any] = {"name": "n", "resourceVersion": "7"}
    if annotations is not None:
        metadata["annotations"] = annotations
    cached = cached_node({"metadata": metadata})
    assert cached.metadata.has_annotations is expected
    assert Node.model_validate({"metadata": metadata}).metadata.has_annotations is expected
