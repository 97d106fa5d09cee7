"""Replica counts and availability with real MCM v0.61.3 (no native preservation): our controller and webhook
run the whole lifecycle, and MCM's replica counts always win.

- The auto-preservation budget comes from the Shoot in Gardener's `Cluster` (v0.61.3's CRDs prune the field
  from MachineDeployments and MachineSets), spread over the pool's zones (one MachineDeployment each): a
  failure within a zone's share is kept, one beyond it is replaced as usual, and lowering the max releases
  exactly the excess. MCM v0.61.3 marks one machine of a MachineDeployment Failed at a time and counts a kept
  Failed machine against that: the next failure in its MachineDeployment waits, Unknown, neither preserved
  nor replaced, so two kept failures in one MachineSet (and "oldest released first") cannot occur here.
- A scale-down takes unpreserved machines first; a scale to zero (hibernation) and the deletion of the
  MachineDeployment take every machine, preserved ones included, also with the webhook and the controller down
  once Gardener marked the machines for forced deletion.
- A rollout completes, and a machine of the MachineSet it replaces that fails meanwhile is not auto-preserved.
- With the webhook down MCM still deletes healthy machines; only the delete of a Failed machine is refused
  (the guard fails closed), and once the webhook is back everything converges on MCM's next MachineSet sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    WORKER_POOL_LABEL,
    ZONE_LABEL,
)
from machine_preservation.core.models import Machine
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import (
    GROUP,
    MERGE_PATCH,
    VERSION,
    machine_node,
    machine_phase,
    node_ready_status,
)
from tests.e2e.harness import RealMcm, annotate_machine
from tests.e2e.product import Product
from tests.polling import eventually_async

pytestmark = pytest.mark.parametrize("mcm_version", [DEFAULT_MCM_VERSION], indirect=True)

MCM_LOG = "machine-controller-manager"  # the MachineSet controller's process
GRANTED = v.EventReason.AUTO_PRESERVATION_GRANTED.value
RELEASED = v.EventReason.AUTO_PRESERVATION_RELEASED.value
STARTED = v.EventReason.PRESERVATION_STARTED.value
# Long enough that no preservation runs out while a test looks at it.
LONG = "10m"
ZONES = ["zone-a", "zone-b"]

ClusterWriter = Callable[..., Awaitable[None]]


# --- Gardener's Cluster ------------------------------------------------------------------------------------


def shoot(namespace: str, pool: str, *, zones: list[str], maximum: int, timeout: str) -> dict[str, Any]:
    """A Shoot with one worker pool carrying the preservation settings."""
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": {"name": namespace.removeprefix("e2e-"), "namespace": "garden-e2e"},
        "spec": {
            "provider": {
                "type": "fake",
                "workers": [
                    {
                        "name": pool,
                        "zones": zones,
                        "machineControllerManager": {
                            "autoPreserveFailedMachineMax": maximum,
                            "machinePreserveTimeout": timeout,
                        },
                    }
                ],
            }
        },
    }


@pytest.fixture
async def gardener_cluster(real_mcm: RealMcm) -> AsyncIterator[ClusterWriter]:
    """Writes the namespace's `Cluster` (created on first use, replaced after); deleted when the test ends
    (it is cluster-scoped: the namespace's deletion does not take it)."""
    custom = client.CustomObjectsApi(real_mcm.api)
    name = real_mcm.namespace
    created = False

    async def write(pool: str, *, maximum: int, preserve_timeout: str, zones: list[str] | None = None) -> None:
        nonlocal created
        worker = shoot(name, pool, zones=zones or ["zone-a"], maximum=maximum, timeout=preserve_timeout)
        spec = {"cloudProfile": {}, "seed": {}, "shoot": worker}
        if not created:
            body = {
                "apiVersion": f"{CLUSTER_API_GROUP}/{CLUSTER_API_VERSION}",
                "kind": "Cluster",
                "metadata": {"name": name},
                "spec": spec,
            }
            await custom.create_cluster_custom_object(CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, body)
            created = True
        else:
            await custom.patch_cluster_custom_object(
                CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, name, {"spec": spec}, _content_type=MERGE_PATCH
            )

    yield write
    if created:
        with contextlib.suppress(ApiException):
            await custom.delete_cluster_custom_object(CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, name)


# --- reading and writing the pool's objects ----------------------------------------------------------------


def term(record: PreservationRecord | None) -> tuple[dt.datetime, dt.datetime, v.PreservedBy] | None:
    """What a preservation is (its drain record comes and goes)."""
    return None if record is None else (record.since, record.until, record.by)


def names(machines: list[dict[str, Any]]) -> list[str]:
    return [m["metadata"]["name"] for m in machines]


async def record_of(real_mcm: RealMcm, name: str) -> PreservationRecord | None:
    raw = await real_mcm.machine(name)
    return None if raw is None else Machine.model_validate(raw).preservation


async def annotations_of(real_mcm: RealMcm, name: str) -> dict[str, str]:
    raw = await real_mcm.machine(name)
    assert raw is not None, f"machine {name} is gone"
    found: dict[str, str] = raw["metadata"].get("annotations") or {}
    return found


async def annotate_node(real_mcm: RealMcm, name: str, annotations: dict[str, str | None]) -> None:
    await client.CoreV1Api(real_mcm.api).patch_node(
        name, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH
    )


async def list_kind(real_mcm: RealMcm, plural: str) -> list[dict[str, Any]]:
    listed = await client.CustomObjectsApi(real_mcm.api).list_namespaced_custom_object(
        GROUP, VERSION, real_mcm.namespace, plural
    )
    items: list[dict[str, Any]] = listed["items"]
    return items


async def patch_deployment(real_mcm: RealMcm, pool: str, patch: dict[str, Any]) -> None:
    await client.CustomObjectsApi(real_mcm.api).patch_namespaced_custom_object(
        GROUP, VERSION, real_mcm.namespace, "machinedeployments", pool, patch, _content_type=MERGE_PATCH
    )


def owner_set(machine: dict[str, Any]) -> str:
    owners = machine["metadata"].get("ownerReferences") or []
    return next((o["name"] for o in owners if o.get("kind") == "MachineSet"), "")


async def reasons(product: Product, name: str) -> list[str]:
    return [event.reason for event in await product.events(kind="Machine", name=name)]


async def preserved(real_mcm: RealMcm, name: str, by: v.PreservedBy) -> PreservationRecord:
    """Wait until the machine is preserved (by `by`); its record."""

    async def check() -> PreservationRecord | None:
        record = await record_of(real_mcm, name)
        return record if record is not None and record.by == by else None

    found: PreservationRecord = await eventually_async(check, limit=60, interval=0.25)
    return found


async def failed(real_mcm: RealMcm, name: str, *, until: Callable[[], bool] | None = None) -> None:
    """The node's kubelet stops: NotReady at once, then Unknown (as the node lifecycle controller would write
    it) if MCM has not failed the machine (or done `until`) soon after its health timeout.

    MCM looks at an Unknown machine again 5 s after moving it there, unless a look was due earlier (it keeps
    the earliest): a look before the health timeout has passed defers the next one by a minute, so Failed
    would come after 5 s or after 65 s. A change of the node's condition makes MCM look again."""
    done = until or (lambda: real_mcm.recorder.first(name, phase="Failed") is not None)
    await real_mcm.set_node_ready(name, False)
    health_timeout = float(real_mcm.runner.settings.machine_health_timeout.removesuffix("s"))
    with contextlib.suppress(AssertionError):
        await eventually_async(done, limit=health_timeout + 4, interval=0.2)
        return
    await real_mcm.set_node_ready(name, "Unknown")
    try:
        await eventually_async(done, limit=60, interval=0.25)
    except AssertionError as error:
        said = [line for line in real_mcm.logs().splitlines() if name in line][-15:]
        history = real_mcm.recorder.history(name)
        raise AssertionError(f"{error}: {history}; MCM about {name}:\n" + "\n".join(said)) from None


def mcm_log(real_mcm: RealMcm) -> str:
    return real_mcm.runner.log(MCM_LOG).read_text(errors="replace")


def denials(log: str, machine: str = "") -> list[str]:
    """MCM's log lines saying a delete of `machine` (any machine when empty) was refused by admission."""
    return [
        line
        for line in log.splitlines()
        if "failed to terminate stale machines" in line and "denied the request" in line and machine in line
    ]


# --- the scenarios ---------------------------------------------------------------------------------------------


async def zonal_pool(real_mcm: RealMcm, pool: str, replicas: dict[str, int]) -> dict[str, list[str]]:
    """One MachineDeployment per zone (`<pool>-<zone>`), each labelled with the pool and its zone, as
    Gardener's provider extensions create them; each zone's machines, once Running."""
    for zone, count in replicas.items():
        labels = {WORKER_POOL_LABEL: pool, ZONE_LABEL: zone}
        await real_mcm.create_pool(f"{pool}-{zone}", replicas=count, machine_deployment_labels=labels)
    return {zone: names(await real_mcm.wait_for_pool(f"{pool}-{zone}", count)) for zone, count in replicas.items()}


def held_unknown(real_mcm: RealMcm, machine: str) -> bool:
    """MCM v0.61.3 marks one machine of a MachineDeployment Failed at a time, counting every machine that is
    neither Running nor Unknown (a kept Failed one included): it says so when it holds `machine` back."""
    return f'Cannot mark `Unknown` machine="{machine}" as `Failed`' in real_mcm.logs()


async def replaced(real_mcm: RealMcm, deployment: str, machine: str, replicas: int) -> list[str]:
    """Wait until `machine` is gone and its MachineDeployment has `replicas` Running machines again."""
    machines = names(await real_mcm.wait_for_pool(deployment, replicas, limit=120))
    assert machine not in machines
    history = real_mcm.recorder.history(machine)
    assert "Failed" in history, history
    assert history[-1] == "deleted", history
    return machines


async def test_a_budget_of_one_keeps_one_failure_and_replaces_the_next(
    real_mcm: RealMcm, product: Product, gardener_cluster: ClusterWriter
) -> None:
    pool = "budget"
    # The pool's settings only come from the Shoot: v0.61.3's CRDs prune them from the MachineDeployments.
    # A max of 1 over two zones: zone-a keeps one failed machine, zone-b none.
    await gardener_cluster(pool, zones=ZONES, maximum=1, preserve_timeout="90s")
    await product.start(preserve_timeout=LONG)  # the pool's 90s must win over the flag
    machines = await zonal_pool(real_mcm, pool, {"zone-a": 2, "zone-b": 1})
    first, waiting = machines["zone-a"]
    (beyond,) = machines["zone-b"]

    await asyncio.gather(failed(real_mcm, first), failed(real_mcm, beyond))
    record = await preserved(real_mcm, first, v.PreservedBy.AUTO)
    assert record.until - record.since == dt.timedelta(seconds=90), "the pool's machinePreserveTimeout applies"
    annotations = await annotations_of(real_mcm, first)
    assert annotations[v.PRESERVE_ANNOTATION] == v.PreserveValue.AUTO.value
    assert int(annotations[v.MACHINE_PRIORITY_ANNOTATION]) > v.DEFAULT_MACHINE_PRIORITY
    assert {GRANTED, STARTED} <= set(await reasons(product, first))
    writes = await product.controller_writes(real_mcm.namespace)
    preserve_field = f"metadata.annotations[{v.PRESERVE_ANNOTATION}]"
    assert any(w.kind == "Machine" and w.name == first and preserve_field in w.fields for w in writes), writes

    # The next failure in zone-a: MCM does not mark it Failed while the kept one is Failed, so it is neither
    # preserved nor replaced for as long as the first is kept.
    await failed(real_mcm, waiting, until=lambda: held_unknown(real_mcm, waiting))

    # The failure beyond the budget (zone-b's share is 0) is replaced as usual.
    await replaced(real_mcm, f"{pool}-zone-b", beyond, 1)
    assert GRANTED not in await reasons(product, beyond)
    assert term(await record_of(real_mcm, first)) == term(record), "the kept machine stayed kept"
    assert all(not e.deleting for e in real_mcm.recorder.events if e.name == first)
    assert machine_phase(await real_mcm.machine(first) or {}) == "Failed"
    # While it was kept, MCM's deletes of it were refused by our guard (that is what keeps it).
    assert denials(mcm_log(real_mcm), first)
    # The held one stayed held meanwhile.
    assert "Failed" not in real_mcm.recorder.history(waiting)
    assert await record_of(real_mcm, waiting) is None


async def test_lowering_the_max_releases_exactly_the_excess(
    real_mcm: RealMcm, product: Product, gardener_cluster: ClusterWriter
) -> None:
    pool = "lowered"
    # A max of 2 over two zones: one kept failure each. Lowered to 1: zone-a keeps one, zone-b none.
    # (Two kept failures in one MachineSet, to see the oldest go first, cannot happen with MCM v0.61.3: it
    # marks one machine of a MachineDeployment Failed at a time.)
    await gardener_cluster(pool, zones=ZONES, maximum=2, preserve_timeout=LONG)
    await product.start(preserve_timeout=LONG)
    machines = await zonal_pool(real_mcm, pool, {"zone-a": 1, "zone-b": 1})
    (kept,) = machines["zone-a"]
    (excess,) = machines["zone-b"]
    await asyncio.gather(failed(real_mcm, kept), failed(real_mcm, excess))
    record = await preserved(real_mcm, kept, v.PreservedBy.AUTO)
    await preserved(real_mcm, excess, v.PreservedBy.AUTO)

    await gardener_cluster(pool, zones=ZONES, maximum=1, preserve_timeout=LONG)

    async def released() -> bool:
        return RELEASED in await reasons(product, excess)

    await eventually_async(released, limit=30, interval=0.25)
    await replaced(real_mcm, f"{pool}-zone-b", excess, 1)
    # Exactly the excess: zone-a's machine keeps its auto value and its preservation.
    assert RELEASED not in await reasons(product, kept)
    assert (await annotations_of(real_mcm, kept))[v.PRESERVE_ANNOTATION] == v.PreserveValue.AUTO.value
    assert term(await record_of(real_mcm, kept)) == term(record)
    assert all(not e.deleting for e in real_mcm.recorder.events if e.name == kept)


async def test_a_scale_down_takes_unpreserved_machines_first(real_mcm: RealMcm, product: Product) -> None:
    pool = "shrink"
    await product.start(preserve_timeout=LONG)
    await real_mcm.create_pool(pool, replicas=1)
    # The oldest machine is the one MCM would take first among equals: preserve that one.
    (oldest,) = names(await real_mcm.wait_for_pool(pool, 1))
    await real_mcm.scale(pool, 3)
    others = set(names(await real_mcm.wait_for_pool(pool, 3))) - {oldest}

    await annotate_node(real_mcm, oldest, {v.PRESERVE_ANNOTATION: v.PreserveValue.NOW.value})
    record = await preserved(real_mcm, oldest, v.PreservedBy.USER)

    async def raised() -> bool:
        annotations = await annotations_of(real_mcm, oldest)
        return int(annotations.get(v.MACHINE_PRIORITY_ANNOTATION, "3")) > v.DEFAULT_MACHINE_PRIORITY

    await eventually_async(raised, limit=30, interval=0.25)

    await real_mcm.scale(pool, 2)
    remaining = set(names(await real_mcm.wait_for_pool(pool, 2, limit=120)))

    assert oldest in remaining
    (gone,) = others - remaining
    assert real_mcm.recorder.history(gone)[-1] == "deleted"
    assert all(not e.deleting for e in real_mcm.recorder.events if e.name == oldest)
    assert term(await record_of(real_mcm, oldest)) == term(record)


async def preserve_a_healthy_and_a_failed_machine(real_mcm: RealMcm, pool: str) -> tuple[str, str]:
    """A pool of two: one healthy machine preserved with `now`, one Failed and preserved (`when-failed`)
    whose replacement delete MCM has already tried and our guard refused."""
    await real_mcm.create_pool(pool, replicas=2)
    healthy, broken = names(await real_mcm.wait_for_pool(pool, 2))
    await annotate_machine(real_mcm, healthy, {v.PRESERVE_ANNOTATION: v.PreserveValue.NOW.value})
    await annotate_machine(real_mcm, broken, {v.PRESERVE_ANNOTATION: v.PreserveValue.WHEN_FAILED.value})
    await preserved(real_mcm, healthy, v.PreservedBy.USER)
    await failed(real_mcm, broken)
    await preserved(real_mcm, broken, v.PreservedBy.USER)
    await eventually_async(lambda: denials(mcm_log(real_mcm), broken), limit=60, interval=0.25)
    return healthy, broken


async def all_gone(real_mcm: RealMcm, machines: list[str]) -> None:
    """Wait until no Machine is left in the namespace and the machines' Nodes are deleted."""

    async def check() -> bool:
        if await real_mcm.machines():
            return False
        return all([await real_mcm.node(name) is None for name in machines])

    await eventually_async(check, limit=120, interval=0.5)


async def test_scale_to_zero_deletes_every_machine_preserved_ones_included(real_mcm: RealMcm, product: Product) -> None:
    pool = "hibernate"
    await product.start(preserve_timeout=LONG)
    healthy, broken = await preserve_a_healthy_and_a_failed_machine(real_mcm, pool)

    await real_mcm.scale(pool, 0)
    await all_gone(real_mcm, [healthy, broken])

    for name in (healthy, broken):
        assert real_mcm.recorder.history(name)[-1] == "deleted"
    # Once MCM's MachineSet wanted no machine, no delete of it was refused: the guard let the count win.
    log = mcm_log(real_mcm)
    marks = [m.end() for m in re.finditer(r"Too many replicas for .*need 0, deleting \d+", log)]
    assert marks, "MCM's MachineSet scaled to zero"
    assert not denials(log[marks[0] :]), denials(log[marks[0] :])


async def test_deleting_the_machine_deployment_deletes_every_machine(real_mcm: RealMcm, product: Product) -> None:
    pool = "retired"
    await product.start(preserve_timeout=LONG)
    healthy, broken = await preserve_a_healthy_and_a_failed_machine(real_mcm, pool)

    await client.CustomObjectsApi(real_mcm.api).delete_namespaced_custom_object(
        GROUP, VERSION, real_mcm.namespace, "machinedeployments", pool
    )
    await all_gone(real_mcm, [healthy, broken])

    async def no_sets() -> bool:
        return not await list_kind(real_mcm, "machinesets") and not await list_kind(real_mcm, "machinedeployments")

    await eventually_async(no_sets, limit=60, interval=0.5)
    for name in (healthy, broken):
        assert real_mcm.recorder.history(name)[-1] == "deleted"


async def test_with_webhook_and_controller_down_hibernation_and_shoot_deletion_take_every_machine(
    real_mcm: RealMcm, product: Product
) -> None:
    await product.start(preserve_timeout=LONG)
    sleeping = await preserve_a_healthy_and_a_failed_machine(real_mcm, "sleeping")
    deleted = await preserve_a_healthy_and_a_failed_machine(real_mcm, "deleted")
    await product.stop_webhook()
    await product.stop_controller()

    # Gardener's Worker actuator, on hibernation and on the Shoot's deletion alike: every machine of the namespace
    # marked for forced deletion first, then the pools scaled to zero (hibernation) or their MachineDeployments
    # deleted (deletion). MCM's deletes of the kept machines never reach the webhook, so its outage blocks neither.
    objects = client.CustomObjectsApi(real_mcm.api)
    for machine in await real_mcm.machines():
        await objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            real_mcm.namespace,
            "machines",
            machine["metadata"]["name"],
            {"metadata": {"labels": {"force-deletion": "True"}}},
            _content_type=MERGE_PATCH,
        )
    await real_mcm.scale("sleeping", 0)
    await objects.delete_namespaced_custom_object(GROUP, VERSION, real_mcm.namespace, "machinedeployments", "deleted")
    await all_gone(real_mcm, [*sleeping, *deleted])
    for name in (*sleeping, *deleted):
        assert real_mcm.recorder.history(name)[-1] == "deleted"


