"""Upgrading MCM from v0.61.3 to v0.62.1 (native preservation) while machines are preserved, the way a Gardener
landscape rolls it out, with our product started with `--mcm-native-preservation=auto`.

The order Gardener produces, and the one this test follows:
1. gardenlet applies MCM's new CRDs when it reconciles the seed, while the old MCM still runs;
2. the shoot's reconcile rolls MCM's Deployment to the new image (the old MCM stops, the new one starts), and
   the worker extension writes the pools' MachineDeployments with the fields the new MCM knows
   (`autoPreserveFailedMachineMax`);
3. our release is not part of that rollout: our processes decide "native or not" when they start, so they go on
   as for v0.61 until they restart (a `helm upgrade`, a rollout restart, a rescheduled pod).
So the new MCM runs for a while beside our old processes, and the race is real. What happens in that window
(asserted below): MCM v0.62.1 starts its own preservation of the `now` machine with an expiry of its own (its
default timeout: the machine would be kept far longer than asked), and it tries to replace the auto-preserved
Failed machine (our `auto-preserve` is no value it knows): our webhook, still guarding deletes, refuses, so
nothing is lost (MCM's own `auto-preserved` on it is refused as well, as from anyone but our controller); our
controller writes nothing meanwhile. Once our processes restart (the webhook first, then the controller; the
order does not matter, the controller's writes do not pass the webhook) they see MCM's new image and hand over:
MCM's expiry is replaced by ours (the SAME expiry the preservation had), `auto-preserve` becomes
`auto-preserved`, our record goes, one PreservationHandedOver Event per machine and node; MCM then counts the
Failed machine as its own auto-preserved one, keeps it until that expiry and replaces it after, and our
controller writes nothing more. Both must restart: a webhook still deciding "not native" refuses MCM's delete of
the handed-over machine after its expiry too (it takes `auto-preserved` for a machine about to be preserved by
our controller), and the pool stays a machine short until the webhook restarts.

The plane is this test's own: the shared v0.61.3 plane must keep v0.61.3's CRDs. MCM's Deployment is a
stand-in with no replicas (MCM runs as local processes), there for what `auto` reads: its image.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL
from machine_preservation.core.models import Machine
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.crds import install_crds
from machine_preservation.localcluster.mcm_pool import GROUP, VERSION, machine_phase
from machine_preservation.localcluster.toolchain import Toolchain
from tests.e2e.harness import (
    RealMcm,
    annotate_node,
    fail_machine,
    machine_annotations,
    nudge_machine,
    preserve_expiry,
    preserved_condition,
)
from tests.e2e.product import Product, mcm_control_plane
from tests.polling import eventually_async

OLD, NEW = "v0.61.3", "v0.62.1"
pytestmark = pytest.mark.parametrize("mcm_version", [OLD], indirect=True)

MCM_IMAGE = "europe-docker.pkg.dev/gardener-project/releases/gardener/machine-controller-manager"
# Our preservations' timeout: the upgrade is done well within it, and the test still sees it run out.
PRESERVE_TIMEOUT = dt.timedelta(seconds=60)
MAX_PRESERVE_TIMEOUT = dt.timedelta(hours=720)
POOL = "upgraded"
HANDED_OVER = v.EventReason.PRESERVATION_HANDED_OVER.value
# Gardener's provider extension, which writes the pools' MachineDeployments.
WORKER_EXTENSION = "worker-extension@example.com"


@pytest.fixture
def mcm_plane(toolchain: Toolchain, tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of this test's own, with v0.61.3's CRDs (the test replaces them)."""
    with mcm_control_plane(directory=tmp_path / "plane", bin_dir=toolchain.bin_dir, mcm_version=OLD) as plane:
        yield plane


