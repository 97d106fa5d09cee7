"""The evidence of a failure (issue #31 ask 3) end to end against real MCM v0.61.3: the pods as they were before
the drain evicted them (the audit log shows the eviction, the evidence the pod not yet being deleted), kept in the
target cluster; pointed at from the Node; and, once the machine recovered and its preservation ended, deleted by
the controller after the grace period while the Node stays."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import evidence as e
from machine_preservation.core import vocabulary as v
from machine_preservation.localcluster.mcm_pool import machine_phase
from tests.e2e.harness import RealMcm
from tests.e2e.product import Product
from tests.e2e.test_v061_lifecycle import (
    annotations,
    bind_pod,
    set_node_preserve,
    setup_pool,
    wait_preserved_and_failed,
)
from tests.polling import eventually_async

GRACE = "5s"


@pytest.fixture(autouse=True)
def only_v061(real_mcm: RealMcm) -> None:
    assert real_mcm.version == "v0.61.3"


async def evidence_of(real_mcm: RealMcm, node: str) -> dict[str, Any] | None:
    try:
        found = await client.CoreV1Api(real_mcm.api).read_namespaced_config_map(
            e.evidence_name(node), v.EVIDENCE_NAMESPACE
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return {"metadata": found.metadata.to_dict(), "data": found.data or {}}


def requests_of(audit_log: Path, user: str) -> list[dict[str, Any]]:
    """Every request of `user` the API server completed, in the log's order."""
    found = []
    with audit_log.open("rb") as log:
        for line in log:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("stage") == "ResponseComplete" and (event.get("user") or {}).get("username") == user:
                    found.append(event)
    return found


def at(event: dict[str, Any], key: str) -> dt.datetime:
    return dt.datetime.fromisoformat(event[key].replace("Z", "+00:00"))


def matching(events: list[dict[str, Any]], verb: str, resource: str, subresource: str = "") -> list[dict[str, Any]]:
    return [
        event
        for event in events
        if event.get("verb") == verb
        and (event.get("objectRef") or {}).get("resource") == resource
        and (event.get("objectRef") or {}).get("subresource", "") == subresource
        and int((event.get("responseStatus") or {}).get("code", 0)) < 300
    ]


async def test_the_evidence_precedes_the_first_eviction_and_goes_after_the_grace(
    real_mcm: RealMcm, product: Product
) -> None:
    victim, _survivor = await setup_pool(real_mcm, product, preserve_timeout="10m", evidence_grace=GRACE)
    await set_node_preserve(product, real_mcm, victim, "when-failed")
    pod = await bind_pod(real_mcm, victim)
    await wait_preserved_and_failed(real_mcm, victim)

    stored = await eventually_async(lambda: evidence_of(real_mcm, victim), limit=30, interval=0.25)
    evidence = e.Evidence.model_validate_json(stored["data"][v.EVIDENCE_DATA_KEY])
    assert evidence.node == victim
    assert evidence.machine.name == victim
    assert evidence.machine.phase == "Failed"
    assert evidence.machine.last_operation.state == "Failed"  # MCM's, as it failed the machine
    (captured,) = [p for p in evidence.pods if p.name == pod]
    assert "Ready" in [c.type for c in evidence.conditions]
    owners = stored["metadata"]["owner_references"]
    assert [(o["kind"], o["name"]) for o in owners] == [("Node", victim)]

    async def pointed() -> bool:
        node = await real_mcm.node(victim)
        return annotations(node).get(v.PRESERVED_EVIDENCE_ANNOTATION) == e.evidence_reference(victim)

    await eventually_async(pointed, limit=30, interval=0.25)

    # The audit log says the drain evicted the pod; the evidence shows it as it was before: not being deleted. The
    # pods come from the drain's own watch, taken before its first eviction.
    async def evicted() -> list[dict[str, Any]] | None:
        requests = await asyncio.to_thread(requests_of, real_mcm.plane.audit_log, product.controller_user)
        return [r for r in matching(requests, "create", "pods", "eviction") if r["objectRef"]["name"] == pod] or None

    await eventually_async(evicted, limit=60, interval=0.5)
    assert captured.deleted_at is None, "captured before the drain evicted it"
    requests = await asyncio.to_thread(requests_of, real_mcm.plane.audit_log, product.controller_user)
    assert [
        event
        for event in matching(requests, "create", "configmaps")
        if (event.get("objectRef") or {}).get("namespace") == v.EVIDENCE_NAMESPACE
    ], "the evidence was written by the controller"

    # The node recovers: the controller moves the machine back to Running, the preservation ends, and the
    # evidence is given its expiry, then deleted by the controller (the Node stays: not the garbage collector).
    await real_mcm.set_node_ready(victim, True)

    async def recovered() -> bool:
        machine = await real_mcm.machine(victim)
        return machine is not None and machine_phase(machine) == "Running"

    await eventually_async(recovered, limit=60, interval=0.5)

    async def expiring() -> str | None:
        found = await evidence_of(real_mcm, victim)
        return ((found or {}).get("metadata", {}).get("annotations") or {}).get(v.EVIDENCE_EXPIRES_KEY)

    expires = await eventually_async(expiring, limit=60, interval=0.25)

    async def gone() -> bool:
        return await evidence_of(real_mcm, victim) is None

    await eventually_async(gone, limit=60, interval=0.5)
    assert await real_mcm.node(victim) is not None, "the Node stays: the controller removed its evidence"
    requests = await asyncio.to_thread(requests_of, real_mcm.plane.audit_log, product.controller_user)
    (deleted,) = matching(requests, "delete", "configmaps")
    assert deleted["objectRef"]["name"] == e.evidence_name(victim)
    assert at(deleted, "requestReceivedTimestamp") >= dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))
