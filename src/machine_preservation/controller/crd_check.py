"""Startup inspection of MCM's CRDs in the control cluster: what they keep, and whether they serve at all.

The apiserver drops (prunes) fields a structural schema does not declare, unless an enclosing object says
`x-kubernetes-preserve-unknown-fields: true` or has an `additionalProperties` schema. MCM v0.61's CRDs do not
declare the preservation status fields (`status.currentStatus.preserveExpiryTime` on Machines, the counters on
MachineSets and MachineDeployments); v0.62's do. The controller works with both: its state lives in Machine
annotations, and it mirrors the status fields only where the CRDs keep them. It refuses to start only when
the Machine CRD is missing, does not serve v1alpha1, or has no status subresource (recovery writes the phase
through it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v

logger = logging.getLogger(__name__)

MACHINE_CRD = f"machines.{v.MACHINE_API_GROUP}"
MACHINE_SET_CRD = f"machinesets.{v.MACHINE_API_GROUP}"
EXPIRY_PATH = ("status", "currentStatus", "preserveExpiryTime")
AUTO_MAX_PATH = ("spec", "autoPreserveFailedMachineMax")


class CrdCheckFailed(RuntimeError):
    """The Machine CRD cannot be worked with; the message names the fix."""


@dataclass(frozen=True)
class CrdFacts:
    """What MCM's CRDs keep (None: that CRD could not be read)."""

    machine_keeps_expiry: bool
    machine_set_keeps_auto_max: bool | None


def pruned_at(schema: Mapping[str, Any], path: Sequence[str]) -> str | None:
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


def _served_schema(crd: Mapping[str, Any], *, version: str) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """The served version's entry and its schema, or None when `version` is not served."""
    versions = {entry.get("name"): entry for entry in (crd.get("spec") or {}).get("versions") or []}
    entry = versions.get(version)
    if entry is None or not entry.get("served", False):
        return None
    return entry, (entry.get("schema") or {}).get("openAPIV3Schema") or {}


def keeps(crd: Mapping[str, Any], path: Sequence[str], *, version: str = v.MACHINE_API_VERSION) -> bool:
    """Whether the CRD's served `version` keeps the field at `path`."""
    served = _served_schema(crd, version=version)
    return served is not None and pruned_at(served[1], path) is None


def check_machine_crd(crd: Mapping[str, Any], *, version: str = v.MACHINE_API_VERSION) -> bool:
    """Raise CrdCheckFailed unless `version` is served with a status subresource; return whether the CRD keeps
    `status.currentStatus.preserveExpiryTime`."""
    name = (crd.get("metadata") or {}).get("name") or MACHINE_CRD
    served = _served_schema(crd, version=version)
    if served is None:
        raise CrdCheckFailed(f"The Machine CRD {name} does not serve version {version}; install MCM's CRDs.")
    entry, schema = served
    if "status" not in (entry.get("subresources") or {}):
        raise CrdCheckFailed(
            f"The Machine CRD {name} ({version}) has no status subresource; the controller writes a recovered "
            "machine's phase through it. Fix: install MCM's own CRD, which has it."
        )
    return pruned_at(schema, EXPIRY_PATH) is None


async def _read_crd(api: client.ApiextensionsV1Api, name: str) -> tuple[int, bytes]:
    response = await api.read_custom_resource_definition_without_preload_content(name)
    return response.status, await response.read()


async def inspect_crds(api_client: client.ApiClient) -> CrdFacts:
    """Read MCM's Machine and MachineSet CRDs from the control cluster and say what they keep."""
    api = client.ApiextensionsV1Api(api_client)
    status, body = await _read_crd(api, MACHINE_CRD)
    if status == 404:
        raise CrdCheckFailed(f"The Machine CRD {MACHINE_CRD} is not installed in the control cluster.")
    if status != 200:
        raise CrdCheckFailed(
            f"Cannot read the Machine CRD {MACHINE_CRD}: HTTP {status} {body[:300].decode(errors='replace')}"
        )
    keeps_expiry = check_machine_crd(json.loads(body))
    status, body = await _read_crd(api, MACHINE_SET_CRD)
    keeps_auto_max = keeps(json.loads(body), AUTO_MAX_PATH) if status == 200 else None
    logger.info(
        "MCM's CRDs %s the preservation status fields (Machine keeps %s: %s; MachineSet keeps %s: %s)",
        "keep" if keeps_expiry else "prune",
        ".".join(EXPIRY_PATH),
        keeps_expiry,
        ".".join(AUTO_MAX_PATH),
        keeps_auto_max,
    )
    return CrdFacts(machine_keeps_expiry=keeps_expiry, machine_set_keeps_auto_max=keeps_auto_max)
