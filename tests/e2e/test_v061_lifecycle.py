"""The preservation lifecycle end to end against real MCM v0.61.3 (no native preservation): our controller runs
the whole lifecycle, our webhook keeps MCM from replacing what we keep, and MCM does everything else as on a seed.

Every test drives node health itself (MCM fails a NotReady node's machine after its 3 s health timeout) and
waits for states, never for time; what happened is read from the Machine recorder, the Events and the API
server's audit log.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.localcluster.mcm_pool import machine_phase
from tests.e2e.harness import RealMcm, fail_machine
from tests.e2e.product import Product, Write
from tests.polling import eventually_async

# v0.61.3: a failed machine is replaced only once it is gone, its termination takes ~30 s.
REPLACE_LIMIT = 150.0
FAIL_LIMIT = 60.0
SRE = "sre@example.com"
CONTROLLER_SOURCE = "machine-preservation-controller"


@pytest.fixture(autouse=True)
def only_v061(real_mcm: RealMcm) -> None:
    # The default version; these scenarios are what the product does where MCM does not preserve.
    assert real_mcm.version == "v0.61.3"


# --- helpers ----------------------------------------------------------------------------------------------


async def set_node_preserve(product: Product, real_mcm: RealMcm, node: str, value: str) -> None:
    """What an SRE does: annotate the Node (through our webhook's validation). Returns once the controller has
    taken the value over (its last-applied annotation on the Machine, or the Failed machine deleted), so that
    what happens next is the reaction to this value."""
    api = await new_api_client(kubeconfig=product.kubeconfig_for(SRE, groups=("system:masters",)))
    try:
        await client.CoreV1Api(api).patch_node(
            node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}}, _content_type=MERGE_PATCH
        )
    finally:
        await api.close()

    async def taken_over() -> bool:
        machine = await real_mcm.machine(node)
        if machine is None or machine["metadata"].get("deletionTimestamp"):
            return True  # a preservation it ended by deleting the Failed machine
        return annotations(machine).get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION) == value

    await eventually_async(taken_over, limit=30, interval=0.2)


async def preserve_write(product: Product, node: str, value: str) -> Write:
    """The SRE's last write of `value` to the node's preserve annotation that took effect, from the audit log."""
    writes = [
        w
        for w in await product.writes_by(SRE)
        if w.kind == "Node"
        and w.name == node
        and w.code < 300
        and (w.body or {}).get("metadata", {}).get("annotations", {}).get(v.PRESERVE_ANNOTATION) == value
    ]
    assert writes, f"no write of {v.PRESERVE_ANNOTATION}={value} on {node} in the audit log"
    return writes[-1]


async def bind_pod(real_mcm: RealMcm, node: str, name: str = "workload") -> str:
    """A pod already running on the node (bound by nodeName: no scheduler here)."""
    await client.CoreV1Api(real_mcm.api).create_namespaced_pod(
        real_mcm.namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
        },
    )
    return name


async def pod_exists(real_mcm: RealMcm, name: str) -> bool:
    try:
        await client.CoreV1Api(real_mcm.api).read_namespaced_pod(name, real_mcm.namespace)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def record_of(machine: dict[str, Any] | None) -> dict[str, str]:
    """The preservation record on a Machine (empty if there is none)."""
    found = annotations(machine)
    return {key: found[key] for key in v.PRESERVATION_RECORD_ANNOTATIONS if key in found}


def started_as(record: dict[str, str]) -> dict[str, str]:
    """What a preservation's start wrote: since, until and by (the drain's outcome comes later)."""
    keys = (v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION)
    return {key: record[key] for key in keys if key in record}


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def preserved_condition(node: dict[str, Any] | None) -> dict[str, Any] | None:
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == v.PRESERVED_CONDITION_TYPE), None)


def has_preserved_taint(node: dict[str, Any] | None) -> bool:
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    return any(t.get("key") == v.PRESERVED_TAINT_KEY and t.get("effect") == v.PRESERVED_TAINT_EFFECT for t in taints)


def owner_set(machine: dict[str, Any]) -> str:
    owners = machine["metadata"].get("ownerReferences") or []
    return next(o["name"] for o in owners if o["kind"] == "MachineSet")


async def reasons(product: Product, name: str, reason: str) -> list[tuple[int, str]]:
    """(count, source) of each of our Events with this reason about the Machine."""
    return [(e.count, e.source) for e in await product.events("Machine", name) if e.reason == reason]


async def wait_preserved_and_failed(real_mcm: RealMcm, name: str) -> dict[str, str]:
    """Fail the machine's node, then wait until the machine is Failed and preserved."""
    started = time.monotonic()
    await fail_machine(real_mcm, name, limit=FAIL_LIMIT)
    print(f"{name}: Failed {time.monotonic() - started:.1f} s after its node went NotReady")

    async def preserved_failed() -> dict[str, str] | None:
        machine = await real_mcm.machine(name)
        record = record_of(machine)
        return record if machine_phase(machine or {}) == "Failed" and v.PRESERVED_UNTIL_ANNOTATION in record else None

    record: dict[str, str] = await eventually_async(preserved_failed, limit=30, interval=0.2)
    return record


