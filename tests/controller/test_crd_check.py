"""The startup inspection of MCM's CRDs: does the served schema keep status.currentStatus.preserveExpiryTime, and
is the Machine CRD usable at all?"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from machine_preservation.controller.preservation.crd_check import CrdCheckFailed, check_machine_crd
from machine_preservation.core.mcm_evidence import EXPIRY_PATH, keeps
from machine_preservation.localcluster.crds import crd_manifests


def machine_crd() -> dict[str, Any]:
    return copy.deepcopy(next(m for m in crd_manifests() if m["metadata"]["name"] == "machines.machine.sapcloud.io"))


def status_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_the_shipped_crd_keeps_the_field() -> None:
    check_machine_crd(machine_crd())


@pytest.mark.parametrize(
    ("schema", "kept"),
    [
        ({"type": "object"}, False),
        ({"type": "object", "properties": {"status": {"type": "object"}}}, False),
        ({"properties": {"status": {"properties": {"currentStatus": {"properties": {"phase": {}}}}}}}, False),
        ({"properties": {"status": {"x-kubernetes-preserve-unknown-fields": True}}}, True),
        ({"properties": {"status": {"properties": {"currentStatus": {"additionalProperties": True}}}}}, True),
        (
            {"properties": {"status": {"properties": {"currentStatus": {"additionalProperties": {"type": "string"}}}}}},
            True,
        ),
        ({"x-kubernetes-preserve-unknown-fields": True}, True),
        (
            {"properties": {"status": {"properties": {"currentStatus": {"properties": {"preserveExpiryTime": {}}}}}}},
            True,
        ),
    ],
)
def test_keeps_the_expiry(schema: dict[str, Any], kept: bool) -> None:
    crd = {"spec": {"versions": [{"name": "v1alpha1", "served": True, "schema": {"openAPIV3Schema": schema}}]}}
    assert keeps(crd, EXPIRY_PATH) is kept


def test_an_mcm_v061_crd_without_the_field_is_accepted_and_reported_as_pruning() -> None:
    crd = machine_crd()
    assert check_machine_crd(crd) is True
    del status_schema(crd)["properties"]["currentStatus"]["properties"]["preserveExpiryTime"]
    assert check_machine_crd(crd) is False


def test_preserve_unknown_fields_on_current_status_keeps_the_field() -> None:
    crd = machine_crd()
    current = status_schema(crd)["properties"]["currentStatus"]
    del current["properties"]["preserveExpiryTime"]
    current["x-kubernetes-preserve-unknown-fields"] = True
    assert check_machine_crd(crd) is True


def test_keeps_looks_at_the_served_version_only() -> None:
    crd = machine_crd()
    assert keeps(crd, EXPIRY_PATH)
    crd["spec"]["versions"][0]["served"] = False
    assert not keeps(crd, EXPIRY_PATH)


def test_missing_version_and_missing_status_subresource_are_reported() -> None:
    crd = machine_crd()
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    with pytest.raises(CrdCheckFailed, match="does not serve version v1alpha1"):
        check_machine_crd(crd)
    crd = machine_crd()
    del crd["spec"]["versions"][0]["subresources"]
    with pytest.raises(CrdCheckFailed, match="no status subresource"):
        check_machine_crd(crd)
