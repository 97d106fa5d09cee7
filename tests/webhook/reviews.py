"""Builders of AdmissionReview bodies and the objects inside them, as the API server sends them."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from machine_preservation.core import vocabulary as v

ADMIN = "kubernetes-admin"
CONTROLLER = "system:serviceaccount:mp:controller"
MCM = "system:serviceaccount:kube-system:machine-controller-manager"

NODE_KIND = {"group": "", "version": "v1", "kind": "Node"}
MACHINE_KIND = {"group": v.MACHINE_API_GROUP, "version": v.MACHINE_API_VERSION, "kind": "Machine"}
MACHINE_SET_KIND = {"group": v.MACHINE_API_GROUP, "version": v.MACHINE_API_VERSION, "kind": "MachineSet"}
SHOOT_KIND = {"group": v.SHOOT_API_GROUP, "version": v.SHOOT_API_VERSION, "kind": "Shoot"}


def node(
    name: str = "n1", annotations: dict[str, str] | None = None, *, preserved: str | None = None
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"providerID": f"aws:///eu-1a/{name}"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    if annotations is not None:
        document["metadata"]["annotations"] = annotations
    if preserved is not None:
        document["status"]["conditions"].append({"type": "Preserved", "status": preserved})
    return document


def machine(
    name: str = "m1",
    annotations: dict[str, str] | None = None,
    *,
    phase: str = "Running",
    expiry: str | None = None,
    owner: str = "ms",
    namespace: str = "shoot--p--s",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if expiry is not None:
        status["preserveExpiryTime"] = expiry
    return {
        "apiVersion": f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": annotations or {},
            "labels": {"node": f"node-{name}"},
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "ownerReferences": [{"kind": "MachineSet", "name": owner, "uid": f"uid-{owner}", "controller": True}],
        },
        "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
        "status": {"currentStatus": status},
    }


def machine_set(name: str = "ms", *, max_: int = 1, namespace: str = "shoot--p--s") -> dict[str, Any]:
    return {
        "apiVersion": f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}",
        "kind": "MachineSet",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"replicas": 2, "autoPreserveFailedMachineMax": max_},
    }


def shoot(*workers: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{v.SHOOT_API_GROUP}/{v.SHOOT_API_VERSION}",
        "kind": "Shoot",
        "metadata": {"name": "s", "namespace": "garden-p"},
        "spec": {"provider": {"type": "aws", "workers": list(workers)}},
    }


def review(
    *,
    kind: dict[str, str],
    operation: str,
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    username: str = ADMIN,
    groups: tuple[str, ...] = ("system:authenticated",),
    dry_run: bool = False,
    sub_resource: str = "",
    uid: str | None = None,
) -> dict[str, Any]:
    source = obj or old or {}
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": kind,
        "resource": {"group": kind["group"], "version": kind["version"], "resource": kind["kind"].lower() + "s"},
        "name": source.get("metadata", {}).get("name", ""),
        "namespace": source.get("metadata", {}).get("namespace", ""),
        "operation": operation,
        "userInfo": {"username": username, "uid": "u", "groups": list(groups)},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response.get("patchType") == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` (the only operation the webhook emits), with RFC 6901 pointer unescaping."""
    result: dict[str, Any] = json.loads(json.dumps(document))
    for operation in patch:
        assert operation["op"] == "add"
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in operation["path"].split("/")[1:]]
        parent = result
        for token in tokens[:-1]:
            parent = parent[token]
        parent[tokens[-1]] = operation["value"]
    return result
