"""A control-plane migration of a shoot with running preservations, on real parts: the seed chart's installation,
the shoot's real gardener-resource-manager and real MCM v0.61.3.

The test plays gardenlet and the provider extension as Gardener v1.150 does: the Extension is migrated (the source
seed keeps nothing running, the shoot's objects stay), the source seed's MCM stops and the Worker's objects go there,
the Extension is restored (wait-for-state, then restore), and the provider extension's Worker restore re-creates the
MachineSets, Machines (name, annotations, labels and spec; no status, no owners) and MachineDeployments under its own
identity; MCM starts again with the same VMs. Every preservation must go on with its original expiry: the re-created
Machines are accepted, and nothing is released or deleted in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import (
    MCM_SERVICE_ACCOUNT,
    annotate_node,
    annotations_of,
    installation,
    machine,
    new_shoot,
    node,
    preserved,
    read_extension,
    ready,
    served,
    tainted,
)
from machine_preservation.localcluster.mcm_pool import (
    list_machines,
    machine_phase,
)
from machine_preservation.localcluster.mcm_runner import grant_mcm_rbac
from machine_preservation.localcluster.toolchain import Toolchain
from tests.e2e.gardener_harness import enable_with_pool, machine_writes
from tests.polling import eventually_async

POOL = "worker1"
RECORD = (v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION)


def started_as(found: dict[str, Any] | None) -> dict[str, str]:
    annotations = annotations_of(found)
    return {key: annotations[key] for key in RECORD if key in annotations}


async def test_a_control_plane_migration_keeps_every_preservation(
    mcm_plane: ControlPlane, seed: client.ApiClient, toolchain: Toolchain, tmp_path: Path
) -> None:
    async with (
        installation(mcm_plane, seed, toolchain, tmp_path / "installation") as installed,
        new_shoot(
            mcm_plane, seed, tmp_path / "a", workers=[gardener.worker(POOL, maximum=3, machine_preserve_timeout="1h")]
        ) as shoot,
    ):
        try:
            await _scenario(mcm_plane, seed, shoot, tmp_path)
        except BaseException:
            print(installed.log_tail())
            print(f"MCM:\n{shoot.mcm.log_tail(60)}")
            raise


async def _scenario(plane: ControlPlane, seed: client.ApiClient, shoot: Any, tmp_path: Path) -> None:
    ns = shoot.namespace
    failed, healthy = await enable_with_pool(seed, shoot, POOL)

    # Two preservations: a Failed machine kept by `when-failed` (tainted, drained), a healthy one kept by `now`.
    await annotate_node(shoot, failed, "when-failed")
    await annotate_node(shoot, healthy, "now")
    await shoot.kubelets.set_ready(failed, False)
    await eventually_async(lambda: preserved(seed, shoot, failed), limit=60, interval=0.2)

    async def now_preserved() -> dict[str, str] | None:
        return started_as(await machine(seed, ns, healthy)) or None

    await eventually_async(now_preserved, limit=30, interval=0.2)

    async def drained() -> bool:
        found = annotations_of(await machine(seed, ns, failed))
        return found.get(v.PRESERVED_DRAIN_ANNOTATION) == v.DrainOutcome.DRAINED

    await eventually_async(drained, limit=60, interval=0.2)
    records = {name: started_as(await machine(seed, ns, name)) for name in (failed, healthy)}

    # From here on, every 0.2 s: each machine still carries the same record whenever it exists.
    seen: list[str] = []

    async def watch_records() -> None:
        while True:
            for name in (failed, healthy):
                found = await machine(seed, ns, name)
                if found is not None and started_as(found) != records[name]:
                    seen.append(f"{name}: {started_as(found)} at {time.monotonic():.1f}")
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch_records())
    try:
        # The source seed: gardenlet migrates the Extension; MCM stops, the Worker's objects go with the seed.
        await gardener.request_operation(seed, ns, "migrate")

        async def migrated() -> bool:
            last = ((await read_extension(seed, ns) or {}).get("status") or {}).get("lastOperation") or {}
            return last.get("type") == "Migrate" and last.get("state") == "Succeeded"

        await eventually_async(migrated, limit=60)
        await asyncio.to_thread(shoot.mcm.stop)
        state = await gardener.worker_state(seed, ns)
        assert {m["metadata"]["name"] for m in state["machines"]} == {failed, healthy}
        await client.CustomObjectsApi(seed).delete_namespaced_custom_object(
            gardener.EXTENSIONS_GROUP, gardener.EXTENSIONS_VERSION, ns, "extensions", gardener.EXTENSION_TYPE
        )
        await gardener.remove_worker_objects(seed, ns)

        async def emptied() -> bool:
            return not await list_machines(seed, ns) and await read_extension(seed, ns) is None

        await eventually_async(emptied, limit=30)

        # The destination seed (the same one here): the Extension waits for its state and restores; the provider
        # extension re-creates the Worker's objects under its own identity; MCM starts with the same VMs.
        await gardener.apply_extension(seed, ns, operation="wait-for-state")
        await gardener.request_operation(seed, ns, "restore")
        await asyncio.to_thread(grant_mcm_rbac, plane.kubeconfig, username=gardener.PROVIDER_EXTENSION_USER)
        provider_kubeconfig = plane.write_kubeconfig(
            tmp_path / "provider.kubeconfig", user=gardener.PROVIDER_EXTENSION_USER
        )
        provider = await new_api_client(kubeconfig=provider_kubeconfig)
        try:
            await gardener.restore_worker_state(provider, state)  # raises on any denial
        finally:
            await provider.close()
        restored = await ready(seed, ns, limit=60)
        assert restored["status"]["lastOperation"]["type"] == "Restore"
        mcm_user = f"system:serviceaccount:{ns}:{MCM_SERVICE_ACCOUNT}"

        def denials() -> int:
            """MCM's deletes of the Failed machine the seed's webhook denied, from the seed's audit log."""
            writes = machine_writes(plane, user=mcm_user, namespace=ns)
            return len([w for w in writes if w.verb == "delete" and w.name == failed and w.code == 403])

        denied_before = denials()
        await asyncio.to_thread(shoot.mcm.start)

        # MCM places the machines again: the healthy one Running, the failed one Failed again (its node still
        # NotReady, after the creation timeout); both still preserved as before, the Failed one not replaced.
        async def placed() -> dict[str, str] | None:
            phases = {m["metadata"]["name"]: machine_phase(m) for m in await list_machines(seed, ns)}
            return phases if phases == {healthy: "Running", failed: "Failed"} else None

        phases = await eventually_async(placed, limit=240, interval=1.0)
        print(f"placed again: {phases}")
        await eventually_async(lambda: served(seed, ns), limit=60)
        # MCM's MachineSet tries to replace the Failed machine: denied.
        await eventually_async(lambda: denials() > denied_before, limit=60)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert seen == [], "a record changed or went while the shoot moved"
    for name in (failed, healthy):
        found = await machine(seed, ns, name)
        assert found is not None, f"{name} was deleted"
        assert not found["metadata"].get("deletionTimestamp")
        assert started_as(found) == records[name], "the same preservation, its expiry unchanged"
    assert {m["metadata"]["name"] for m in await list_machines(seed, ns)} == {failed, healthy}, "nothing replaced"
    assert tainted(await node(shoot, failed)), "the Failed machine's node stays tainted"
    assert not tainted(await node(shoot, healthy))
