"""A preserved machine outlives its Node object, against real MCM v0.61.3 (and what v0.62.1 does instead).

MCM deletes the Machine of every Node that is deleted (`triggerMachineDeletion`), whoever deleted the Node: a
person, or a cloud-controller-manager for a stopped VM. Its finalizer keeps the Node, marked for deletion, until
the Machine is gone. Our webhook denies that delete for a machine we keep, in any phase; the controller notices
the Node is gone (the record's `preserved-node-gone-since`, one `PreservedNodeGone` Event), stops writing to it,
and at the expiry completes the delete MCM asked for, after which MCM replaces the machine. Replica counts hold
throughout: no replacement appears while the machine is kept.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster.mcm_pool import machine_phase
from tests.e2e.harness import RealMcm
from tests.e2e.product import Product, Write
from tests.e2e.test_v061_lifecycle import (
    CONTROLLER_SOURCE,
    SRE,
    mcm_deletes,
    parse_time,
    preserved_condition,
    reasons,
    record_of,
    set_node_preserve,
    setup_pool,
    started_as,
    successful_deletes,
    wait_preserved_and_failed,
    wait_replaced,
)
from tests.polling import eventually_async

# Long enough that the machine is still kept two minutes after its Node was deleted.
PRESERVE_TIMEOUT = "170s"
KEPT_AFTER_THE_NODE_WENT = 120.0
# The hold ends this long before the expiry, when the machine may go.
EXPIRY_MARGIN = dt.timedelta(seconds=5)
GONE = v.EventReason.PRESERVED_NODE_GONE.value


async def delete_node_as_a_person(product: Product, name: str) -> Write:
    """The SRE deletes the Node; the delete as the API server's audit log has it (its receipt is when the Node went,
    on the API server's clock, which stamps MCM's deletes too)."""
    api = await new_api_client(kubeconfig=product.kubeconfig_for(SRE, groups=("system:masters",)))
    try:
        await client.CoreV1Api(api).delete_node(name)
    finally:
        await api.close()

    async def audited() -> Write | None:
        found = [
            w
            for w in await product.writes_by(SRE)
            if w.kind == "Node" and w.name == name and w.operation == "delete" and w.code < 300
        ]
        return found[-1] if found else None

    return await eventually_async(audited, limit=30, interval=0.2)


async def node_writes(product: Product, name: str) -> list[Write]:
    return [w for w in await product.controller_writes() if w.kind == "Node" and w.name == name]


async def kept_after_its_node_went(
    real_mcm: RealMcm, product: Product, *, victim: str, survivor: str, record: dict[str, str]
) -> None:
    """Delete the victim's Node; check it is kept as the issue asks until two minutes later (or until shortly before
    its expiry, if that comes first: on a busy machine the set-up before the delete takes longer)."""
    deleted = await delete_node_as_a_person(product, victim)
    started = time.monotonic()

    # MCM asks to delete the machine (its Node is gone) and is denied, with how to release it.
    async def denied() -> list[Write] | None:
        found = [w for w in mcm_deletes(await product.writes_by(product.mcm_user), victim) if w.at >= deleted.at]
        return found if found and all(w.code == 403 for w in found) else None

    await eventually_async(denied, limit=30, interval=0.5)
    assert "preserved until" in product.log("webhook")

    # The controller notices: the record says since when, one Warning Event says so.
    async def noticed() -> dict[str, str] | None:
        found = record_of(await real_mcm.machine(victim))
        return found if v.PRESERVED_NODE_GONE_SINCE_ANNOTATION in found else None

    gone_record = await eventually_async(noticed, limit=30, interval=0.5)
    # The controller noticed after the Node went (the record keeps whole seconds).
    assert parse_time(gone_record[v.PRESERVED_NODE_GONE_SINCE_ANNOTATION]) >= deleted.at.replace(microsecond=0)
    assert started_as(gone_record) == started_as(record), "the same preservation, its expiry unchanged"

    async def announced() -> bool:
        return await reasons(product, victim, GONE) == [(1, CONTROLLER_SOURCE)]

    await eventually_async(announced, limit=20)
    writes_when_noticed = len(await node_writes(product, victim))

    # Two minutes later: the machine is there with its record, nothing replaced it, MCM kept being denied, the
    # controller announced it once and wrote nothing to the Node. Only what was seen before the expiry is judged (a
    # look answered after it may see the machine go, as it should).
    until = parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])
    while time.monotonic() - started < KEPT_AFTER_THE_NODE_WENT:
        machines = {m["metadata"]["name"]: m for m in await real_mcm.machines("pool")}
        recorded = {e.name for e in real_mcm.recorder.events}
        history = real_mcm.recorder.history(victim)
        announcements = await reasons(product, victim, GONE)
        writes = len(await node_writes(product, victim))
        if dt.datetime.now(dt.UTC) >= until - EXPIRY_MARGIN:
            break
        assert set(machines) == {victim, survivor}, "replica counts: the kept machine is not replaced"
        assert not machines[victim]["metadata"].get("deletionTimestamp")
        assert started_as(record_of(machines[victim])) == started_as(record)
        assert recorded == {victim, survivor}, "MCM never created a replacement"
        assert "deleted" not in history
        assert announcements == [(1, CONTROLLER_SOURCE)], "announced once"
        assert writes == writes_when_noticed, "no writes to a Node that is gone"
        await asyncio.sleep(2.0)
    print(f"{victim} seen kept {time.monotonic() - started:.0f} s after its Node went")
    node = await real_mcm.node(victim)
    assert node is None or node["metadata"].get("deletionTimestamp"), "gone, or held by MCM's finalizer"


async def gone_at_the_expiry(real_mcm: RealMcm, product: Product, *, victim: str, record: dict[str, str]) -> None:
    until = parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])
    machines = await wait_replaced(real_mcm, "pool", victim, 2)
    assert len(machines) == 2
    deleted = await successful_deletes(product, victim)
    assert deleted, "somebody deleted the machine"
    assert min(w.completed for w in deleted) >= until, "not before its expiry (judged by when it was answered)"
    assert real_mcm.recorder.history(victim)[-1] == "deleted"
    assert await reasons(product, victim, GONE) == [(1, CONTROLLER_SOURCE)]
    assert await reasons(product, victim, "PreservationExpired") == [(1, CONTROLLER_SOURCE)]
    product.check_running()


@pytest.fixture(autouse=True)
def only_v061(real_mcm: RealMcm) -> None:
    assert real_mcm.version == "v0.61.3"


async def test_a_now_preserved_healthy_machine_outlives_its_deleted_node(real_mcm: RealMcm, product: Product) -> None:
    victim, survivor = await setup_pool(real_mcm, product, preserve_timeout=PRESERVE_TIMEOUT)
    await set_node_preserve(product, real_mcm, victim, "now")

    async def preserved() -> dict[str, str] | None:
        condition = preserved_condition(await real_mcm.node(victim))
        found = record_of(await real_mcm.machine(victim))
        return found if condition is not None and condition["status"] == "True" and found else None

    record = await eventually_async(preserved, limit=30, interval=0.25)
    assert machine_phase(await real_mcm.machine(victim) or {}) == "Running"

    await kept_after_its_node_went(real_mcm, product, victim=victim, survivor=survivor, record=record)
    await gone_at_the_expiry(real_mcm, product, victim=victim, record=record)


async def test_a_when_failed_preserved_failed_machine_outlives_its_deleted_node(
    real_mcm: RealMcm, product: Product
) -> None:
    victim, survivor = await setup_pool(real_mcm, product, preserve_timeout=PRESERVE_TIMEOUT)
    await set_node_preserve(product, real_mcm, victim, "when-failed")
    record = await wait_preserved_and_failed(real_mcm, victim)

    async def drained() -> bool:
        found = record_of(await real_mcm.machine(victim))
        return found.get(v.PRESERVED_DRAIN_ANNOTATION) == v.DrainOutcome.DRAINED

    await eventually_async(drained, limit=60, interval=0.25)

    await kept_after_its_node_went(real_mcm, product, victim=victim, survivor=survivor, record=record)
    assert machine_phase(await real_mcm.machine(victim) or {}) == "Failed"
    await gone_at_the_expiry(real_mcm, product, victim=victim, record=record)
