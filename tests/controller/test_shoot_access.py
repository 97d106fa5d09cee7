"""Where the extension finds a shoot's API server: the generic token kubeconfig Gardener keeps per shoot."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from machine_preservation.controller.gardener.shoot_access import ShootAccessUnavailable, endpoint_from_kubeconfig
from machine_preservation.core.gardener.cluster import (
    FORCE_DELETION_ANNOTATION,
    GENERIC_KUBECONFIG_ANNOTATION,
    read_cluster,
)

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
NAMESPACE = "shoot--core--a"


def kubeconfig(server: str, *, ca: bytes | None = CA, context: str = "ctx") -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    return {
        "current-context": context,
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    }


@pytest.mark.parametrize(
    "server",
    [
        "https://kube-apiserver",  # without Istio TLS termination: the Service as the shoot namespace sees it
        # gardenlet's IstioTLSTermination (on by default since v1.144): an address only the shoot namespace resolves
        "https://api.a.core.internal.example.com",
        "https://127.0.0.1:6443",
        "",
    ],
)
def test_the_shoot_is_reached_at_its_service_whatever_the_kubeconfig_names(server: str) -> None:
    endpoint = endpoint_from_kubeconfig(kubeconfig(server), namespace=NAMESPACE)
    assert endpoint.server == f"https://kube-apiserver.{NAMESPACE}.svc:443"
    assert endpoint.ca_pem == CA.decode()


def test_a_single_cluster_is_used_without_a_current_context() -> None:
    other = base64.b64encode(b"other").decode()
    document = kubeconfig("https://127.0.0.1:1", context="")
    document["clusters"][0]["cluster"]["certificate-authority-data"] = other
    assert endpoint_from_kubeconfig(document, namespace=NAMESPACE).ca_pem == "other"


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({}, "names no cluster"),
        (kubeconfig("https://kube-apiserver", ca=None), "no certificate-authority-data"),
    ],
)
def test_an_unusable_kubeconfig_says_what_is_missing(document: dict[str, Any], problem: str) -> None:
    with pytest.raises(ShootAccessUnavailable, match=problem):
        endpoint_from_kubeconfig(document, namespace=NAMESPACE)


def cluster(*, annotations: dict[str, str] | None = None, **shoot: Any) -> dict[str, Any]:
    return {"metadata": {"name": NAMESPACE, "annotations": annotations or {}}, "spec": {"shoot": shoot}}


@pytest.mark.parametrize(
    ("raw", "hibernated", "deleted", "failed"),
    [
        (cluster(), False, False, False),
        (cluster(spec={"hibernation": {"enabled": True}}), True, False, False),
        (cluster(metadata={"deletionTimestamp": "2026-11-26T00:00:00Z"}), False, True, False),
        (cluster(status={"lastOperation": {"type": "Reconcile", "state": "Failed"}}), False, False, True),
        (cluster(status={"lastOperation": {"type": "Reconcile", "state": "Error"}}), False, False, False),
    ],
)
def test_what_the_extension_reads_from_a_cluster(
    raw: dict[str, Any], hibernated: bool, deleted: bool, failed: bool
) -> None:
    facts = read_cluster(raw)
    assert facts.name == NAMESPACE
    assert (facts.lifecycle.hibernated, facts.lifecycle.deleted, facts.failed) == (hibernated, deleted, failed)


def test_the_kubeconfig_secret_is_named_on_the_cluster() -> None:
    facts = read_cluster(cluster(annotations={GENERIC_KUBECONFIG_ANNOTATION: "generic-token-kubeconfig-1a2b"}))
    assert facts.kubeconfig_secret == "generic-token-kubeconfig-1a2b"
    assert read_cluster(cluster()).kubeconfig_secret == ""


def test_one_read_of_a_cluster_carries_what_the_extension_contract_needs() -> None:
    """The seed watches Clusters once: the same view gives the contract its force deletion, the Kubernetes version
    and the Shoot's pools and extensions (cut to those), and the shoot's runtime its parsed Shoot."""
    raw = cluster(
        metadata={"name": "s", "annotations": {FORCE_DELETION_ANNOTATION: "T"}, "managedFields": [{"big": "x"}]},
        spec={
            "kubernetes": {"version": "1.33.2", "kubeAPIServer": {"big": "x"}},
            "provider": {"type": "aws", "workers": [{"name": "w", "minimum": 1}]},
            "extensions": [{"type": "machine-preservation"}],
        },
    )
    view = read_cluster(raw)
    assert (view.force_deletion, view.kubernetes_version) == (True, "1.33.2")
    assert view.shoot is not None
    assert view.shoot.worker("w") is not None
    assert view.shoot_document == {
        "metadata": {"name": "s", "annotations": {FORCE_DELETION_ANNOTATION: "T"}},
        "spec": {
            "extensions": [{"type": "machine-preservation"}],
            "kubernetes": {"version": "1.33.2"},
            "provider": {"workers": [{"name": "w", "minimum": 1}]},
        },
    }
    assert read_cluster(cluster(metadata={"annotations": {FORCE_DELETION_ANNOTATION: "yes"}})).force_deletion is False
