"""caBundle patches for webhook configurations, and parsing of configuration references. Pure.
(The API server applying these patches, and rejecting stale ones, is tested in
tests/integration/test_certs_manager.py.)"""

from __future__ import annotations

import base64
import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from machine_preservation.certs import bundle
from machine_preservation.certs.authority import generate_ca
from machine_preservation.certs.manager import WebhookConfigurationRef, WebhookKind

NOW = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
CA_A = generate_ca(common_name="a", now=NOW, valid_for=dt.timedelta(days=1))
CA_B = generate_ca(common_name="b", now=NOW, valid_for=dt.timedelta(days=1))
BUNDLE = bundle.compose_bundle([CA_A.certificate, CA_B.certificate])


def configuration(*ca_bundles: str | None) -> dict[str, Any]:
    webhooks = []
    for index, ca_bundle in enumerate(ca_bundles):
        client_config: dict[str, Any] = {"url": f"https://x/{index}"}
        if ca_bundle is not None:
            client_config["caBundle"] = ca_bundle
        webhooks.append({"name": f"w{index}.example.com", "clientConfig": client_config})
    return {"metadata": {"name": "c", "resourceVersion": "42"}, "webhooks": webhooks}


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The subset of RFC 6902 the patches use: test, add, replace on object members and list indexes."""
    result = copy.deepcopy(document)
    for operation in patch:
        *parents, last = operation["path"].lstrip("/").split("/")
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if operation["op"] == "test":
            assert target[last] == operation["value"]
        else:
            target[last] = operation["value"]
    return result


def test_patch_sets_every_missing_or_different_bundle_and_restates_the_resource_version() -> None:
    current = configuration(None, bundle.encode(CA_A.cert_pem), bundle.encode(BUNDLE))
    patch = bundle.ca_bundle_patch(current, bundle_pem=BUNDLE)
    assert patch[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": "42"}
    assert [op["path"] for op in patch[1:]] == [
        "/webhooks/0/name",
        "/webhooks/0/clientConfig/caBundle",
        "/webhooks/1/name",
        "/webhooks/1/clientConfig/caBundle",
    ]
    patched = apply_patch(current, patch)
    assert [w["clientConfig"]["caBundle"] for w in patched["webhooks"]] == [bundle.encode(BUNDLE)] * 3
    assert patched["webhooks"][0]["clientConfig"]["url"] == "https://x/0"
    assert bundle.ca_bundle_patch(patched, bundle_pem=BUNDLE) == []


def test_trusts_requires_the_ca_in_every_webhook() -> None:
    both = bundle.encode(BUNDLE)
    assert bundle.trusts(configuration(both, both), CA_B.certificate)
    assert not bundle.trusts(configuration(both, bundle.encode(CA_A.cert_pem)), CA_B.certificate)
    assert not bundle.trusts(configuration(both, None), CA_A.certificate)
    assert not bundle.trusts(configuration(), CA_A.certificate), "a configuration without webhooks trusts nothing"
    assert not bundle.trusts(configuration("not base64!"), CA_A.certificate)


def test_decode_tolerates_garbage() -> None:
    assert bundle.decode(None) == []
    assert bundle.decode(base64.b64encode(b"no pem here").decode()) == []
    assert [c.subject.rfc4514_string() for c in bundle.decode(bundle.encode(BUNDLE))] == ["CN=a", "CN=b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("validating/mp", WebhookConfigurationRef(kind=WebhookKind.VALIDATING, name="mp")),
        (
            "mutating/mp@/etc/k/kubeconfig",
            WebhookConfigurationRef(kind=WebhookKind.MUTATING, name="mp", kubeconfig=Path("/etc/k/kubeconfig")),
        ),
    ],
)
def test_configuration_references_parse(text: str, expected: WebhookConfigurationRef) -> None:
    assert WebhookConfigurationRef.parse(text) == expected


@pytest.mark.parametrize("text", ["mp", "validating/", "webhook/mp", "Validating/mp"])
def test_bad_configuration_references_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="expected validating/NAME or mutating/NAME"):
        WebhookConfigurationRef.parse(text)
