"""The schema walk behind the startup check: where would status.currentStatus.preserveExpiryTime be pruned?"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from machine_preservation.cluster.crds import crd_manifests
from machine_preservation.controller.crd_check import CrdCheckFailed, check_machine_crd, pruned_at


def machine_crd() -> dict[str, Any]:
    return copy.deepcopy(next(m for m in crd_manifests() if m["metadata"]["name"] == "machines.machine.sapcloud.io"))


def status_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_the_shipped_crd_keeps_the_field() -> None:
    check_machine_crd(machine_crd())


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object"}, "<root>"),
        ({"type": "object", "properties": {"status": {"type": "object"}}}, "status"),
        (
            {"properties": {"status": {"properties": {"currentStatus": {"properties": {"phase": {}}}}}}},
            "status.currentStatus",
        ),
        ({"properties": {"status": {"x-kubernetes-preserve-unknown-fields": True}}}, None),
        ({"properties": {"status": {"properties": {"currentStatus": {"additionalProperties": True}}}}}, None),
        (
            {"properties": {"status": {"properties": {"currentStatus": {"additionalProperties": {"type": "string"}}}}}},
            None,
        ),
        ({"x-kubernetes-preserve-unknown-fields": True}, None),
        (
            {"properties": {"status": {"properties": {"currentStatus": {"properties": {"preserveExpiryTime": {}}}}}}},
            None,
        ),
    ],
)
def test_pruned_at(schema: dict[str, Any], where: str | None) -> None:
    assert pruned_at(schema) == where


def test_an_mcm_crd_without_the_field_fails_with_the_fix() -> None:
    crd = machine_crd()
    del status_schema(crd)["properties"]["currentStatus"]["properties"]["preserveExpiryTime"]
    with pytest.raises(CrdCheckFailed) as failed:
        check_machine_crd(crd)
    message = str(failed.value)
    assert "would prune status.currentStatus.preserveExpiryTime" in message
    assert "the schema at status.currentStatus" in message
    assert "Fix:" in message
    assert "preserveExpiryTime: {type: string, format: date-time, nullable: true}" in message


def test_preserve_unknown_fields_on_current_status_is_enough() -> None:
    crd = machine_crd()
    current = status_schema(crd)["properties"]["currentStatus"]
    del current["properties"]["preserveExpiryTime"]
    current["x-kubernetes-preserve-unknown-fields"] = True
    check_machine_crd(crd)


def test_missing_version_and_missing_status_subresource_are_reported() -> None:
    crd = machine_crd()
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    with pytest.raises(CrdCheckFailed, match="does not serve version v1alpha1"):
        check_machine_crd(crd)
    crd = machine_crd()
    del crd["spec"]["versions"][0]["subresources"]
    with pytest.raises(CrdCheckFailed, match="no status subresource"):
        check_machine_crd(crd)
