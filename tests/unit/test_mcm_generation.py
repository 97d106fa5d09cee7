"""Does the cluster's MCM preserve machines itself (core.mcm_generation): its image tag, else its CRDs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.mcm_generation import (
    FIRST_NATIVE_VERSION,
    ClusterEvidence,
    NativeDecision,
    NativePreservationMode,
    decide_native_preservation,
    image_version,
)

AUTO, TRUE, FALSE = NativePreservationMode.AUTO, NativePreservationMode.TRUE, NativePreservationMode.FALSE
V62 = "europe-docker.pkg.dev/gardener-project/releases/gardener/machine-controller-manager:v0.62.1"
V61 = "europe-docker.pkg.dev/gardener-project/releases/gardener/machine-controller-manager:v0.61.3"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("repo/mcm:v0.62.1", (0, 62, 1)),
        ("repo/mcm:v0.61.3", (0, 61, 3)),
        ("mcm:v0.62.0", (0, 62, 0)),
        ("repo/mcm:0.62.0", (0, 62, 0)),  # without the v
        ("repo/mcm:v1.0.0", (1, 0, 0)),
        ("repo/mcm:v0.62.1-dev-1a2b3c", (0, 62, 1)),  # a pre-release suffix keeps its version
        (V62, (0, 62, 1)),
        # a digest beside the tag: the tag still names the version
        (f"repo/mcm:v0.62.1@{DIGEST}", (0, 62, 1)),
        (f"host:5000/mcm:v0.61.3@{DIGEST}", (0, 61, 3)),
        # a registry with a port: the port is not the tag
        ("host:5000/mcm:v0.61.3", (0, 61, 3)),
        ("host:5000/mcm", None),
        ("host:5000/team/mcm:latest", None),
        # nothing that names a version
        (f"repo/mcm@{DIGEST}", None),
        ("repo/mcm:latest", None),
        ("repo/mcm", None),
        ("repo/mcm:", None),
        ("repo/mcm:v0.62", None),  # no patch number
        ("repo/mcm:release-v0.62.1", None),
        ("", None),
    ],
)
def test_image_version(image: str, version: tuple[int, int, int] | None) -> None:
    assert image_version(image) == version


def crds(native: bool, image: str | None = None) -> ClusterEvidence:
    """Both CRDs as one MCM generation ships them."""
    return ClusterEvidence(mcm_image=image, machine_crd_has_expiry=native, machine_set_crd_has_auto_max=native)


@pytest.mark.parametrize(
    ("mode", "evidence", "native", "because"),
    [
        # explicit modes: the evidence is not even looked at
        (TRUE, ClusterEvidence(), True, "set to true"),
        (TRUE, crds(False, V61), True, "set to true"),
        (FALSE, crds(True, V62), False, "set to false"),
        # the image decides
        (AUTO, ClusterEvidence(mcm_image=V62), True, f"MCM's image {V62} is v0.62.1"),
        (AUTO, ClusterEvidence(mcm_image=V61), False, f"MCM's image {V61} is v0.61.3"),
        (AUTO, ClusterEvidence(mcm_image="r/mcm:v0.62.0"), True, "MCM's image r/mcm:v0.62.0 is v0.62.0"),
        # ... and wins over the CRDs (v0.62 CRDs installed under v0.61 binaries, and the reverse)
        (AUTO, crds(True, V61), False, f"MCM's image {V61} is v0.61.3"),
        (AUTO, crds(False, V62), True, f"MCM's image {V62} is v0.62.1"),
        # an image without a version: the CRDs decide
        (AUTO, crds(True, "r/mcm:latest"), True, "CRDs carry the preservation fields"),
        (AUTO, crds(True), True, "CRDs carry the preservation fields (v0.62 or later)"),
        (AUTO, crds(False), False, "CRDs lack the preservation fields (v0.61 or older)"),
        # both CRDs must carry their field; one lacking it is an older MCM
        (
            AUTO,
            ClusterEvidence(machine_crd_has_expiry=True, machine_set_crd_has_auto_max=False),
            False,
            "CRDs lack the preservation fields",
        ),
        (AUTO, ClusterEvidence(machine_crd_has_expiry=None, machine_set_crd_has_auto_max=False), False, "CRDs lack"),
        # nothing readable: not native (the product's own lifecycle runs)
        (AUTO, ClusterEvidence(), False, "neither MCM's version nor its CRDs could be read"),
        (AUTO, ClusterEvidence(mcm_image=f"r/mcm@{DIGEST}"), False, "neither MCM's version nor its CRDs could be read"),
        (
            AUTO,
            ClusterEvidence(machine_crd_has_expiry=True, machine_set_crd_has_auto_max=None),
            False,
            "neither MCM's version nor its CRDs could be read",
        ),
    ],
)
def test_decision_table(mode: NativePreservationMode, evidence: ClusterEvidence, native: bool, because: str) -> None:
    decision = decide_native_preservation(mode=mode, evidence=evidence)
    assert decision.native is native
    assert because in decision.because


def test_the_modes_are_spelled_as_the_flag_takes_them() -> None:
    assert [mode.value for mode in NativePreservationMode] == ["auto", "true", "false"]
    assert decide_native_preservation(mode=NativePreservationMode("true"), evidence=ClusterEvidence()) == (
        NativeDecision(native=True, because="set to true")
    )


VERSIONS = st.tuples(st.integers(0, 3), st.integers(0, 120), st.integers(0, 20))
CRD_FACTS = st.sampled_from([None, True, False])


@given(VERSIONS, CRD_FACTS, CRD_FACTS, st.sampled_from(["repo/mcm", "host:5000/a/b/mcm"]), st.booleans())
def test_a_readable_image_version_alone_decides(
    version: tuple[int, int, int], expiry: bool | None, auto_max: bool | None, repository: str, digest: bool
) -> None:
    image = f"{repository}:v{'.'.join(map(str, version))}" + (f"@{DIGEST}" if digest else "")
    evidence = ClusterEvidence(mcm_image=image, machine_crd_has_expiry=expiry, machine_set_crd_has_auto_max=auto_max)
    assert image_version(image) == version
    assert decide_native_preservation(mode=AUTO, evidence=evidence).native is (version >= FIRST_NATIVE_VERSION)