@pytest.fixture
async def gardener_objects(real_mcm: RealMcm) -> None:
    """What Gardener keeps in a shoot's control namespace that we read: MCM's Deployment (image v0.61.3) and
    the `Cluster` with the Shoot, whose worker pool allows one auto-preserved failed machine (v0.61.3's CRDs
    prune that field from MachineDeployments)."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "machine-controller-manager", "namespace": real_mcm.namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "machine-controller-manager"}},
            "template": {
                "metadata": {"labels": {"app": "machine-controller-manager"}},
                "spec": {"containers": [{"name": "machine-controller-manager", "image": f"{MCM_IMAGE}:{OLD}"}]},
            },
        },
    }
    await client.AppsV1Api(real_mcm.api).create_namespaced_deployment(real_mcm.namespace, deployment)
    cluster = {
        "apiVersion": f"{CLUSTER_API_GROUP}/{CLUSTER_API_VERSION}",
        "kind": "Cluster",
        "metadata": {"name": real_mcm.namespace},
        "spec": {
            "cloudProfile": {},
            "seed": {},
            "shoot": {
                "apiVersion": "core.gardener.cloud/v1beta1",
                "kind": "Shoot",
                "metadata": {"name": "upgraded", "namespace": "garden-e2e"},
                "spec": {
                    "provider": {
                        "type": "fake",
                        "workers": [
                            {
                                "name": POOL,
                                "zones": ["zone-a"],
                                "machineControllerManager": {"autoPreserveFailedMachineMax": 1},
                            }
                        ],
                    }
                },
            },
        },
    }
    custom = client.CustomObjectsApi(real_mcm.api)
    # Cluster-scoped, but the plane is this test's alone and goes with it.
    await custom.create_cluster_custom_object(CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, cluster)


async def record_of(real_mcm: RealMcm, name: str) -> PreservationRecord | None:
    raw = await real_mcm.machine(name)
    return None if raw is None else Machine.model_validate(raw).preservation


async def preserved_by_us(real_mcm: RealMcm, name: str, by: v.PreservedBy) -> PreservationRecord:
    async def check() -> PreservationRecord | None:
        record = await record_of(real_mcm, name)
        return record if record is not None and record.by == by else None

    found: PreservationRecord = await eventually_async(check, limit=60, interval=0.25)
    return found


def mcm_denials(real_mcm: RealMcm, machine: str, *, version: str) -> list[str]:
    """The log lines of MCM `version` (its last start) saying admission refused its delete of `machine`."""
    log = real_mcm.runner.log("machine-controller-manager").read_text(errors="replace")
    marker = f"starting machine-controller-manager {version}"
    assert marker in log
    return [
        line
        for line in log.rsplit(marker, 1)[-1].splitlines()
        if "failed to terminate stale machines" in line and "denied the request" in line and machine in line
    ]


def preserve_value(body: Any) -> str | None:
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(v.PRESERVE_ANNOTATION)
    return value if isinstance(value, str) else None


def removes_record(body: Any) -> bool:
    """Whether a merge patch removes our record (its `preserved-until`)."""
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    return v.PRESERVED_UNTIL_ANNOTATION in annotations and annotations[v.PRESERVED_UNTIL_ANNOTATION] is None


async def worker_extension_writes_the_pool(real_mcm: RealMcm, product: Product) -> dt.datetime:
    """The worker extension writes the pool's MachineDeployment with the field MCM v0.62 knows; when the API server
    received that write (its audit log's time: the clock of every write the test judges by)."""
    api = await new_api_client(kubeconfig=product.kubeconfig_for(WORKER_EXTENSION, groups=("system:masters",)))
    try:
        await client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            real_mcm.namespace,
            "machinedeployments",
            POOL,
            {"spec": {"autoPreserveFailedMachineMax": 1}},
            _content_type=MERGE_PATCH,
        )
    finally:
        await api.close()

    async def audited() -> dt.datetime | None:
        writes = [w for w in await product.writes_by(WORKER_EXTENSION) if w.kind == "MachineDeployment"]
        return writes[-1].at if writes else None

    received: dt.datetime = await eventually_async(audited, limit=30, interval=0.2)
    return received


async def machine_set_status(real_mcm: RealMcm) -> dict[str, Any]:
    listed = await client.CustomObjectsApi(real_mcm.api).list_namespaced_custom_object(
        GROUP, VERSION, real_mcm.namespace, "machinesets"
    )
    (machine_set,) = listed["items"]
    status: dict[str, Any] = machine_set.get("status") or {}
    return status


