"""How the end-to-end tests read a write from the API server's audit log (tests/e2e/product.py)."""

from __future__ import annotations

from typing import Any

from tests.e2e.product import Product

MCM = "system:serviceaccount:kube-system:machine-controller-manager"
MARKER = "cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm"


def node_update(annotations: dict[str, str]) -> dict[str, Any]:
    """One audit event of MCM's update of a Node (abridged from a real e2e audit log)."""
    return {
        "stage": "ResponseComplete",
        "verb": "update",
        "user": {"username": MCM},
        "objectRef": {"resource": "nodes", "name": "pool-7f789-nhfw2"},
        "requestObject": {"metadata": {"name": "pool-7f789-nhfw2", "annotations": {MARKER: "true"}}},
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": "2026-11-29T04:14:51.055000Z",
        "stageTimestamp": "2026-11-29T04:14:51.081000Z",
        "annotations": {"authorization.k8s.io/decision": "allow", **annotations},
    }


def test_a_write_our_mutating_webhook_answered_did_not_fail_open() -> None:
    mutated = '{"configuration":"c","webhook":"mcm-marker.nodes","mutated":true}'
    write = Product._write_from(node_update({"mutation.webhook.admission.k8s.io/round_0_index_1": mutated}), MCM)
    assert write is not None
    assert f"metadata.annotations[{MARKER}]" in write.fields
    assert not write.failed_open


def test_a_write_a_webhook_could_not_answer_failed_open() -> None:
    failed = {"failed-open.mutation.webhook.admission.k8s.io/round_0_index_1": "mcm-marker.nodes"}
    write = Product._write_from(node_update(failed), MCM)
    assert write is not None
    assert write.failed_open
    assert write.completed > write.at