async def machine_sets(real_mcm: RealMcm, deployment: str = "") -> dict[str, dict[str, Any]]:
    """The namespace's MachineSets (of one MachineDeployment if given), by name."""
    return {
        s["metadata"]["name"]: s
        for s in await list_kind(real_mcm, "machinesets")
        if not deployment or any(o.get("name") == deployment for o in s["metadata"].get("ownerReferences") or [])
    }


async def new_machine_set(real_mcm: RealMcm, deployment: str, old: str) -> str:
    """Wait for the MachineSet a rollout of `deployment` creates next to `old`; its name."""

    async def check() -> str | None:
        return next((name for name in await machine_sets(real_mcm, deployment) if name != old), None)

    found: str = await eventually_async(check, limit=30, interval=0.1)
    return found


async def rollout_done(real_mcm: RealMcm, deployment: str, replicas: int, new: str) -> list[dict[str, Any]]:
    """Wait until the rollout of `deployment` to MachineSet `new` is complete: `new` has `replicas` machines,
    each Running with a Ready Node; the other MachineSets want none and each of their machines is being
    deleted (its termination takes MCM another ~30 s). Returns the new machines."""

    async def check() -> list[dict[str, Any]] | None:
        machines = await real_mcm.machines(deployment)
        current = [m for m in machines if owner_set(m) == new]
        if len(current) != replicas or any(machine_phase(m) != "Running" for m in current):
            return None
        if any(not m["metadata"].get("deletionTimestamp") for m in machines if owner_set(m) != new):
            return None
        for machine in current:
            node = await real_mcm.node(machine_node(machine))
            if node is None or node_ready_status(node) != "True":
                return None
        sets = await machine_sets(real_mcm, deployment)
        others = [s.get("spec", {}).get("replicas", 0) for name, s in sets.items() if name != new]
        return current if not any(others) else None

    try:
        done: list[dict[str, Any]] = await eventually_async(check, limit=120, interval=0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{real_mcm.log_tail()}") from None
    return done


async def test_a_rollout_completes_and_does_not_auto_preserve_the_old_machine_set(
    real_mcm: RealMcm, product: Product, gardener_cluster: ClusterWriter
) -> None:
    pool = "rolling"
    # A max of 2 over two zones, one each. Zone-a rolls out; zone-b's failure shows the budget is in force.
    await gardener_cluster(pool, zones=ZONES, maximum=2, preserve_timeout=LONG)
    await product.start(preserve_timeout=LONG)
    machines = await zonal_pool(real_mcm, pool, {"zone-a": 2, "zone-b": 1})
    victim = machines["zone-a"][0]
    (control,) = machines["zone-b"]
    rolling = f"{pool}-zone-a"
    (old,) = await machine_sets(real_mcm, rolling)

    # A new machine template: MCM rolls zone-a over to a new MachineSet. The rollout is held right after the
    # new MachineSet appears (two machines: one new one does not finish it), so the victim fails while its
    # MachineSet is being replaced, whatever the speed of the rollout; it resumes once the failure is dealt with.
    await patch_deployment(real_mcm, rolling, {"spec": {"template": {"metadata": {"labels": {"rollout": "2"}}}}})
    new = await new_machine_set(real_mcm, rolling, old)
    await patch_deployment(real_mcm, rolling, {"spec": {"paused": True}})
    assert owner_set(await real_mcm.machine(victim) or {}) == old

    await asyncio.gather(failed(real_mcm, victim), failed(real_mcm, control))
    # MCM deletes the victim as it deletes any Failed machine: the guard does not keep it. Zone-b's is kept.
    await eventually_async(lambda: any(e.deleting for e in real_mcm.recorder.events if e.name == victim), limit=30)
    await preserved(real_mcm, control, v.PreservedBy.AUTO)
    await patch_deployment(real_mcm, rolling, {"spec": {"paused": False}})
    await rollout_done(real_mcm, rolling, 2, new)

    history = real_mcm.recorder.history(victim)
    assert "Failed" in history, history
    assert "Terminating" in history or history[-1] == "deleted", history
    assert not {GRANTED, STARTED} & set(await reasons(product, victim))
    writes = await product.controller_writes(real_mcm.namespace)
    assert not [w for w in writes if w.kind == "Machine" and w.name == victim], writes
    assert GRANTED in await reasons(product, control)


async def nudge(real_mcm: RealMcm, machine: str) -> None:
    """Touch the Machine (a label of the test's own): MCM's MachineSet controller syncs on every Machine
    update. It stands in for the MachineSet's periodic resync (every 10 minutes), the only other thing that
    makes MCM retry a refused delete when nothing else changes."""
    await client.CustomObjectsApi(real_mcm.api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        real_mcm.namespace,
        "machines",
        machine,
        {"metadata": {"labels": {"e2e-nudged": str(time.monotonic_ns())}}},
        _content_type=MERGE_PATCH,
    )


def webhook_refusals(real_mcm: RealMcm, machine_set: str) -> list[str]:
    """MCM's log lines saying a delete by the MachineSet failed because the webhook could not be called."""
    return [
        line
        for line in mcm_log(real_mcm).splitlines()
        if f"failed to terminate stale machines for machineset {machine_set}:" in line
        and "failed calling webhook" in line
    ]


async def test_with_the_webhook_down_healthy_machines_go_and_failed_ones_wait(
    real_mcm: RealMcm, product: Product
) -> None:
    # Three pools side by side, so that nothing waits for another's terminations: one scales down, one rolls
    # out, one loses a machine.
    await product.start(preserve_timeout=LONG)
    for pool, replicas in (("shrinking", 2), ("rolling", 1), ("failing", 1)):
        await real_mcm.create_pool(pool, replicas=replicas)
    shrinking = names(await real_mcm.wait_for_pool("shrinking", 2))
    (rolled,) = names(await real_mcm.wait_for_pool("rolling", 1))
    (broken,) = names(await real_mcm.wait_for_pool("failing", 1))
    rolling_old = owner_set(await real_mcm.machine(rolled) or {})
    failing_set = owner_set(await real_mcm.machine(broken) or {})

    await product.stop_webhook()
    await real_mcm.scale("shrinking", 1)
    await patch_deployment(real_mcm, "rolling", {"spec": {"template": {"metadata": {"labels": {"rollout": "2"}}}}})

    def deleting(names_: list[str]) -> list[str]:
        return [n for n in names_ if any(e.deleting for e in real_mcm.recorder.events if e.name == n)]

    # MCM's deletes of healthy machines never wait for the webhook: the scale-down and the rollout proceed.
    await eventually_async(lambda: deleting(shrinking), limit=60, interval=0.25)
    await eventually_async(lambda: deleting([rolled]), limit=60, interval=0.25)
    # The delete of a Failed machine needs the webhook's answer: the API server refuses it without one.
    await failed(real_mcm, broken, until=lambda: bool(webhook_refusals(real_mcm, failing_set)))
    current = await real_mcm.machine(broken)
    assert current is not None
    assert not current["metadata"].get("deletionTimestamp")
    assert machine_phase(current) == "Failed"
    assert not [
        line
        for line in mcm_log(real_mcm).splitlines()
        if "failed calling webhook" in line and ("shrinking" in line or "rolling" in line)
    ]

    await product.start_webhook()

    async def deleted_once_retried() -> bool:
        if deleting([broken]):
            return True
        await nudge(real_mcm, broken)
        return False

    await eventually_async(deleted_once_retried, limit=30, interval=2)
    (replacement,) = names(await real_mcm.wait_for_pool("failing", 1, limit=120))
    assert replacement != broken
    assert real_mcm.recorder.history(broken)[-1] == "deleted"
    assert len(await real_mcm.wait_for_pool("shrinking", 1)) == 1
    (new,) = set(await machine_sets(real_mcm, "rolling")) - {rolling_old}
    await rollout_done(real_mcm, "rolling", 1, new)