async def test_upgrade_hands_running_preservations_over_to_mcm(
    real_mcm: RealMcm, product: Product, gardener_objects: None
) -> None:
    started = time.monotonic()

    def progress(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}")

    # --- before: MCM v0.61.3, our product runs the lifecycle -------------------------------------------------
    await product.start(native="auto", preserve_timeout=f"{int(PRESERVE_TIMEOUT.total_seconds())}s")
    assert f"MCM native preservation: off (MCM's image {MCM_IMAGE}:{OLD} is v0.61.3)" in product.log("controller")
    assert "MCM native preservation: off" in product.log("webhook")

    await real_mcm.create_pool(POOL, replicas=2)
    healthy, failing = (m["metadata"]["name"] for m in await real_mcm.wait_for_pool(POOL, 2))
    await annotate_node(real_mcm, healthy, {v.PRESERVE_ANNOTATION: "now"})
    await fail_machine(real_mcm, failing)
    healthy_record = await preserved_by_us(real_mcm, healthy, v.PreservedBy.USER)
    failing_record = await preserved_by_us(real_mcm, failing, v.PreservedBy.AUTO)
    assert (await machine_annotations(real_mcm, failing))[v.PRESERVE_ANNOTATION] == "auto-preserve"
    expiries = {
        healthy: healthy_record.expiry(max_timeout=MAX_PRESERVE_TIMEOUT),
        failing: failing_record.expiry(max_timeout=MAX_PRESERVE_TIMEOUT),
    }

    # Both starts written to their last write (the failing one's drain outcome, each one's acknowledged
    # announcement), so that none of them is still on its way when the window opens.
    async def settled() -> bool:
        records = [await record_of(real_mcm, name) for name in (healthy, failing)]
        if any(record is None or record.announcement_pending for record in records):
            return False
        failing_now = records[1]
        assert failing_now is not None
        nodes = [await real_mcm.node(name) for name in (healthy, failing)]
        conditions = [preserved_condition(node) if node else None for node in nodes]
        return (
            failing_now.drain is not None
            and failing_now.drain.outcome == v.DrainOutcome.DRAINED
            and all(condition is not None and condition["status"] == "True" for condition in conditions)
            and v.DRAINED_SUCCESSFULLY_MESSAGE in (conditions[1] or {}).get("message", "")
        )

    await eventually_async(settled, limit=60, interval=0.25)
    progress(f"v0.61.3: {healthy} preserved by us (now), {failing} Failed and auto-preserved by us, drained")

    # --- 1. the seed's reconcile: MCM's new CRDs, the old MCM still running ----------------------------------
    await asyncio.to_thread(install_crds, real_mcm.plane.kubeconfig, mcm_version=NEW)
    # --- 2. the shoot's reconcile: the MachineDeployment with the new field, MCM's Deployment rolled ----------
    window_opened = await worker_extension_writes_the_pool(real_mcm, product)
    await client.AppsV1Api(real_mcm.api).patch_namespaced_deployment(
        "machine-controller-manager",
        real_mcm.namespace,
        {
            "spec": {
                "template": {
                    "spec": {"containers": [{"name": "machine-controller-manager", "image": f"{MCM_IMAGE}:{NEW}"}]}
                }
            }
        },
    )
    real_mcm.runner.version, real_mcm.runner.bin_dir = NEW, None
    await real_mcm.restart()
    progress("CRDs v0.62.1, MachineDeployment with autoPreserveFailedMachineMax, MCM v0.62.1 running")

    # --- the window: MCM v0.62.1 beside our processes as they were ---------------------------------------------
    async def mcm_expiry_on_healthy() -> dt.datetime | None:
        machine = await real_mcm.machine(healthy)
        return preserve_expiry(machine) if machine else None

    # MCM preserves the `now` machine itself, with its own default timeout: not the expiry asked for.
    mcm_expiry = await eventually_async(mcm_expiry_on_healthy, limit=60, interval=0.25)
    assert mcm_expiry > expiries[healthy] + dt.timedelta(hours=1), (mcm_expiry, expiries[healthy])
    # It reads our `auto-preserve` as no value and would replace the Failed machine: our webhook refuses.
    await eventually_async(lambda: mcm_denials(real_mcm, failing, version=NEW), limit=60, interval=0.25)
    assert {m["metadata"]["name"] for m in await real_mcm.machines(POOL)} == {healthy, failing}
    # Our processes as they were do not fight MCM meanwhile: the controller writes nothing. Judged on the API
    # server's clock, by when it received each write, from when it received the first write of the window.
    assert [w for w in await product.controller_writes() if w.at >= window_opened] == []
    refused = sorted(
        {
            f"{w.operation} {w.name}"
            + (f" ({v.PRESERVE_ANNOTATION}={preserve_value(w.body)})" if w.operation != "delete" else "")
            for w in await product.writes_by(product.mcm_user)
            if w.kind == "Machine" and w.code == 403 and w.at >= window_opened
        }
    )
    progress(f"window: MCM's own expiry for {healthy}: {mcm_expiry} (ours {expiries[healthy]}); refused: {refused}")

    # --- 3. our release restarts (webhook, then controller): MCM's image says v0.62.1 -------------------------
    await product.stop_webhook()
    await product.start_webhook()
    await product.stop_controller()
    await product.start_controller()
    assert f"MCM native preservation: on (MCM's image {MCM_IMAGE}:{NEW} is v0.62.1)" in product.log("controller")
    assert product.log("webhook").count("MCM native preservation: on") == 1

    async def handed_over(name: str) -> dict[str, Any] | None:
        machine = await real_mcm.machine(name)
        if machine is None or preserve_expiry(machine) != expiries[name]:
            return None
        annotations = machine["metadata"].get("annotations") or {}
        if any(key in annotations for key in v.PRESERVATION_RECORD_ANNOTATIONS):
            return None
        return machine

    for name in (healthy, failing):
        await eventually_async(lambda name=name: handed_over(name), limit=60, interval=0.25)  # type: ignore[misc]
    progress("our webhook and controller restarted, native; both preservations handed over")
    assert (await machine_annotations(real_mcm, failing))[v.PRESERVE_ANNOTATION] == "auto-preserved"
    # The nodes keep what the preservation put there (MCM carries on from it).
    for name in (healthy, failing):
        node = await real_mcm.node(name)
        assert node is not None
        condition = preserved_condition(node)
        assert condition is not None
        assert condition["status"] == "True"
        assert node["metadata"]["annotations"].get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
        # ... but not the fields that told of our record, which is gone.
        assert not set(node["metadata"]["annotations"]) & set(v.NODE_PRESERVATION_ANNOTATIONS), node["metadata"]
    # An Event goes out once the writes before it succeeded, without holding up the writes after it: on a busy
    # machine it may arrive after the handover is visible.
    for name in (healthy, failing):
        for kind in ("Machine", "Node"):

            async def handed_over_events(kind: str = kind, name: str = name) -> list[int]:
                return [e.count for e in await product.events(kind=kind, name=name) if e.reason == HANDED_OVER]

            counts = await eventually_async(handed_over_events, limit=30, interval=0.25)
            assert counts == [1], (kind, name, counts)

    # The hand-over's writes are in the audit log (its last write per machine removes the record); from here
    # on our controller only observes.
    async def hand_over_written() -> list[Any] | None:
        writes = await product.controller_writes()
        removed = {w.name for w in writes if w.kind == "Machine" and w.code == 200 and removes_record(w.body)}
        return writes if {healthy, failing} <= removed else None

    writes_at_hand_over = len(await eventually_async(hand_over_written, limit=30, interval=0.25))

    # MCM carries both on: it counts the Failed machine as its own auto-preserved one, keeps the expiry.
    async def mcm_counts_it() -> bool:
        status = await machine_set_status(real_mcm)
        return status.get("autoPreserveFailedMachineCount") == 1 and status.get("preservedFailedReplicas") == 1

    await eventually_async(mcm_counts_it, limit=60, interval=0.5)

    # --- the Failed machine is kept until its expiry, then replaced -------------------------------------------
    await eventually_async(
        lambda: dt.datetime.now(dt.UTC) > expiries[failing] + dt.timedelta(seconds=1), limit=120, interval=0.5
    )
    for name in (healthy, failing):
        machine = await real_mcm.machine(name)
        assert machine is not None
        assert preserve_expiry(machine) == expiries[name]
    assert machine_phase(await real_mcm.machine(failing) or {}) == "Failed"
    assert {m["metadata"]["name"] for m in await real_mcm.machines(POOL)} == {healthy, failing}
    assert "deleted" not in real_mcm.recorder.history(failing)
    # MCM acts on an expiry at its next sync of the machine (periodically every 10 minutes): a Machine update
    # stands in for it.
    progress(f"{failing}'s expiry passed: still there, Failed, not replaced")
    await nudge_machine(real_mcm, failing)

    async def replaced() -> dict[str, Any] | None:
        # The replacement runs; the old machine is on its way out (MCM's termination takes ~25 s more).
        machines = await real_mcm.machines(POOL)
        fresh = [m for m in machines if m["metadata"]["name"] not in expiries and machine_phase(m) == "Running"]
        old = [m for m in machines if m["metadata"]["name"] == failing]
        going = not old or bool(old[0]["metadata"].get("deletionTimestamp"))
        return fresh[0] if len(fresh) == 1 and going else None

    replacement: dict[str, Any] = await eventually_async(replaced, limit=60, interval=0.25)
    created = dt.datetime.fromisoformat(replacement["metadata"]["creationTimestamp"])
    assert created >= expiries[failing].replace(microsecond=0)
    deleted_at = next(
        w.at
        for w in await product.writes_by(product.mcm_user)
        if w.kind == "Machine" and w.name == failing and w.operation == "delete" and w.code == 200
    )
    assert deleted_at >= expiries[failing]
    progress(f"{failing} replaced by {replacement['metadata']['name']}")

    # Nothing more from our controller after the hand-over.
    assert (await product.controller_writes())[writes_at_hand_over:] == []
