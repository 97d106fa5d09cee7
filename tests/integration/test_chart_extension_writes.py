"""What the seed chart lets the extension's ServiceAccount write, decided by a real kube-apiserver: its RBAC and its
ValidatingAdmissionPolicy as rendered. In a shoot namespace the extension writes its shoot-access Secret (a token
for its own ServiceAccount in the shoot, nobody else's), its ManagedResource without class and that one's data
Secrets, and nothing else; it never lists or watches Secrets. Requests are sent with a token of the ServiceAccount,
as the running extension sends them."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.core.gardener import shoot_resources
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from tests.polling import eventually

RESOURCES = ("resources.gardener.cloud", "v1alpha1")


@dataclass(frozen=True)
class Setup:
    core: client.CoreV1Api  # as the extension
    custom: client.CustomObjectsApi  # as the extension
    admin: client.CoreV1Api
    shoot: str  # a shoot namespace
    other: str  # a namespace that is no shoot's


@pytest.fixture
async def setup(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    tmp_path: Path,
) -> AsyncIterator[Setup]:
    await asyncio.to_thread(gardener.install_seed_crds, control_plane.kubeconfig, operator=False)
    tag = uuid.uuid4().hex[:6]
    namespace = f"extension-mp-{tag}"
    documents = await asyncio.to_thread(
        seed_install.render,
        toolchain.helm,
        namespace=namespace,
        values=seed_install.gardenlet_values(),
        directory=tmp_path / "chart",
        release=f"mp-{tag}",
    )
    admin = client.CoreV1Api(kube_client)
    shoot, other = f"shoot--w--{tag}", f"garden-w-{tag}"
    admin.create_namespace({"metadata": {"name": shoot, "labels": {"gardener.cloud/role": "shoot"}}})
    admin.create_namespace({"metadata": {"name": other}})
    account = seed_install.service_account_of(documents, seed_install.EXTENSION_DEPLOYMENT)
    async with await new_api_client(kubeconfig=control_plane.kubeconfig) as api:
        await processes.apply_manifests(api, seed_install.identities(documents))
        # A token of the ServiceAccount (TokenRequest), as the extension's pod has it.
        kubeconfig = await seed_install.service_account_kubeconfig(
            api, control_plane, namespace=namespace, name=account, path=tmp_path / "extension.kubeconfig"
        )
    extension: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield Setup(
            core=client.CoreV1Api(extension),
            custom=client.CustomObjectsApi(extension),
            admin=admin,
            shoot=shoot,
            other=other,
        )
    finally:
        extension.close()
        async with await new_api_client(kubeconfig=control_plane.kubeconfig) as api:
            await processes.delete_manifests(api, seed_install.identities(documents))
        for name in (shoot, other, namespace):
            admin.delete_namespace(name)


def status_of(call: Callable[[], Any]) -> int:
    """The HTTP status a write gets: 201/200 when done."""
    try:
        call()
    except ApiException as error:
        return int(error.status)
    return 200


def secret(namespace: str, name: str, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}}


async def test_the_extension_writes_only_its_own_objects_in_shoot_namespaces(setup: Setup) -> None:
    core, custom, shoot, other = setup.core, setup.custom, setup.shoot, setup.other

    # Another Secret in a shoot namespace: RBAC lets the create through (it cannot name it), the policy does not.
    # The API server loads a new policy within a few seconds.
    def refused() -> bool:
        return status_of(lambda: core.create_namespaced_secret(shoot, secret(shoot, "etcd-backup"))) == 403

    await asyncio.to_thread(eventually, refused, limit=30)

    # Its own objects, as the extension builds them.
    access = shoot_resources.shoot_access_secret(shoot)
    assert status_of(lambda: core.create_namespaced_secret(shoot, access)) == 200
    data, managed = shoot_resources.managed_resource(shoot, [])
    assert status_of(lambda: core.create_namespaced_secret(shoot, data)) == 200
    create_managed = custom.create_namespaced_custom_object
    assert status_of(lambda: create_managed(*RESOURCES, shoot, "managedresources", managed)) == 200
    patch = {"metadata": {"labels": {"x": "y"}}}
    assert status_of(lambda: core.patch_namespaced_secret(access["metadata"]["name"], shoot, patch)) == 200

    # The same names outside a shoot namespace.
    for body in (shoot_resources.shoot_access_secret(other), shoot_resources.managed_resource(other, [])[0]):
        assert status_of(lambda b=body: core.create_namespaced_secret(other, b)) == 403  # type: ignore[misc]

    # A shoot-access Secret asking the shoot's gardener-resource-manager for another ServiceAccount's token.
    setup.admin.delete_namespaced_secret(access["metadata"]["name"], shoot)
    stolen = copy.deepcopy(access)
    stolen["metadata"]["annotations"][shoot_resources.SERVICE_ACCOUNT_NAME_ANNOTATION] = "generic-garbage-collector"
    assert status_of(lambda: core.create_namespaced_secret(shoot, stolen)) == 403

    # A ManagedResource with class (the seed's gardener-resource-manager would apply it in the seed), under another
    # name, or referring to Secrets that are not its own.
    delete_managed = custom.delete_namespaced_custom_object
    assert status_of(lambda: delete_managed(*RESOURCES, shoot, "managedresources", managed["metadata"]["name"])) == 200
    seeded = copy.deepcopy(managed)
    seeded["spec"]["class"] = "seed"
    renamed = copy.deepcopy(managed)
    renamed["metadata"]["name"] = "istio"
    foreign = copy.deepcopy(managed)
    foreign["spec"]["secretRefs"] = [{"name": "kube-apiserver-etcd-encryption-key"}]
    for body in (seeded, renamed, foreign):
        assert status_of(lambda b=body: create_managed(*RESOURCES, shoot, "managedresources", b)) == 403  # type: ignore[misc]
    assert status_of(lambda: create_managed(*RESOURCES, shoot, "managedresources", managed)) == 200

    # Deletes: its data Secret, not someone else's (RBAC cannot name a hashed name; the policy does).
    setup.admin.create_namespaced_secret(shoot, secret(shoot, "ca-etcd-5e8d1"))
    assert status_of(lambda: core.delete_namespaced_secret("ca-etcd-5e8d1", shoot)) == 403
    assert status_of(lambda: core.delete_namespaced_secret(data["metadata"]["name"], shoot)) == 200
    # And no changes to Secrets but its shoot-access Secret, no Secret enumeration at all.
    assert status_of(lambda: core.patch_namespaced_secret("ca-etcd-5e8d1", shoot, patch)) == 403
    assert status_of(lambda: core.list_namespaced_secret(shoot)) == 403
    assert status_of(lambda: core.list_secret_for_all_namespaces()) == 403
