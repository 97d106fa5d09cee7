"""The Gardener extension end to end on real parts: one seed kube-apiserver with Gardener's CRDs; two shoots, each
with its own kube-apiserver (audience `gardener`), its own real gardener-resource-manager and its own real MCM
v0.61.3 (Machines in the shoot namespace of the seed, Nodes in the shoot). One installation of the product serves
both: the seed chart rendered with gardenlet's values, its ServiceAccounts and RBAC applied, its webhook and
extension processes run with the rendered arguments as those ServiceAccounts. The test plays gardenlet (namespace
labels, `Cluster`, generic token kubeconfig, `Extension` with operation and timestamp annotations) and judges
readiness as gardenlet's CheckExtensionObject does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener import extension as contract
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import (
    MCM_SERVICE_ACCOUNT,
    Shoot,
    annotate_node,
    annotations_of,
    condition,
    installation,
    machine,
    new_shoot,
    node,
    preserved,
    preserved_for,
    read_extension,
    ready,
    served,
    tainted,
)
from machine_preservation.localcluster.mcm_pool import POOL_LABEL, create_pool, wait_for_pool
from machine_preservation.localcluster.toolchain import Toolchain
from tests.e2e.gardener_harness import machine_writes
from tests.polling import eventually_async

POOL = "worker1"
# Shoot a's second pool: MCM v0.61.3 marks one machine of a MachineDeployment Failed at a time, and a preserved
# Failed machine counts (docs/development.md), so a second failure while one is kept needs another pool.
SECOND_POOL = "worker2"
PROVIDER_CONFIG = {
    "apiVersion": "machine-preservation.extensions.gardener.cloud/v1alpha1",
    "kind": "PreservationConfig",
    "workers": [{"name": POOL, "machinePreserveTimeout": "1h"}],
}


async def test_one_installation_serves_two_shoots(
    mcm_plane: ControlPlane, seed: client.ApiClient, toolchain: Toolchain, tmp_path: Path
) -> None:
    async with (
        installation(mcm_plane, seed, toolchain, tmp_path / "installation") as installed,
        # Shoot a: the pool's timeout in the extension's providerConfig (Gardener ≤ v1.146 has no Shoot field).
        new_shoot(
            mcm_plane,
            seed,
            tmp_path / "a",
            workers=[gardener.worker(POOL, maximum=3), gardener.worker(SECOND_POOL, maximum=2)],
            provider_config=PROVIDER_CONFIG,
        ) as a,
        # Shoot b: the pool's timeout in the Shoot's own worker fields (Gardener ≥ v1.147).
        new_shoot(
            mcm_plane, seed, tmp_path / "b", workers=[gardener.worker(POOL, maximum=3, machine_preserve_timeout="2h")]
        ) as b,
    ):
        try:
            await _scenario(mcm_plane, seed, a, b, metrics_port=installed.metrics_port)
        except BaseException:
            print(installed.log_tail())
            for shoot in (a, b):
                print(f"MCM of {shoot.namespace}:\n{shoot.mcm.log_tail(40)}")
            raise


async def _scenario(plane: ControlPlane, seed: client.ApiClient, a: Shoot, b: Shoot, *, metrics_port: int) -> None:
    # Enable: gardenlet creates the Extensions; both are ready within 30 s, the shoots served.
    started = time.monotonic()
    await gardener.apply_extension(seed, a.namespace, provider_config=PROVIDER_CONFIG)
    await gardener.apply_extension(seed, b.namespace)
    for shoot in (a, b):
        await ready(seed, shoot.namespace, limit=30)
    print(f"both Extensions ready {time.monotonic() - started:.1f} s after they were created")

    for shoot in (a, b):
        await eventually_async(lambda s=shoot: served(seed, s.namespace), limit=30)  # type: ignore[misc]

    # A pool of two in each shoot and one more in shoot a, nodes in the shoot's own API server.
    for shoot, pool, replicas in ((a, POOL, 2), (b, POOL, 2), (a, SECOND_POOL, 1)):
        await create_pool(
            seed,
            shoot.namespace,
            pool,
            replicas=replicas,
            machine_deployment_labels={POOL_LABEL: pool},
            node_labels={POOL_LABEL: pool},
        )
    pools = {shoot.namespace: await wait_for_pool(seed, shoot.namespace, POOL, 2, target=shoot.api) for shoot in (a, b)}
    names = {namespace: sorted(m["metadata"]["name"] for m in machines) for namespace, machines in pools.items()}
    [other] = await wait_for_pool(seed, a.namespace, SECOND_POOL, 1, target=a.api)

    # The node webhooks are active in both shoots: a bad value is denied by the shoot's own API server.
    for shoot in (a, b):
        with pytest.raises(ApiException) as denied:
            await annotate_node(shoot, names[shoot.namespace][0], "sometimes")
        assert denied.value.status in (400, 403, 422)
        assert "when-failed" in (denied.value.body or "")

    # A `when-failed` failure in each shoot at once: both preserved, each with its pool's timeout.
    victims = {shoot.namespace: names[shoot.namespace][0] for shoot in (a, b)}
    for shoot in (a, b):
        await annotate_node(shoot, victims[shoot.namespace], "when-failed")
    for shoot in (a, b):
        await shoot.kubelets.set_ready(victims[shoot.namespace], False)
    records = {}
    for shoot in (a, b):
        records[shoot.namespace] = await eventually_async(
            lambda s=shoot: preserved(seed, s, victims[s.namespace]),  # type: ignore[misc]
            limit=60,
            interval=0.2,
        )
    assert preserved_for(records[a.namespace]) == dt.timedelta(hours=1)  # providerConfig
    assert preserved_for(records[b.namespace]) == dt.timedelta(hours=2)  # the Shoot's worker fields
    # An operator sees each shoot's preserved machines on the extension's /metrics.
    scraped = await eventually_async(lambda: _preserved_gauges(metrics_port), limit=30)
    for shoot in (a, b):
        assert f'namespace="{shoot.namespace}",phase="Failed",reason="manual"}} 1.0' in scraped

    # A `now`-preserved healthy machine of shoot b outlives its Node, deleted in the shoot: MCM's delete is denied
    # by the seed's webhook, the controller notes the Node gone and stops writing to it.
    kept = names[b.namespace][1]
    await annotate_node(b, kept, "now")

    async def preserved_now() -> dict[str, str] | None:
        record = annotations_of(await machine(seed, b.namespace, kept))
        return record if v.PRESERVED_UNTIL_ANNOTATION in record else None

    now_record = await eventually_async(preserved_now, limit=30, interval=0.2)
    await client.CoreV1Api(b.api).delete_node(kept)

    async def node_gone() -> dict[str, str] | None:
        record = annotations_of(await machine(seed, b.namespace, kept))
        return record if v.PRESERVED_NODE_GONE_SINCE_ANNOTATION in record else None

    gone_record = await eventually_async(node_gone, limit=30, interval=0.2)
    assert gone_record[v.PRESERVED_UNTIL_ANNOTATION] == now_record[v.PRESERVED_UNTIL_ANNOTATION]

    # MCM's delete is denied, and so is its next try (it requeues the deleting Node): the machine stays.
    mcm_of_b = f"system:serviceaccount:{b.namespace}:{MCM_SERVICE_ACCOUNT}"

    def denials() -> int:
        """MCM's deletes of the kept machine the seed's webhook denied, from the seed's audit log."""
        writes = machine_writes(plane, user=mcm_of_b, namespace=b.namespace)
        return len([w for w in writes if w.verb == "delete" and w.name == kept and w.code == 403])

    await eventually_async(lambda: denials() >= 2, limit=60)
    found = await machine(seed, b.namespace, kept)
    assert found is not None
    assert not found["metadata"].get("deletionTimestamp")

    # Shoot b's API server goes away: shoot a is served on time all the same, b's Extension says so.
    await asyncio.to_thread(b.mcm.stop)
    await asyncio.to_thread(b.grm.stop)
    await asyncio.to_thread(b.plane.stop)
    second = other["metadata"]["name"]
    await annotate_node(a, second, "when-failed")
    failed_at = time.monotonic()
    await a.kubelets.set_ready(second, False)
    try:
        await eventually_async(lambda: preserved(seed, a, second), limit=60, interval=0.2)
    except AssertionError:
        found = await machine(seed, a.namespace, second)
        print("machine:", json.dumps((found or {}).get("status"), indent=1), annotations_of(found))
        print("node:", json.dumps(await node(a, second), indent=1))
        raise
    print(f"shoot a's second machine preserved {time.monotonic() - failed_at:.1f} s after its node failed")

    # Shoot b's API server is gone: gardenlet's APIServerAvailable says so; ours waits (Progressing, the problem in
    # its message) and the extension tells it with a Warning Event on the Extension, never a condition False.
    async def unserved() -> dict[str, Any]:
        found = condition(await read_extension(seed, b.namespace), contract.CONTROL_PLANE_HEALTHY)
        return found if found.get("status") == "Progressing" else {}

    reported = await eventually_async(unserved, limit=60)
    assert reported["reason"] == "HealthCheckProgressing"
    print(f"shoot b reported: {reported.get('message')}")

    async def warned() -> list[str]:
        listed = await client.CoreV1Api(seed).list_namespaced_event(b.namespace)
        return [
            str(e.message)
            for e in listed.items
            if e.reason == "ShootNotServed" and e.involved_object.kind == "Extension" and e.type == "Warning"
        ]

    print(f"shoot b's Event: {(await eventually_async(warned, limit=30))[0]}")

    # Disable shoot a: every preservation ends (records, taints), the Extension and the shoot's objects go.
    await gardener.delete_extension(seed, a.namespace)

    async def released() -> bool:
        for name in (victims[a.namespace], second):
            found = await machine(seed, a.namespace, name)
            if found is not None and v.PRESERVED_UNTIL_ANNOTATION in annotations_of(found):
                return False
            if tainted(await node(a, name)):
                return False
        return await read_extension(seed, a.namespace) is None

    await eventually_async(released, limit=60, interval=0.2)

    # Released Failed machines are MCM's again: it replaces them (the seed's deletion guard lets it).
    async def replaced() -> bool:
        return all([await machine(seed, a.namespace, name) is None for name in (victims[a.namespace], second)])

    await eventually_async(replaced, limit=90, interval=0.5)
    webhooks = await client.AdmissionregistrationV1Api(a.api).list_validating_webhook_configuration()
    assert not [w for w in webhooks.items if w.metadata and w.metadata.name == "machine-preservation"]


async def _preserved_gauges(port: int) -> str:
    """The extension's preserved-machine gauges, once every shoot's runtime reports one."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    lines = [line for line in text.splitlines() if line.startswith("machine_preservation_preserved_machines{")]
    return "\n".join(lines) if len(lines) >= 2 else ""
