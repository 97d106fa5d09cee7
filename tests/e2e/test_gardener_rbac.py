"""The seed chart's RBAC is exactly what the extension calls, judged from the seed API server's audit log.

One installation of the seed chart (its ServiceAccounts, RBAC and admission policy as rendered) serves one shoot on
real parts (its own kube-apiserver and gardener-resource-manager, real MCM v0.61.3) through the whole lifecycle:
enable, a Failed machine preserved until its preservation expires (the controller deletes it), migrate and
restore, the shoot's API server gone (a Warning Event counted up), and the Shoot force-deleted. Afterwards every
request the extension's ServiceAccount made (tests/e2e/rbac_audit.py) is compared with the rendered chart's rules
both ways: each call is allowed by a rule, and each verb, resource and name a rule grants was called at least once,
except the few in `NOT_EXERCISED`, each needed by code this scenario cannot reach. The webhook's ServiceAccount is
checked for calls its rules miss.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubernetes.aio import client

from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import (
    Installation,
    Shoot,
    annotate_node,
    installation,
    machine,
    new_shoot,
    preserved,
    read_extension,
    served,
)
from machine_preservation.localcluster.toolchain import Toolchain
from tests.e2e import rbac_audit
from tests.e2e.gardener_harness import enable_with_pool
from tests.e2e.rbac_audit import Grant
from tests.polling import eventually_async

POOL = "worker1"
MACHINES = "machine.sapcloud.io"
# Granted, needed, and not called here; each with the code that calls it.
NOT_EXERCISED = {
    # controller/preservation/apply.py: MCM v0.62's own preservation fields
    # (`status.currentStatus.preserveExpiryTime`, the MachineSet's and MachineDeployment's preserved counts) mirrored
    # for an MCM that knows them; this scenario runs MCM v0.61.3 (tests/e2e/test_gardener_native.py runs v0.62.1).
    Grant("patch", MACHINES, "machines/status", "", ""),
    Grant("patch", MACHINES, "machinesets/status", "", ""),
    Grant("patch", MACHINES, "machinedeployments/status", "", ""),
    # controller/gardener/actuator.py `_ensure_secret`: the shoot-access Secret's labels or annotations brought back
    # after someone changed them (the chart's next version may change them too); nobody changes them here.
    Grant("patch", "", "secrets", "shoot-access-machine-preservation", ""),
}


async def test_the_extension_calls_exactly_what_the_seed_chart_grants(
    mcm_plane: ControlPlane, seed: client.ApiClient, toolchain: Toolchain, tmp_path: Path
) -> None:
    async with (
        installation(mcm_plane, seed, toolchain, tmp_path / "installation") as installed,
        new_shoot(
            mcm_plane,
            seed,
            tmp_path / "a",
            workers=[gardener.worker(POOL, maximum=3, machine_preserve_timeout="30s")],
        ) as shoot,
    ):
        try:
            await _lifecycle(seed, shoot)
        except BaseException:
            print(installed.log_tail())
            print(f"MCM:\n{shoot.mcm.log_tail(40)}")
            raise
        _check(mcm_plane, installed)


async def _lifecycle(seed: client.ApiClient, shoot: Shoot) -> None:
    ns = shoot.namespace
    # Enable.
    victim = (await enable_with_pool(seed, shoot, POOL))[0]

    # Preserve a Failed machine; its preservation expires after 30 s and the controller deletes it.
    await annotate_node(shoot, victim, "when-failed")
    await shoot.kubelets.set_ready(victim, False)
    await eventually_async(lambda: preserved(seed, shoot, victim), limit=60, interval=0.2)

    async def deleted() -> bool:
        found = await machine(seed, ns, victim)
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    await eventually_async(deleted, limit=90, interval=0.5)

    # Migrate, and restore on the same seed.
    await gardener.request_operation(seed, ns, "migrate")

    async def last_operation(kind: str) -> bool:
        last = ((await read_extension(seed, ns) or {}).get("status") or {}).get("lastOperation") or {}
        return last.get("type") == kind and last.get("state") == "Succeeded"

    await eventually_async(lambda: last_operation("Migrate"), limit=60)
    await client.CustomObjectsApi(seed).delete_namespaced_custom_object(
        gardener.EXTENSIONS_GROUP, gardener.EXTENSIONS_VERSION, ns, "extensions", gardener.EXTENSION_TYPE
    )
    await eventually_async(lambda: _gone(seed, ns), limit=30)
    await gardener.apply_extension(seed, ns, operation="wait-for-state")
    await gardener.request_operation(seed, ns, "restore")
    await eventually_async(lambda: last_operation("Restore"), limit=60)
    await eventually_async(lambda: served(seed, ns), limit=60)

    # The shoot's API server goes away: the Warning Event on the Extension is counted up; then the Shoot is
    # force-deleted (its Extension with it, without waiting for the shoot).
    await asyncio.to_thread(shoot.mcm.stop)
    await asyncio.to_thread(shoot.grm.stop)
    await asyncio.to_thread(shoot.plane.stop)

    async def repeated() -> bool:
        listed = await client.CoreV1Api(seed).list_namespaced_event(ns)
        return any(e.reason == "ShootNotServed" and (e.count or 0) > 1 for e in listed.items)

    await eventually_async(repeated, limit=120, interval=1.0)
    await gardener.force_delete_shoot(seed, ns, workers=[gardener.worker(POOL, maximum=3)])
    await eventually_async(lambda: _gone(seed, ns), limit=60)


async def _gone(seed: client.ApiClient, namespace: str) -> bool:
    return await read_extension(seed, namespace) is None


def _check(plane: ControlPlane, installed: Installation) -> None:
    documents = installed.documents
    extension = seed_install.service_account_of(documents, seed_install.EXTENSION_DEPLOYMENT)
    made = rbac_audit.calls(plane.audit_log, installed.extension_user)
    granted = rbac_audit.grants(documents, namespace=installed.namespace, service_account=extension)
    assert made, "no call of the extension in the audit log"
    missing = rbac_audit.missing(made, granted)
    assert not missing, "called, not granted:\n" + "\n".join(sorted(map(str, missing)))
    surplus = rbac_audit.unused(made, granted) - NOT_EXERCISED
    assert not surplus, "granted, never called:\n" + "\n".join(sorted(map(str, surplus)))
    assert granted >= NOT_EXERCISED, "an exception for what is no longer granted"

    webhook = seed_install.service_account_of(documents, seed_install.WEBHOOK_DEPLOYMENT)
    webhook_calls = rbac_audit.calls(plane.audit_log, f"system:serviceaccount:{installed.namespace}:{webhook}")
    webhook_grants = rbac_audit.grants(documents, namespace=installed.namespace, service_account=webhook)
    missing = rbac_audit.missing(webhook_calls, webhook_grants)
    assert not missing, "the webhook called, not granted:\n" + "\n".join(sorted(map(str, missing)))
