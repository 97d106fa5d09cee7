"""Reading the evidence `mcm_generation.decide_native_preservation` weighs from the objects the API serves.

- MCM's image: the Deployment `machine-controller-manager` in the control namespace, as Gardener runs it; its
  container of that name (the others are provider sidecars with versions of their own), else its first.
- MCM's CRDs: whether the served v1alpha1 schema keeps a field. The API server drops (prunes) fields a
  structural schema does not declare, unless an enclosing object preserves unknown fields or has an
  `additionalProperties` schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from machine_preservation.core import vocabulary as v
from machine_preservation.core.mcm_generation import ClusterEvidence
from machine_preservation.core.models import mapping_of

MCM_DEPLOYMENT: Final = "machine-controller-manager"
MACHINE_CRD: Final = f"machines.{v.MACHINE_API_GROUP}"
MACHINE_SET_CRD: Final = f"machinesets.{v.MACHINE_API_GROUP}"
EXPIRY_PATH: Final = ("status", "currentStatus", "preserveExpiryTime")
AUTO_MAX_PATH: Final = ("spec", "autoPreserveFailedMachineMax")


def _sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def mcm_image(deployment: Mapping[str, Any]) -> str | None:
    """The image of MCM's own container in its Deployment; None when it has none."""
    pod = mapping_of(mapping_of(mapping_of(deployment.get("spec")).get("template")).get("spec"))
    containers = [c for c in _sequence(pod.get("containers")) if isinstance(c, Mapping)]
    chosen = next((c for c in containers if c.get("name") == MCM_DEPLOYMENT), containers[0] if containers else None)
    image = chosen.get("image") if chosen is not None else None
    return image if isinstance(image, str) and image else None


def keeps(crd: Mapping[str, Any], path: Sequence[str], *, version: str = v.MACHINE_API_VERSION) -> bool:
    """Whether the CRD serves `version` with a schema that keeps the field at `path`."""
    entry = next(
        (e for e in _sequence(mapping_of(crd.get("spec")).get("versions")) if mapping_of(e).get("name") == version),
        None,
    )
    if entry is None or entry.get("served") is not True:
        return False
    node = mapping_of(mapping_of(entry.get("schema")).get("openAPIV3Schema"))
    for key in path:
        properties = mapping_of(node.get("properties"))
        additional = node.get("additionalProperties")
        if key in properties:
            node = mapping_of(properties[key])
        elif isinstance(additional, dict):
            node = additional
        else:
            return node.get("x-kubernetes-preserve-unknown-fields") is True or additional is True
    return True


def cluster_evidence(
    *,
    deployment: Mapping[str, Any] | None,
    machine_crd: Mapping[str, Any] | None,
    machine_set_crd: Mapping[str, Any] | None,
) -> ClusterEvidence:
    """The evidence from what could be read (None: that object could not be read or does not exist)."""
    return ClusterEvidence(
        mcm_image=mcm_image(deployment) if deployment is not None else None,
        machine_crd_has_expiry=keeps(machine_crd, EXPIRY_PATH) if machine_crd is not None else None,
        machine_set_crd_has_auto_max=keeps(machine_set_crd, AUTO_MAX_PATH) if machine_set_crd is not None else None,
    )
