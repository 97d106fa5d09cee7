"""Startup check: would the Machine CRD's schema prune `status.currentStatus.preserveExpiryTime`?

The apiserver drops (prunes) fields a structural schema does not declare, unless an enclosing object
says `x-kubernetes-preserve-unknown-fields: true` or has an `additionalProperties` schema. MCM versions
without preservation do not declare the field; the controller's writes would then vanish silently and
every machine would be "preserved" again on each reconcile. Better to refuse to start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v

logger = logging.getLogger(__name__)

MACHINE_CRD = f"machines.{v.MACHINE_API_GROUP}"
FIELD_PATH = ("status", "currentStatus", "preserveExpiryTime")
FIX = (
    "Fix: install a Machine CRD that declares it - under spec.versions[name=v1alpha1].schema.openAPIV3Schema add "
    "properties.status.properties.currentStatus.properties.preserveExpiryTime: "
    "{type: string, format: date-time, nullable: true} (the CRD of a machine-controller-manager release with "
    "machine preservation has it), or mark status.currentStatus with x-kubernetes-preserve-unknown-fields: true."
)


class CrdCheckFailed(RuntimeError):
    """The Machine CRD cannot hold what the controller writes; the message names the fix."""


def pruned_at(schema: Mapping[str, Any], path: Sequence[str] = FIELD_PATH) -> str | None:
    """Where along `path` the schema prunes (e.g. "status.currentStatus"), or None when the field is kept."""
    node: Mapping[str, Any] = schema
    walked: list[str] = []
    for key in path:
        properties = node.get("properties") or {}
        if key in properties:
            node = properties[key]
        elif isinstance(node.get("additionalProperties"), Mapping):
            node = node["additionalProperties"]
        elif node.get("x-kubernetes-preserve-unknown-fields") is True or node.get("additionalProperties") is True:
            return None  # everything below is kept as it is
        else:
            return ".".join(walked) or "<root>"
        walked.append(key)
    return None


def check_machine_crd(crd: Mapping[str, Any], *, version: str = v.MACHINE_API_VERSION) -> None:
    """Raise CrdCheckFailed unless `version` of the CRD is served and keeps preserveExpiryTime in status."""
    name = (crd.get("metadata") or {}).get("name") or MACHINE_CRD
    spec = crd.get("spec") or {}
    versions = {entry.get("name"): entry for entry in spec.get("versions") or []}
    entry = versions.get(version)
    field = ".".join(FIELD_PATH)
    if entry is None or not entry.get("served", False):
        raise CrdCheckFailed(f"The Machine CRD {name} does not serve version {version}. {FIX}")
    if "status" not in (entry.get("subresources") or {}):
        raise CrdCheckFailed(
            f"The Machine CRD {name} ({version}) has no status subresource; the controller writes {field} "
            "through it. Fix: enable subresources.status on that version (MCM's CRD has it)."
        )
    schema = (entry.get("schema") or {}).get("openAPIV3Schema") or {}
    where = pruned_at(schema)
    if where is not None:
        raise CrdCheckFailed(
            f"The Machine CRD {name} ({version}) would prune {field}: the schema at {where} neither "
            f"declares the next field nor preserves unknown fields. {FIX}"
        )


async def verify_machine_crd(api_client: client.ApiClient, *, name: str = MACHINE_CRD) -> None:
    """Read the Machine CRD from the control cluster and check it."""
    api = client.ApiextensionsV1Api(api_client)
    response = await api.read_custom_resource_definition_without_preload_content(name)
    body = await response.read()
    if response.status == 404:
        raise CrdCheckFailed(f"The Machine CRD {name} is not installed in the control cluster. {FIX}")
    if response.status != 200:
        raise CrdCheckFailed(
            f"Cannot read the Machine CRD {name}: HTTP {response.status} {body[:300].decode(errors='replace')}"
        )
    check_machine_crd(json.loads(body))
    logger.info("Machine CRD keeps %s", ".".join(FIELD_PATH))