async def wait_replaced(real_mcm: RealMcm, pool: str, gone: str, replicas: int) -> list[dict[str, Any]]:
    """Until `gone` no longer exists and the pool has `replicas` Running machines again."""

    async def replaced() -> list[dict[str, Any]] | None:
        machines = await real_mcm.machines(pool)
        names = [m["metadata"]["name"] for m in machines]
        running = [m for m in machines if machine_phase(m) == "Running"]
        return machines if gone not in names and len(running) == replicas == len(machines) else None

    started = time.monotonic()
    try:
        machines = await eventually_async(replaced, limit=REPLACE_LIMIT, interval=0.5)
        print(f"{gone}: replaced after {time.monotonic() - started:.1f} s")
        return machines
    except AssertionError as error:
        raise AssertionError(f"{error}\nhistory of {gone}: {real_mcm.recorder.history(gone)}") from None


def mcm_deletes(writes: list[Write], name: str) -> list[Write]:
    return [w for w in writes if w.kind == "Machine" and w.name == name and w.operation == "delete"]


async def successful_deletes(product: Product, name: str) -> list[Write]:
    """The deletes of the Machine that went through, by the controller or by MCM."""
    writes = [*await product.controller_writes(), *await product.writes_by(product.mcm_user)]
    return [w for w in mcm_deletes(writes, name) if w.code < 300]


def record_writes(writes: list[Write], name: str) -> list[Write]:
    """The controller's writes that set (not remove) the machine's expiry annotation: one per preservation."""
    key = v.PRESERVED_UNTIL_ANNOTATION
    return [
        w
        for w in writes
        if w.kind == "Machine"
        and w.name == name
        and f"metadata.annotations[{key}]" in w.fields
        and (w.body or {}).get("metadata", {}).get("annotations", {}).get(key) is not None
        and w.code < 300
    ]


async def setup_pool(real_mcm: RealMcm, product: Product, *, replicas: int = 2, **start: Any) -> list[str]:
    await real_mcm.create_pool("pool", replicas=replicas)
    machines = await real_mcm.wait_for_pool("pool", replicas)
    await product.start(**start)
    return [m["metadata"]["name"] for m in machines]


# --- scenarios ----------------------------------------------------------------------------------------------


async def test_when_failed_node_is_preserved_drained_and_not_replaced(real_mcm: RealMcm, product: Product) -> None:
    victim, survivor = await setup_pool(real_mcm, product, preserve_timeout="10m")
    await set_node_preserve(product, real_mcm, victim, "when-failed")
    pod = await bind_pod(real_mcm, victim)
    machine = await real_mcm.machine(victim)
    assert machine is not None
    machine_set = owner_set(machine)
    # Nothing happens while the machine is healthy.
    assert record_of(machine) == {}

    failed_at = dt.datetime.now(dt.UTC)
    record = await wait_preserved_and_failed(real_mcm, victim)

    assert record[v.PRESERVED_BY_ANNOTATION] == v.PreservedBy.USER
    since, until = parse_time(record[v.PRESERVED_SINCE_ANNOTATION]), parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])
    assert since >= failed_at.replace(microsecond=0)
    assert until - since == dt.timedelta(minutes=10)

    # The node: kept out of scale-down, tainted (never cordoned), drained through the Eviction API.
    async def drained() -> dict[str, Any] | None:
        node = await real_mcm.node(victim)
        condition = preserved_condition(node)
        done = condition is not None and condition["status"] == "True"
        return node if done and condition["message"].startswith(v.DRAINED_SUCCESSFULLY_MESSAGE) else None

    node = await eventually_async(drained, limit=60, interval=0.25)
    assert annotations(node)[v.CA_SCALE_DOWN_DISABLED_ANNOTATION] == "true"
    assert has_preserved_taint(node)
    assert not node["spec"].get("unschedulable")
    condition = preserved_condition(node)
    assert condition is not None
    assert condition["reason"] == v.ConditionReason.PRESERVED_BY_USER
    assert not await pod_exists(real_mcm, pod)
    writes = await product.controller_writes()
    evictions = [w for w in writes if w.kind == "Pod" and w.subresource == "eviction"]
    assert [(w.name, w.code) for w in evictions][:1] == [(pod, 201)]
    assert [w for w in writes if w.kind == "Pod" and w.operation == "delete"] == []
    assert await reasons(product, victim, "PreservationStarted") == [(1, CONTROLLER_SOURCE)]

    async def drained_event() -> bool:  # recorded after the condition
        return [e.reason for e in await product.events("Node", victim)].count("PreservedNodeDrained") == 1

    await eventually_async(drained_event, limit=10)

    # MCM tries to replace the Failed machine; our webhook denies its delete (more than once: MCM retries on
    # its next MachineSet sync), MCM reports it, and no replacement appears.
    async def denied_twice() -> list[Write] | None:
        denied = [w for w in mcm_deletes(await product.writes_by(product.mcm_user), victim) if w.code >= 400]
        return denied if len(denied) >= 2 else None

    denied = await eventually_async(denied_twice, limit=90, interval=0.5)
    assert {w.code for w in denied} == {403}, denied

    async def failed_delete_event() -> bool:
        return any(e.reason == "FailedDelete" for e in await product.events("MachineSet", machine_set))

    await eventually_async(failed_delete_event, limit=30)
    assert "denied the request" in real_mcm.logs()

    machines = {m["metadata"]["name"]: m for m in await real_mcm.machines("pool")}
    assert set(machines) == {victim, survivor}
    assert not machines[victim]["metadata"].get("deletionTimestamp")
    assert machine_phase(machines[victim]) == "Failed"
    final = record_of(machines[victim])
    assert final[v.PRESERVED_DRAIN_ANNOTATION] == v.DrainOutcome.DRAINED
    assert started_as(final) == started_as(record)  # the same preservation, never restarted
    assert {e.name for e in real_mcm.recorder.events} == {victim, survivor}, "MCM never created a replacement"
    assert "deleted" not in real_mcm.recorder.history(victim)
    product.check_running()


