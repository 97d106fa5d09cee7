"""The MCM stand-in behaves like the parts of MCM the product relies on (real API server)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as sync_client
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.core.preservation_record import start_record
from machine_preservation.standin.mcm import MCM_USERNAME, McmStandIn, set_node_ready
from tests.controller.support import eventually

GROUP, VERSION = "machine.sapcloud.io", "v1alpha1"
USER = v.PreservedBy.USER


def grant_cluster_admin(kube_client: sync_client.ApiClient, user: str) -> None:
    rbac = sync_client.RbacAuthorizationV1Api(kube_client)
    name = f"test-admin-{user.replace(':', '-')}"
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    try:
        rbac.create_cluster_role_binding(binding)
    except sync_client.exceptions.ApiException as error:
        if error.status != 409:
            raise


@pytest.fixture
async def standin(
    kube_client: sync_client.ApiClient, kubeconfig_for: Callable[[str], Path], namespace: str
) -> AsyncIterator[McmStandIn]:
    grant_cluster_admin(kube_client, MCM_USERNAME)
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig_for(MCM_USERNAME)), client_configuration=configuration)
    api = client.ApiClient(configuration=configuration)
    stand_in = McmStandIn(api=api, namespace=namespace, health_timeout=dt.timedelta(seconds=30))
    # Right after the CRDs are installed their watch caches may still be starting (lists get 429 meanwhile); the
    # stand-in's single passes would fail on that, its loop retries.
    await eventually(lambda: _listable(stand_in))
    try:
        yield stand_in
    finally:
        core = sync_client.CoreV1Api(kube_client)
        for machine in await machines(stand_in):
            core.delete_node(machine["metadata"]["name"])
        await api.close()


async def _listable(stand_in: McmStandIn) -> bool:
    try:
        await machines(stand_in)
    except ApiException as error:
        if error.status != 429:
            raise
        return False
    return True


async def machines(stand_in: McmStandIn) -> list[dict[str, Any]]:
    result = await client.CustomObjectsApi(stand_in.api).list_namespaced_custom_object(
        GROUP, VERSION, stand_in.namespace, "machines"
    )
    return list(result["items"])


def phases(items: list[dict[str, Any]]) -> dict[str, str]:
    return {m["metadata"]["name"]: (m.get("status") or {}).get("currentStatus", {}).get("phase", "") for m in items}


def create_machine_set(kube_client: sync_client.ApiClient, namespace: str, replicas: int) -> None:
    sync_client.CustomObjectsApi(kube_client).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machinesets",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "MachineSet",
            "metadata": {"name": "pool"},
            "spec": {
                "replicas": replicas,
                "template": {"metadata": {"labels": {"pool": "a"}}, "spec": {"machinePreserveTimeout": "1h"}},
            },
        },
    )


async def test_replicas_phases_failure_and_replacement(
    standin: McmStandIn, kube_client: sync_client.ApiClient, namespace: str
) -> None:
    create_machine_set(kube_client, namespace, replicas=2)
    t0 = dt.datetime.now(dt.UTC)
    await standin.sync(now=t0)
    created = await machines(standin)
    assert len(created) == 2
    assert all(m["spec"]["machinePreserveTimeout"] == "1h" and m["metadata"]["labels"]["pool"] == "a" for m in created)

    await standin.sync(now=t0)
    assert set(phases(await machines(standin)).values()) == {"Running"}

    victim = created[0]["metadata"]["name"]
    await set_node_ready(standin.api, name=victim, ready=False)
    await standin.sync(now=t0)
    assert phases(await machines(standin))[victim] == "Unknown"
    await standin.sync(now=t0 + dt.timedelta(seconds=5))
    assert phases(await machines(standin))[victim] == "Unknown", "not Failed before the health timeout"
    await standin.sync(now=t0 + dt.timedelta(minutes=5))
    assert phases(await machines(standin))[victim] == "Failed"

    await standin.sync(now=t0 + dt.timedelta(minutes=5))
    after = phases(await machines(standin))
    assert victim not in after, "an unpreserved Failed machine is deleted"
    assert len(after) == 2, "and replaced"
    assert victim not in {n.metadata.name for n in sync_client.CoreV1Api(kube_client).list_node().items}


async def test_keeps_preserved_failed_machines_and_scales_down_unpreserved_first(
    standin: McmStandIn, kube_client: sync_client.ApiClient, namespace: str
) -> None:
    create_machine_set(kube_client, namespace, replicas=3)
    now = dt.datetime.now(dt.UTC)
    await standin.sync(now=now)
    names = sorted(m["metadata"]["name"] for m in await machines(standin))
    preserved, _lowest_priority, other = names
    custom = sync_client.CustomObjectsApi(kube_client)
    # Preserved for an hour: the controller's record in the Machine's annotations.
    record = start_record(now=now, timeout=dt.timedelta(hours=1), max_timeout=dt.timedelta(hours=1), by=USER)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "machines", preserved, {"metadata": {"annotations": record.annotations()}}
    )
    failed = {"status": {"currentStatus": {"phase": "Failed"}}}
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "machines", preserved, failed)
    higher_priority = {"metadata": {"annotations": {"machinepriority.machine.sapcloud.io": "5"}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "machines", other, higher_priority)
    await set_node_ready(standin.api, name=preserved, ready=False)
    standin.recover_failed = False

    await standin.sync(now=now)
    assert phases(await machines(standin))[preserved] == "Failed", "a preserved Failed machine stays"

    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "pool", {"spec": {"replicas": 2}})
    await standin.sync(now=now)
    assert set(phases(await machines(standin))) == {preserved, other}, "lowest priority, unpreserved goes first"

    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "pool", {"spec": {"replicas": 0}})
    await standin.sync(now=now)
    assert await machines(standin) == [], "replica counts win over preservation"
