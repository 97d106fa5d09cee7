"""caBundle composition and the JSON patches that put it into webhook configurations. Pure.

A webhook configuration is handled as the plain dict the API serves (camelCase keys), so the same
functions work on rendered chart manifests and on live objects.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from machine_preservation.certs.pairs import CertificateProblem, fingerprint, load_certificates


def compose_bundle(cas: Sequence[x509.Certificate]) -> bytes:
    """PEM bundle of `cas` in order, each certificate once."""
    seen: set[str] = set()
    pem = b""
    for ca in cas:
        if fingerprint(ca) not in seen:
            seen.add(fingerprint(ca))
            pem += ca.public_bytes(serialization.Encoding.PEM)
    return pem


def encode(bundle_pem: bytes) -> str:
    """The caBundle field's wire form."""
    return base64.b64encode(bundle_pem).decode()


def decode(ca_bundle: str | None) -> list[x509.Certificate]:
    """The certificates of a caBundle field; empty when absent or unreadable."""
    if not ca_bundle:
        return []
    try:
        return load_certificates(base64.b64decode(ca_bundle, validate=True))
    except (binascii.Error, CertificateProblem):
        return []


def _webhooks(configuration: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(configuration.get("webhooks") or [])


def trusts(configuration: Mapping[str, Any], ca: x509.Certificate) -> bool:
    """Whether every webhook of the configuration has `ca` in its caBundle (and there is a webhook)."""
    webhooks = _webhooks(configuration)
    wanted = fingerprint(ca)
    return bool(webhooks) and all(
        wanted in {fingerprint(c) for c in decode((w.get("clientConfig") or {}).get("caBundle"))} for w in webhooks
    )


def ca_bundle_patch(configuration: Mapping[str, Any], *, bundle_pem: bytes) -> list[dict[str, Any]]:
    """A JSON patch giving every webhook exactly `bundle_pem` as caBundle; `[]` if nothing differs.

    The first operation re-states the resourceVersion read: the API server then rejects the patch
    with 409 if the object changed meanwhile, so indexes and the decision stay consistent.
    """
    wanted = encode(bundle_pem)
    operations: list[dict[str, Any]] = []
    for index, webhook in enumerate(_webhooks(configuration)):
        client_config = webhook.get("clientConfig") or {}
        if client_config.get("caBundle") == wanted:
            continue
        # `add` replaces an existing member and creates a missing one (RFC 6902 §4.1).
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
        operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": wanted})
    if not operations:
        return []
    resource_version = configuration["metadata"]["resourceVersion"]
    return [{"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version}, *operations]