async def test_expiry_deletes_the_machine_and_mcm_replaces_it(real_mcm: RealMcm, product: Product) -> None:
    victim, survivor = await setup_pool(real_mcm, product, preserve_timeout="20s")
    await set_node_preserve(product, real_mcm, victim, "when-failed")

    record = await wait_preserved_and_failed(real_mcm, victim)
    until = parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])
    assert until - parse_time(record[v.PRESERVED_SINCE_ANNOTATION]) == dt.timedelta(seconds=20)

    machines = await wait_replaced(real_mcm, "pool", victim, 2)
    replacement = ({m["metadata"]["name"] for m in machines} - {survivor}).pop()
    assert replacement != victim
    assert real_mcm.recorder.history(victim)[-1] == "deleted"
    assert "Running" in real_mcm.recorder.history(replacement)

    # It ended at the expiry, not before: the controller deletes the machine it kept, and MCM's next retry
    # is let through as well (whichever comes first; the other finds the machine already deleting).
    # A delete is judged between its receipt and its answer (MCM's can arrive just before the expiry and be let
    # through just after it), so one answered before the expiry was let through too early.
    deleted = await successful_deletes(product, victim)
    assert deleted, "somebody deleted the machine"
    assert min(w.completed for w in deleted) >= until, deleted
    assert await reasons(product, victim, "PreservationStarted") == [(1, CONTROLLER_SOURCE)]
    assert await reasons(product, victim, "PreservationExpired") == [(1, CONTROLLER_SOURCE)]
    assert await reasons(product, victim, "PreservationStopped") == []
    assert await reasons(product, replacement, "PreservationStarted") == []
    product.check_running()


async def test_false_releases_a_preserved_failed_machine_early(real_mcm: RealMcm, product: Product) -> None:
    victim, survivor = await setup_pool(real_mcm, product, preserve_timeout="10m")
    await set_node_preserve(product, real_mcm, victim, "when-failed")
    record = await wait_preserved_and_failed(real_mcm, victim)
    until = parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])

    await set_node_preserve(product, real_mcm, victim, "false")
    release = await preserve_write(product, victim, "false")

    machines = await wait_replaced(real_mcm, "pool", victim, 2)
    assert dt.datetime.now(dt.UTC) < until, "released long before the expiry"
    assert survivor in {m["metadata"]["name"] for m in machines}
    assert real_mcm.recorder.history(victim)[-1] == "deleted"
    deleted = [w for w in (await product.controller_writes()) if w.operation == "delete" and w.name == victim]
    mcm_deleted = [w for w in mcm_deletes(await product.writes_by(product.mcm_user), victim) if w.code < 300]
    # Whoever got there first (the controller ending the preservation, or MCM whose delete now passes), the
    # machine went after the release and only then. One clock, the API server's: the release took effect between
    # its receipt and its answer, and a delete is judged between its own receipt and answer, so a delete that
    # went through was answered after the release was received (a delete received before it, and judged after
    # it on a busy machine, is right to pass).
    assert any(w.code < 300 and w.completed >= release.at for w in [*deleted, *mcm_deleted]), (deleted, mcm_deleted)
    assert all(w.completed >= release.at for w in mcm_deleted), (release, mcm_deleted)
    assert await reasons(product, victim, "PreservationStarted") == [(1, CONTROLLER_SOURCE)]
    assert await reasons(product, victim, "PreservationStopped") == [(1, CONTROLLER_SOURCE)]
    assert await reasons(product, victim, "PreservationExpired") == []
    product.check_running()


