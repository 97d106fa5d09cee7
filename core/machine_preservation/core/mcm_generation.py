"""Does the cluster's MCM preserve machines itself (v0.62 and later)?

With native preservation MCM runs the lifecycle; we must not fight it, so the controller only observes and
the webhook's deletion guard is off. `auto` decides from what the cluster shows, strongest evidence first:
1. the version in the image tag of MCM's Deployment (`machine-controller-manager` in the control namespace,
   as Gardener runs it): v0.62.0 or later is native;
2. else MCM's CRDs: both the Machine CRD's `status.currentStatus.preserveExpiryTime` and the MachineSet CRD's
   `spec.autoPreserveFailedMachineMax` exist only from v0.62 on.
The CRDs are the weaker signal: someone may have installed v0.62 CRDs under v0.61 binaries; then set the mode
explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

FIRST_NATIVE_VERSION = (0, 62, 0)
_VERSION_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class NativePreservationMode(StrEnum):
    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"


@dataclass(frozen=True)
class ClusterEvidence:
    """What the control cluster shows about its MCM; None where it could not be read."""

    mcm_image: str | None = None
    machine_crd_has_expiry: bool | None = None
    machine_set_crd_has_auto_max: bool | None = None


@dataclass(frozen=True)
class NativeDecision:
    native: bool
    because: str  # for the start-up log


def image_version(image: str) -> tuple[int, int, int] | None:
    """The semantic version in an image reference's tag (`repo/mcm:v0.62.1`, `…:v0.62.1@sha256:…`)."""
    reference = image.split("@", 1)[0]
    name_and_tag = reference.rsplit("/", 1)[-1]
    if ":" not in name_and_tag:
        return None
    match = _VERSION_TAG.match(name_and_tag.split(":", 1)[1])
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def decide_native_preservation(*, mode: NativePreservationMode, evidence: ClusterEvidence) -> NativeDecision:
    if mode != NativePreservationMode.AUTO:
        return NativeDecision(native=mode == NativePreservationMode.TRUE, because=f"set to {mode.value}")
    version = image_version(evidence.mcm_image) if evidence.mcm_image else None
    if version is not None:
        native = version >= FIRST_NATIVE_VERSION
        shown = ".".join(str(part) for part in version)
        return NativeDecision(native=native, because=f"MCM's image {evidence.mcm_image} is v{shown}")
    crd_facts = (evidence.machine_crd_has_expiry, evidence.machine_set_crd_has_auto_max)
    if all(fact is True for fact in crd_facts):
        return NativeDecision(native=True, because="MCM's CRDs carry the preservation fields (v0.62 or later)")
    if any(fact is False for fact in crd_facts):
        return NativeDecision(native=False, because="MCM's CRDs lack the preservation fields (v0.61 or older)")
    return NativeDecision(native=False, because="neither MCM's version nor its CRDs could be read")
