"""Webhook configurations the certs manager keeps entirely: what the live object should be and how to get there.
Pure.

Such a configuration is described by a manifest without caBundle (the seed chart renders it into a ConfigMap the
certs manager mounts). The chart creates the object once (gardener-resource-manager's `ignore`: created, never
updated, deleted with the installation), so the certs manager needs no right to create webhook configurations.
Every pass turns the manifest into the desired object (every webhook gets the current trust bundle) and compares it
with the live object: when it differs in anything the desired object states, one conditional JSON patch sets the
webhooks wholesale and the metadata the manifest states. Fields the API server defaults (and the manifest leaves
out) never count as a difference.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from machine_preservation.certs.bundle import encode

API_VERSION = "admissionregistration.k8s.io/v1"
KINDS = {"validating": "ValidatingWebhookConfiguration", "mutating": "MutatingWebhookConfiguration"}


class TemplateProblem(ValueError):
    """The manifest cannot describe the configuration it is meant for."""


def load_template(text: str, *, kind: str, name: str) -> dict[str, Any]:
    """The manifest in `text`, checked to describe the `kind` ("validating"/"mutating") configuration `name`."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TemplateProblem(f"not YAML: {error}") from error
    if not isinstance(document, dict):
        raise TemplateProblem("not a manifest (expected a mapping)")
    problems = []
    if document.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion {document.get('apiVersion')!r}, expected {API_VERSION!r}")
    if document.get("kind") != KINDS[kind]:
        problems.append(f"kind {document.get('kind')!r}, expected {KINDS[kind]!r}")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("name") != name:
        found = metadata.get("name") if isinstance(metadata, dict) else None
        problems.append(f"metadata.name {found!r}, expected {name!r}")
    webhooks = document.get("webhooks")
    if not isinstance(webhooks, list) or not webhooks:
        problems.append("no webhooks")
    elif not all(isinstance(w, dict) and w.get("name") and isinstance(w.get("clientConfig"), dict) for w in webhooks):
        problems.append("every webhook needs a name and a clientConfig")
    if problems:
        raise TemplateProblem("; ".join(problems))
    return document


def desired(template: Mapping[str, Any], *, bundle_pem: bytes) -> dict[str, Any]:
    """The object to have live: the manifest, every webhook trusting `bundle_pem`."""
    result = copy.deepcopy(dict(template))
    result["metadata"] = {k: v for k, v in result["metadata"].items() if k in ("name", "labels", "annotations")}
    for webhook in result["webhooks"]:
        webhook["clientConfig"]["caBundle"] = encode(bundle_pem)
    return result


def covers(actual: Any, wanted: Any) -> bool:
    """Whether `actual` has everything `wanted` states: mappings by key (extra keys in `actual` are defaults),
    lists element by element with the same length, anything else equal."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and covers(actual[key], value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(covers(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


@dataclass(frozen=True)
class Plan:
    """What one pass does to the configuration: apply `patch`, or nothing."""

    patch: tuple[dict[str, Any], ...] = ()
    reasons: tuple[str, ...] = ()


def plan(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> Plan:
    """How to turn `live` into `wanted` (from `desired`).

    The patch re-states the resourceVersion read, so the API server rejects it with 409 when the object changed
    meanwhile. It replaces the webhooks as a whole (a webhook the manifest no longer has goes away) and adds or
    changes the labels and annotations the manifest states (others' stay).
    """
    reasons = []
    live_metadata = live.get("metadata") or {}
    wanted_metadata = wanted["metadata"]
    operations: list[dict[str, Any]] = []
    for key in ("labels", "annotations"):
        if key in wanted_metadata and not covers(live_metadata.get(key) or {}, wanted_metadata[key]):
            merged = {**(live_metadata.get(key) or {}), **wanted_metadata[key]}
            operations.append({"op": "add", "path": f"/metadata/{key}", "value": merged})
            reasons.append(key)
    if not covers(live.get("webhooks") or [], wanted["webhooks"]):
        operations.append({"op": "add", "path": "/webhooks", "value": copy.deepcopy(wanted["webhooks"])})
        reasons.append("webhooks")
    if not operations:
        return Plan()
    resource_version = live_metadata["resourceVersion"]
    precondition = {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version}
    return Plan(patch=(precondition, *operations), reasons=tuple(reasons))