async def test_now_preserves_a_healthy_node_without_draining_it(real_mcm: RealMcm, product: Product) -> None:
    victim, _ = await setup_pool(real_mcm, product, preserve_timeout="10m")
    pod = await bind_pod(real_mcm, victim)

    await set_node_preserve(product, real_mcm, victim, "now")

    async def preserved_running() -> dict[str, Any] | None:
        node = await real_mcm.node(victim)
        condition = preserved_condition(node)
        return node if condition is not None and condition["status"] == "True" else None

    node = await eventually_async(preserved_running, limit=30, interval=0.25)
    machine = await real_mcm.machine(victim)
    record = record_of(machine)
    until = parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])
    assert until - parse_time(record[v.PRESERVED_SINCE_ANNOTATION]) == dt.timedelta(minutes=10)
    assert record[v.PRESERVED_BY_ANNOTATION] == v.PreservedBy.USER
    assert v.PRESERVED_DRAIN_ANNOTATION not in record
    assert machine_phase(machine or {}) == "Running"
    condition = preserved_condition(node)
    assert condition is not None
    assert condition["message"].startswith(v.PRESERVED_UNTIL_MESSAGE_PREFIX)
    assert condition["reason"] == v.ConditionReason.PRESERVED_BY_USER
    assert annotations(node)[v.CA_SCALE_DOWN_DISABLED_ANNOTATION] == "true"
    assert not has_preserved_taint(node)
    assert not node["spec"].get("unschedulable")

    # Not drained: the pod stays, nothing was evicted, the machine never left Running.
    assert await pod_exists(real_mcm, pod)
    writes = await product.controller_writes()
    assert [w for w in writes if w.kind == "Pod"] == []
    assert [w for w in writes if w.kind == "Node" and "spec.taints" in w.fields] == []
    history = real_mcm.recorder.history(victim)
    assert history[history.index("Running") :] == ["Running"]
    assert await reasons(product, victim, "PreservationStarted") == [(1, CONTROLLER_SOURCE)]
    product.check_running()


async def test_killed_controller_continues_the_same_preservation(real_mcm: RealMcm, product: Product) -> None:
    victim, _ = await setup_pool(real_mcm, product, preserve_timeout="20s")
    await set_node_preserve(product, real_mcm, victim, "when-failed")
    record = await wait_preserved_and_failed(real_mcm, victim)
    until = parse_time(record[v.PRESERVED_UNTIL_ANNOTATION])

    # Killed once the start is complete, Events included (a kill between the record's write and its Events is
    # tested write by write in tests/integration/test_controller_crash.py: the restart announces it once).
    async def announced() -> bool:
        return await reasons(product, victim, "PreservationStarted") == [(1, CONTROLLER_SOURCE)]

    await eventually_async(announced, limit=30)
    await product.kill_controller()
    killed_at = dt.datetime.now(dt.UTC)
    assert killed_at < until, "killed while the preservation runs"
    await product.start_controller()
    # Ready means the caches synced and the first reconcile pass is under way: by now it has seen the
    # machine, and at the latest it acts on it at the expiry.
    machine = await real_mcm.machine(victim)
    assert started_as(record_of(machine)) == started_as(record)

    await wait_replaced(real_mcm, "pool", victim, 2)

    writes = await product.controller_writes()
    assert len(record_writes(writes, victim)) == 1, "one record, written once, before the kill"
    assert record_writes(writes, victim)[0].at < killed_at
    deleted = await successful_deletes(product, victim)
    assert deleted, "somebody deleted the machine"
    assert min(w.completed for w in deleted) >= until, "ended at the expiry the first controller wrote"
    assert await reasons(product, victim, "PreservationStarted") == [(1, CONTROLLER_SOURCE)]
    assert await reasons(product, victim, "PreservationExpired") == [(1, CONTROLLER_SOURCE)]
    denied = [w for w in mcm_deletes(await product.writes_by(product.mcm_user), victim) if w.code >= 400]
    assert denied, "MCM tried to replace it and was denied"
    assert all(w.at < until for w in denied)
    product.check_running()
