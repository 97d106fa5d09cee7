"""Pool settings on the real control plane. MCM v0.61 copies neither `machinePreserveTimeout` nor
`autoPreserveFailedMachineMax` to MachineSets and Machines, so the controller finds them through the
MachineSet's MachineDeployment, labelled with its Gardener worker pool, in the Shoot that Gardener's `Cluster`
resource (cluster-scoped, named after the control namespace) carries: the pool's timeout sets each expiry, its
max the MachineSet's auto-preservation budget, and a change of the Shoot takes effect at once. On Gardener
versions without those Shoot fields, the same comes from the Shoot's extension providerConfig."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as sync_client
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    WORKER_POOL_LABEL,
)
from machine_preservation.core.gardener.provider_config import API_VERSION, EXTENSION_TYPE, KIND
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.crds import apply_crd
from machine_preservation.localcluster.mcm import gardener_cluster_crd
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_custom,
    create_machine,
    machines_of,
    new_node,
    owner_reference,
)
from tests.polling import eventually_async

P = v.PRESERVE_ANNOTATION
POOL = "pool-a"
CLUSTER_CRD = f"{CLUSTER_PLURAL}.{CLUSTER_API_GROUP}"


@pytest.fixture
def cluster_crd(kube_client: sync_client.ApiClient) -> Iterator[None]:
    """Gardener's own `Cluster` CRD (from its Go module), installed for the test where it is not yet; the
    controller watches Clusters only where the CRD exists when it starts."""
    extensions = sync_client.ApiextensionsV1Api(kube_client)
    installed_here = False
    for _ in range(300):
        try:
            found = extensions.read_custom_resource_definition(CLUSTER_CRD)
        except sync_client.exceptions.ApiException as error:
            if error.status != 404:
                raise
            manifest = yaml.safe_load(gardener_cluster_crd().read_text())
            apply_crd(extensions, manifest)
            installed_here = True
            break
        if found.metadata is None or found.metadata.deletion_timestamp is None:
            break
        time.sleep(0.1)  # a test before deleted the CRD it installed: wait until it is gone, then install it again
    _wait_until_served(kube_client)
    yield
    if installed_here:
        extensions.delete_custom_resource_definition(CLUSTER_CRD)


def _wait_until_served(kube_client: sync_client.ApiClient) -> None:
    """Established, and its storage ready (lists answer 429 while it starts)."""
    custom = sync_client.CustomObjectsApi(kube_client)
    for _ in range(300):
        try:
            custom.list_cluster_custom_object(CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL)
            return
        except sync_client.exceptions.ApiException as error:
            if error.status not in (404, 429, 503):
                raise
        time.sleep(0.1)
    raise AssertionError(f"{CLUSTER_CRD} not served")


def shoot(*, timeout: str, maximum: int) -> dict[str, Any]:
    """A Shoot whose pool POOL sets both preservation fields (and an unrelated pool that sets others)."""
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": {"name": "shoot", "namespace": "garden-project"},
        "spec": {
            "provider": {
                "type": "local",
                "workers": [
                    {
                        "name": "other",
                        "zones": ["z1"],
                        "machineControllerManager": {"machinePreserveTimeout": "1m", "autoPreserveFailedMachineMax": 9},
                    },
                    {
                        "name": POOL,
                        "zones": ["z1"],
                        "machineControllerManager": {
                            "machinePreserveTimeout": timeout,
                            "autoPreserveFailedMachineMax": maximum,
                        },
                    },
                ],
            }
        },
    }


def shoot_with_provider_config(*, timeout: str, maximum: int) -> dict[str, Any]:
    """A Shoot of a Gardener without the preservation fields: POOL's settings are only in the extension's
    providerConfig (second among the extensions; its first entry is the other pool's)."""
    document = shoot(timeout=timeout, maximum=maximum)
    workers = document["spec"]["provider"]["workers"]
    del workers[1]["machineControllerManager"]
    config = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "workers": [
            {"name": "other", "machinePreserveTimeout": "1m"},
            {"name": POOL, "machinePreserveTimeout": timeout, "autoPreserveFailedMachineMax": maximum},
        ],
    }
    document["spec"]["extensions"] = [{"type": "shoot-dns-service"}, {"type": EXTENSION_TYPE, "providerConfig": config}]
    return document


@contextlib.asynccontextmanager
async def _cluster_of(api: client.ApiClient, namespace: str, shoot_object: dict[str, Any]) -> AsyncIterator[str]:
    body = {
        "apiVersion": f"{CLUSTER_API_GROUP}/{CLUSTER_API_VERSION}",
        "kind": "Cluster",
        "metadata": {"name": namespace},
        "spec": {"cloudProfile": {}, "seed": {}, "shoot": shoot_object},
    }
    custom = client.CustomObjectsApi(api)
    await custom.create_cluster_custom_object(CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, body)
    try:
        yield namespace
    finally:
        with contextlib.suppress(ApiException):
            await custom.delete_cluster_custom_object(CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, namespace)


@pytest.fixture
async def cluster(api: client.ApiClient, namespace: str, cluster_crd: None) -> AsyncIterator[str]:
    """The namespace's Cluster, its Shoot's pool with 45m and a max of 1; deleted afterwards."""
    async with _cluster_of(api, namespace, shoot(timeout="45m", maximum=1)) as name:
        yield name


@pytest.fixture
async def cluster_with_provider_config(api: client.ApiClient, namespace: str, cluster_crd: None) -> AsyncIterator[str]:
    """The namespace's Cluster, 45m and a max of 1 for its Shoot's pool in the providerConfig; deleted afterwards."""
    async with _cluster_of(api, namespace, shoot_with_provider_config(timeout="45m", maximum=1)) as name:
        yield name


