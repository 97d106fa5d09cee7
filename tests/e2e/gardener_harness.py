"""What the Gardener extension's end-to-end tests add to the local Gardener landscape
(`machine_preservation.localcluster.gardener_landscape`: the installation, shoots, the reads): a node failing as
the node lifecycle controller reports it, an MCM upgrade as the shoot's reconcile rolls it, MCM v0.62's expiry and
our record on a Machine, and the seed's audit log of writes to MCM's objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import parse_go_duration_nanoseconds
from machine_preservation.core.mcm_evidence import MCM_DEPLOYMENT
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import (
    Shoot,
    annotations_of,
    machine,
    mcm_image,
    ready,
    served,
)
from machine_preservation.localcluster.mcm_pool import POOL_LABEL, create_pool, wait_for_pool
from tests.polling import eventually_async


async def enable_with_pool(api: client.ApiClient, shoot: Shoot, pool: str, *, replicas: int = 2) -> list[str]:
    """Enable the extension for the shoot, wait until it is served there, and create a pool of `replicas` running
    machines; their names, sorted."""
    ns = shoot.namespace
    await gardener.apply_extension(api, ns)
    await ready(api, ns, limit=30)
    await eventually_async(lambda: served(api, ns), limit=30)
    labels = {POOL_LABEL: pool}
    await create_pool(api, ns, pool, replicas=replicas, machine_deployment_labels=labels, node_labels=labels)
    return sorted(m["metadata"]["name"] for m in await wait_for_pool(api, ns, pool, replicas, target=shoot.api))


async def fail_node(api: client.ApiClient, shoot: Shoot, name: str, *, limit: float = 60.0) -> None:
    """The machine's node dies: its Ready turns False and, once MCM has had the machine Unknown for longer than its
    health timeout, Unknown (as the node lifecycle controller marks a kubelet that stopped posting). MCM checks the
    machine again at once on that change; MCM v0.62 would otherwise look again only a minute later. Returns once
    the machine is Failed."""
    await shoot.kubelets.set_ready(name, False)
    timeout = parse_go_duration_nanoseconds(shoot.mcm.settings.machine_health_timeout) / 1e9

    async def phase() -> str | None:
        found = await machine(api, shoot.namespace, name)
        return str(((found or {}).get("status") or {}).get("currentStatus", {}).get("phase") or "") or None

    if await eventually_async(lambda: _phase_in(phase, ("Unknown", "Failed")), limit=limit, interval=0.2) == "Unknown":
        await asyncio.sleep(timeout + 0.5)
        await shoot.kubelets.set_ready(name, "Unknown")
    await eventually_async(lambda: _phase_in(phase, ("Failed",)), limit=limit, interval=0.2)


async def _phase_in(phase: Callable[[], Awaitable[str | None]], wanted: tuple[str, ...]) -> str | None:
    found = await phase()
    return found if found in wanted else None


async def upgrade_mcm(api: client.ApiClient, shoot: Shoot, version: str) -> None:
    """The shoot's MCM rolled to `version` as the shoot's reconcile does it: the Deployment's image changes, the
    old MCM stops and the new one starts."""
    await client.AppsV1Api(api).patch_namespaced_deployment(
        MCM_DEPLOYMENT,
        shoot.namespace,
        {"spec": {"template": {"spec": {"containers": [{"name": MCM_DEPLOYMENT, "image": mcm_image(version)}]}}}},
    )
    await asyncio.to_thread(shoot.mcm.stop)
    shoot.mcm.version, shoot.mcm.bin_dir = version, None
    await asyncio.to_thread(shoot.mcm.start)


def preserve_expiry(found: dict[str, Any] | None) -> dt.datetime | None:
    """`status.currentStatus.preserveExpiryTime` (MCM v0.62's expiry, our mirror of ours), if set."""
    text = (((found or {}).get("status") or {}).get("currentStatus") or {}).get("preserveExpiryTime")
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def record_of(found: dict[str, Any] | None) -> dict[str, str]:
    """Our preservation record's annotations on a Machine."""
    return {k: value for k, value in annotations_of(found).items() if k in v.PRESERVATION_RECORD_ANNOTATIONS}


@dataclasses.dataclass(frozen=True)
class AuditedWrite:
    verb: str
    resource: str  # machines, machines/status, ...
    name: str
    code: int
    body: Any = dataclasses.field(compare=False, repr=False)


def machine_writes(plane: ControlPlane, *, user: str, namespace: str) -> list[AuditedWrite]:
    """Every write of `user` to MCM's objects in `namespace` of `plane`, from its audit log, oldest first (the
    e2e seed audits every write to the machine.sapcloud.io kinds, tests/e2e/product.py AUDIT_POLICY)."""
    found: list[AuditedWrite] = []
    with plane.audit_log.open("rb") as log:
        for line in log:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if (
                    event.get("stage") == "ResponseComplete"
                    and (event.get("user") or {}).get("username") == user
                    and ref.get("apiGroup") == v.MACHINE_API_GROUP
                    and ref.get("namespace") == namespace
                    and event.get("verb") in ("create", "update", "patch", "delete")
                ):
                    resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                    found.append(
                        AuditedWrite(
                            verb=event["verb"],
                            resource=resource,
                            name=ref.get("name", ""),
                            code=int((event.get("responseStatus") or {}).get("code", 0)),
                            body=event.get("requestObject"),
                        )
                    )
    return found
