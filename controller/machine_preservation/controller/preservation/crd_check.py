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

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import CLUSTER_API_GROUP, CLUSTER_PLURAL
from machine_preservation.core.mcm_evidence import AUTO_MAX_PATH, EXPIRY_PATH, MACHINE_CRD, MACHINE_SET_CRD, keeps
from machine_preservation.kube.api_errors import Failed, NotFound
from machine_preservation.kube.crds import SharedRead, read_crd

logger = logging.getLogger(__name__)

CLUSTER_CRD = f"{CLUSTER_PLURAL}.{CLUSTER_API_GROUP}"


class CrdCheckFailed(RuntimeError):
    """The Machine CRD cannot be worked with; the message names the fix."""


@dataclass(frozen=True)
class CrdFacts:
    """What MCM's CRDs keep (None: that CRD could not be read)."""

    machine_keeps_expiry: bool
    machine_set_keeps_auto_max: bool | None


def check_machine_crd(crd: Mapping[str, Any], *, version: str = v.MACHINE_API_VERSION) -> bool:
    """Raise CrdCheckFailed unless `version` is served with a status subresource; return whether the CRD keeps
    `status.currentStatus.preserveExpiryTime`."""
    name = (crd.get("metadata") or {}).get("name") or MACHINE_CRD
    versions = {entry.get("name"): entry for entry in (crd.get("spec") or {}).get("versions") or []}
    entry = versions.get(version)
    if entry is None or not entry.get("served", False):
        raise CrdCheckFailed(f"The Machine CRD {name} does not serve version {version}; install MCM's CRDs.")
    if "status" not in (entry.get("subresources") or {}):
        raise CrdCheckFailed(
            f"The Machine CRD {name} ({version}) has no status subresource; the controller writes a recovered "
            "machine's phase through it. Fix: install MCM's own CRD, which has it."
        )
    return keeps(crd, EXPIRY_PATH, version=version)


async def inspect_crds(api_client: client.ApiClient) -> CrdFacts:
    """Read MCM's Machine and MachineSet CRDs from the control cluster and say what they keep."""
    try:
        machine = await read_crd(api_client, MACHINE_CRD)
    except NotFound as error:
        raise CrdCheckFailed(f"The Machine CRD {MACHINE_CRD} is not installed in the control cluster.") from error
    except Failed as error:
        raise CrdCheckFailed(
            f"Cannot read the Machine CRD {MACHINE_CRD}: HTTP {error.status} {(error.body or '')[:300]}"
        ) from error
    keeps_expiry = check_machine_crd(machine)
    try:
        keeps_auto_max: bool | None = keeps(await read_crd(api_client, MACHINE_SET_CRD), AUTO_MAX_PATH)
    except Failed:
        keeps_auto_max = None
    logger.info(
        "MCM's CRDs %s the preservation status fields (Machine keeps %s: %s; MachineSet keeps %s: %s)",
        "keep" if keeps_expiry else "prune",
        ".".join(EXPIRY_PATH),
        keeps_expiry,
        ".".join(AUTO_MAX_PATH),
        keeps_auto_max,
    )
    return CrdFacts(machine_keeps_expiry=keeps_expiry, machine_set_keeps_auto_max=keeps_auto_max)


async def has_crd(api_client: client.ApiClient, name: str) -> bool:
    """Whether the CRD is installed; said in the log either way, since what depends on it is then left out."""
    try:
        await read_crd(api_client, name)
    except NotFound:
        logger.info("CRD %s is not installed", name)
        return False
    except Failed as error:
        logger.warning(
            "cannot read CRD %s (HTTP %d %s): treated as not installed", name, error.status, (error.body or "")[:200]
        )
        return False
    logger.info("CRD %s is installed", name)
    return True


@dataclass(frozen=True)
class ControlFacts:
    """What the control cluster's CRDs say; the same for every namespace in it."""

    crds: CrdFacts
    has_cluster: bool  # Gardener's Cluster CRD is installed (a seed)


async def inspect_control(api_client: client.ApiClient) -> ControlFacts:
    return ControlFacts(crds=await inspect_crds(api_client), has_cluster=await has_crd(api_client, CLUSTER_CRD))


class ControlFactsCache(SharedRead[ControlFacts]):
    """`inspect_control`, read at most once per `max_age` for all the shoots of a seed: the CRDs are the seed's,
    so 200 shoots starting together, or inspecting MCM every minute, read them once."""

    def __init__(
        self, api_client: client.ApiClient, *, max_age: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(lambda: inspect_control(api_client), max_age=max_age, clock=clock)