async def preserved_for(api: client.ApiClient, namespace: str) -> dict[str, dt.timedelta]:
    """Each preserved machine's time granted (until - since), from its record."""
    machines = await machines_of(api, namespace)
    return {
        name: m.preservation.until - m.preservation.since for name, m in machines.items() if m.preservation is not None
    }


async def _pool_machine_set(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """A MachineDeployment labelled with POOL and its MachineSet, neither carrying a setting (as under MCM
    v0.61)."""
    custom = client.CustomObjectsApi(api)
    deployment = await create_custom(api, namespace, "MachineDeployment", "md", spec={"replicas": 4})
    await custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machinedeployments",
        "md",
        {"metadata": {"labels": {WORKER_POOL_LABEL: POOL}}},
        _content_type="application/merge-patch+json",
    )
    return await create_custom(
        api, namespace, "MachineSet", "ms", spec={"replicas": 4}, owner=owner_reference("MachineDeployment", deployment)
    )


async def test_the_pool_in_the_shoot_sets_the_timeout_and_the_auto_preservation_budget(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str], cluster: str
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = owner_reference("MachineSet", await _pool_machine_set(api, namespace))
    for name in ("failed-a", "failed-b", "failed-c"):
        node = await new_node(api, node_names, ready=False)
        await create_machine(custom, namespace, name, node=node, phase="Failed", owner=owner)
    manual_node = await new_node(api, node_names, ready=True)
    await create_machine(custom, namespace, "manual", node=manual_node, owner=owner, annotations={P: "now"})
    pool_timeout = dt.timedelta(minutes=45)

    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5) as r:
        caches = r.controller.caches
        assert caches is not None
        assert caches.clusters is not None, "the Cluster CRD is installed: the controller watches the namespace's"

        async def one_auto_and_the_manual() -> dict[str, dt.timedelta]:
            granted = await preserved_for(api, namespace)
            return granted if len(granted) == 2 and "manual" in granted else {}

        granted = await eventually_async(one_auto_and_the_manual)
        assert set(granted.values()) == {pool_timeout}, "the pool's 45m, not the flag's 72h"
        await _stays(lambda: preserved_for(api, namespace), granted, r.controller)
        machines = await machines_of(api, namespace)
        auto = [n for n, m in machines.items() if m.metadata.annotations.get(P) == "auto-preserve"]
        assert len(auto) == 1, "the pool's max is 1"
        await eventually_async(lambda: _machine_set_count(custom, namespace, 1))

        # The Shoot's pool allows 3 now (and shortens the timeout, for preservations that start from now on).
        await _set_shoot(custom, cluster, shoot(timeout="20m", maximum=3))

        async def all_auto_preserved() -> dict[str, dt.timedelta]:
            granted = await preserved_for(api, namespace)
            return granted if len(granted) == 4 else {}

        granted = await eventually_async(all_auto_preserved)
        await eventually_async(lambda: _machine_set_count(custom, namespace, 3))
    assert granted["manual"] == pool_timeout, "a running preservation keeps its expiry"
    assert granted[auto[0]] == pool_timeout
    assert sorted(t for n, t in granted.items() if n not in ("manual", auto[0])) == [dt.timedelta(minutes=20)] * 2


async def _stays(read: Any, expected: Any, controller: Any, resyncs: int = 3) -> None:
    """`read()` still returns `expected` after `resyncs` more resyncs of every machine."""
    caches = controller.caches
    target = caches.machines.stats.resyncs + resyncs
    await eventually_async(lambda: caches.machines.stats.resyncs >= target)
    assert await read() == expected


async def _set_shoot(custom: client.CustomObjectsApi, cluster: str, shoot: dict[str, Any]) -> None:
    """What gardenlet does when the Shoot changes: the Cluster's copy of it is replaced."""
    await custom.patch_cluster_custom_object(
        CLUSTER_API_GROUP,
        CLUSTER_API_VERSION,
        CLUSTER_PLURAL,
        cluster,
        {"spec": {"shoot": shoot}},
        _content_type="application/merge-patch+json",
    )


async def _machine_set_count(custom: client.CustomObjectsApi, namespace: str, expected: int) -> bool:
    current = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    return bool((current.get("status") or {}).get("autoPreserveFailedMachineCount") == expected)


async def test_the_extension_provider_config_sets_the_pool_where_the_shoot_fields_are_absent(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    node_names: list[str],
    cluster_with_provider_config: str,
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = owner_reference("MachineSet", await _pool_machine_set(api, namespace))
    for name in ("failed-a", "failed-b"):
        node = await new_node(api, node_names, ready=False)
        await create_machine(custom, namespace, name, node=node, phase="Failed", owner=owner)

    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5) as r:

        async def preserved(count: int) -> dict[str, dt.timedelta]:
            granted = await preserved_for(api, namespace)
            return granted if len(granted) == count else {}

        granted = await eventually_async(lambda: preserved(1))
        assert list(granted.values()) == [dt.timedelta(minutes=45)], "the providerConfig's 45m, not the flag's 72h"
        await _stays(lambda: preserved_for(api, namespace), granted, r.controller)
        await eventually_async(lambda: _machine_set_count(custom, namespace, 1))

        # The owner raises the pool's max in the providerConfig: the second failed machine is kept too.
        await _set_shoot(custom, cluster_with_provider_config, shoot_with_provider_config(timeout="20m", maximum=2))
        granted = await eventually_async(lambda: preserved(2))
        await eventually_async(lambda: _machine_set_count(custom, namespace, 2))
    assert sorted(granted.values()) == [dt.timedelta(minutes=20), dt.timedelta(minutes=45)]
