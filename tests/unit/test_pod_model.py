"""The cached Pod: a served Pod boiled down to what a drain reads, losing nothing the drain decides on."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import CACHED_POD_LABELS_LIMIT, Pod


def served(
    *, annotations: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None, **metadata: Any
) -> dict[str, Any]:
    """A Pod as the API serves it, with the fields a drain ignores filled in too."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "u",
            "labels": {"app": "web"},
            "annotations": {"prometheus.io/scrape": "true", **(annotations or {})},
            "ownerReferences": owners or [],
            **metadata,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    }


def owner(kind: str, *, controller: bool | None = True) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": "u", "controller": controller}


@pytest.mark.parametrize(
    ("raw", "mirror", "controller_kind"),
    [
        (served(), False, ""),
        (served(annotations={v.MIRROR_POD_ANNOTATION: "abc"}), True, ""),
        (served(owners=[owner("DaemonSet")]), False, "DaemonSet"),
        (served(owners=[owner("DaemonSet", controller=False), owner("ReplicaSet")]), False, "ReplicaSet"),
        (served(owners=[owner("DaemonSet", controller=None)]), False, ""),  # not the controller: evictable
        (served(owners=[owner("StatefulSet")]), False, "StatefulSet"),
    ],
    ids=["plain", "mirror", "daemonset", "controller-is-the-replicaset", "daemonset-not-controller", "statefulset"],
)
def test_a_served_pod_keeps_what_a_drain_decides_on(raw: dict[str, Any], mirror: bool, controller_kind: str) -> None:
    pod = Pod.model_validate(raw)
    assert (pod.name, pod.namespace, pod.node_name) == ("web-0", "shop", "n1")
    assert (pod.mirror, pod.controller_kind, pod.deletion_timestamp) == (mirror, controller_kind, None)


def test_deletion_timestamp_and_missing_parts() -> None:
    deleting = Pod.model_validate(served(deletionTimestamp="2026-11-21T10:00:00Z"))
    assert deleting.deletion_timestamp == dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
    bare = Pod.model_validate({"metadata": {"name": "p"}})
    assert (bare.name, bare.namespace, bare.node_name, bare.mirror, bare.controller_kind) == ("p", "", "", False, "")
    nulls = Pod.model_validate({"metadata": {"name": "p", "annotations": None, "ownerReferences": None}, "spec": None})
    assert (nulls.mirror, nulls.controller_kind) == (False, "")


def test_the_reduced_form_round_trips() -> None:
    pod = Pod.model_validate(served(owners=[owner("DaemonSet")]))
    assert Pod.model_validate(pod.model_dump()) == pod
    assert Pod.model_validate(pod.model_dump(by_alias=True)) == pod


@pytest.mark.parametrize(
    "raw",
    [
        {"metadata": "x"},
        {"metadata": {"name": "p", "annotations": ["a"], "ownerReferences": {"kind": "DaemonSet"}}, "spec": 3},
        {"metadata": {"name": "p", "ownerReferences": ["DaemonSet", {"kind": "DaemonSet", "controller": "yes"}]}},
    ],
)
def test_malformed_parts_never_raise_anything_but_a_validation_error(raw: dict[str, Any]) -> None:
    try:
        pod = Pod.model_validate(raw)
    except ValidationError:
        return
    assert (pod.mirror, pod.controller_kind) == (False, "")


def test_a_served_pod_keeps_its_labels_for_the_budgets_that_cover_it() -> None:
    pod = Pod.model_validate(served(labels={"app": "web", "pod-template-hash": "5d8f"}))
    assert pod.labels == {"app": "web", "pod-template-hash": "5d8f"}
    assert Pod.model_validate({"metadata": {"name": "p"}}).labels == {}
    assert Pod.model_validate({"metadata": {"name": "p", "labels": None}}).labels == {}


@pytest.mark.parametrize(
    "labels",
    [
        {f"k{i}": "v" for i in range(CACHED_POD_LABELS_LIMIT + 1)},  # a shoot owner's pod with too many
        {"app": "x" * 64},  # a value Kubernetes would not accept
        {"p" * 254 + "/" + "n" * 63: "v"},  # a key Kubernetes would not accept
        {"app": 3},
    ],
    ids=["too-many", "long-value", "long-key", "not-a-string"],
)
def test_labels_that_could_not_be_kept_whole_are_not_kept(labels: dict[str, Any]) -> None:
    # None, not a part of them: a budget's selector matched against some of a pod's labels could be wrong.
    assert Pod.model_validate(served(labels=labels)).labels is None


def test_the_most_labels_kept_are_kept_whole() -> None:
    labels = {f"k{i}": "v" * 63 for i in range(CACHED_POD_LABELS_LIMIT)}
    assert Pod.model_validate(served(labels=labels)).labels == labels
