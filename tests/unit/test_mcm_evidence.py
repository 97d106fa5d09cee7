"""Reading MCM's generation from its Deployment and CRDs (core.mcm_evidence)."""

from __future__ import annotations

from typing import Any

import pytest

from machine_preservation.core.mcm_evidence import AUTO_MAX_PATH, EXPIRY_PATH, cluster_evidence, keeps, mcm_image
from machine_preservation.core.mcm_generation import ClusterEvidence, NativePreservationMode, decide_native_preservation


def deployment(*containers: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "machine-controller-manager"},
        "spec": {"template": {"spec": {"containers": [{"name": n, "image": i} for n, i in containers]}}},
    }


def crd(schema: dict[str, Any], *, served: bool = True, version: str = "v1alpha1") -> dict[str, Any]:
    return {"spec": {"versions": [{"name": version, "served": served, "schema": {"openAPIV3Schema": schema}}]}}


def obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def test_mcms_own_container_is_chosen_over_provider_sidecars() -> None:
    sidecar = ("machine-controller-manager-provider-aws", "repo/mcm-provider-aws:v0.99.0")
    own = ("machine-controller-manager", "repo/machine-controller-manager:v0.62.1")
    assert mcm_image(deployment(sidecar, own)) == "repo/machine-controller-manager:v0.62.1"
    assert mcm_image(deployment(("mcm", "repo/machine-controller-manager:v0.61.3"))) == (
        "repo/machine-controller-manager:v0.61.3"
    )
    for broken in ({}, {"spec": []}, deployment(), {"spec": {"template": {"spec": {"containers": [{"name": "x"}]}}}}):
        assert mcm_image(broken) is None


@pytest.mark.parametrize(
    ("schema", "kept"),
    [
        (obj(status=obj(currentStatus=obj(preserveExpiryTime={"type": "string"}))), True),
        (obj(status=obj(currentStatus=obj(phase={"type": "string"}))), False),
        (obj(status=obj(currentStatus={"type": "object", "x-kubernetes-preserve-unknown-fields": True})), True),
        (obj(status={"type": "object", "additionalProperties": obj(preserveExpiryTime={"type": "string"})}), True),
        (obj(status={"type": "object", "additionalProperties": True}), True),
        ({}, False),
    ],
)
def test_a_field_is_kept_where_the_schema_declares_or_preserves_it(schema: dict[str, Any], kept: bool) -> None:
    assert keeps(crd(schema), EXPIRY_PATH) is kept


def test_a_version_not_served_keeps_nothing() -> None:
    schema = obj(status=obj(currentStatus=obj(preserveExpiryTime={"type": "string"})))
    assert not keeps(crd(schema, served=False), EXPIRY_PATH)
    assert not keeps(crd(schema, version="v1beta1"), EXPIRY_PATH)
    assert not keeps({"spec": {"versions": "x"}}, EXPIRY_PATH)


def test_what_could_not_be_read_is_no_evidence() -> None:
    assert cluster_evidence(deployment=None, machine_crd=None, machine_set_crd=None) == ClusterEvidence()


def _generation(native: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Machine and MachineSet CRDs shaped like MCM's: v0.62 declares the preservation fields, v0.61 does not."""
    current = {"phase": {"type": "string"}, **({"preserveExpiryTime": {"type": "string"}} if native else {})}
    spec = {
        "replicas": {"type": "integer"},
        **({"autoPreserveFailedMachineMax": {"type": "integer"}} if native else {}),
    }
    machine = crd(obj(status=obj(currentStatus=obj(**current))))
    machine_set = crd(obj(spec=obj(**spec)))
    return machine, machine_set


@pytest.mark.parametrize("native", [False, True])
def test_the_crds_tell_the_generations_apart_and_the_image_wins(native: bool) -> None:
    machine, machine_set = _generation(native)
    evidence = cluster_evidence(deployment=None, machine_crd=machine, machine_set_crd=machine_set)
    assert (evidence.machine_crd_has_expiry, evidence.machine_set_crd_has_auto_max) == (native, native)
    assert decide_native_preservation(mode=NativePreservationMode.AUTO, evidence=evidence).native is native
    assert keeps(machine_set, AUTO_MAX_PATH) is native
    # v0.62 CRDs installed under v0.61 binaries: the image decides.
    image = "r/machine-controller-manager:v0.61.3"
    told = cluster_evidence(
        deployment=deployment(("machine-controller-manager", image)), machine_crd=machine, machine_set_crd=machine_set
    )
    assert not decide_native_preservation(mode=NativePreservationMode.AUTO, evidence=told).native
