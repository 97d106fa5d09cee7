"""The real gardener-resource-manager (GRM) of one shoot, on real API servers: the seed (the session's control
plane, with Gardener's seed CRDs) and a shoot kube-apiserver on the seed's etcd, as `localcluster.gardener` and
`localcluster.grm` run them for the extension's tests and the playground.

What the extension relies on: a ManagedResource's objects appear in the shoot and are reported applied; a
shoot-access Secret gets a token of the named service account in the shoot (and only there); deleting the
ManagedResource deletes its objects.
"""

from __future__ import annotations

import base64
import datetime
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as sync_client
from kubernetes import config as sync_config
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.gardener.shoot_access import in_seed_server
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.grm import GrmRunner
from tests.polling import eventually_async

SA_NAME, SA_NAMESPACE = "machine-preservation", "kube-system"
SA_USERNAME = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"


@dataclass
class Shoot:
    namespace: str
    plane: ControlPlane
    grm: GrmRunner


@pytest.fixture(scope="module")
def shoot(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shoot]:
    """One shoot: its namespace in the seed, its own kube-apiserver and its real GRM."""
    gardener.install_seed_crds(control_plane.kubeconfig)
    namespace = gardener.shoot_namespace_name("grm", uuid.uuid4().hex[:6])
    api_client = sync_config.new_client_from_config(config_file=str(control_plane.kubeconfig))  # type: ignore[no-untyped-call]
    with api_client:
        core = sync_client.CoreV1Api(api_client)
        core.create_namespace(sync_client.V1Namespace.model_validate(gardener.shoot_namespace_manifest(namespace)))
        directory = tmp_path_factory.mktemp("shoot")
        plane = gardener.start_shoot_control_plane(
            control_plane, directory / "plane", name=namespace, namespaces=[namespace]
        )
        grm = GrmRunner(seed=control_plane, shoot=plane, namespace=namespace, directory=directory / "grm")
        try:
            grm.start()
            yield Shoot(namespace=namespace, plane=plane, grm=grm)
        finally:
            grm.stop()
            plane.stop()
            core.delete_namespace(namespace)


@pytest.fixture
async def shoot_api(shoot: Shoot) -> AsyncIterator[client.ApiClient]:
    """An aio client with the shoot API server's admin identity."""
    api_client = await new_api_client(kubeconfig=shoot.plane.kubeconfig)
    yield api_client
    await api_client.close()


def _managed_resource(namespace: str, name: str, objects: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """A ManagedResource for the shoot (no class) and its data Secret."""
    secret = {
        "metadata": {"name": f"managedresource-{name}", "namespace": namespace},
        "data": {"objects.yaml": base64.b64encode(yaml.safe_dump_all(objects).encode()).decode()},
    }
    resource = {
        "apiVersion": f"{gardener.RESOURCES_GROUP}/{gardener.RESOURCES_VERSION}",
        "kind": "ManagedResource",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"secretRefs": [{"name": secret["metadata"]["name"]}], "keepObjects": False},
    }
    return resource, secret


async def _conditions(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, str]:
    resource = await objects.get_namespaced_custom_object(
        gardener.RESOURCES_GROUP, gardener.RESOURCES_VERSION, namespace, "managedresources", name
    )
    assert isinstance(resource, dict)
    return {c["type"]: c["status"] for c in resource.get("status", {}).get("conditions", [])}


async def _cluster_role(rbac: client.RbacAuthorizationV1Api, name: str) -> client.V1ClusterRole | None:
    try:
        return await rbac.read_cluster_role(name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def test_managed_resource_applies_to_the_shoot_and_its_deletion_removes_the_objects(
    shoot: Shoot, api: client.ApiClient, shoot_api: client.ApiClient
) -> None:
    role_name = f"mp-test-{uuid.uuid4().hex[:6]}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role_name},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
    }
    resource, secret = _managed_resource(shoot.namespace, "extension-test-shoot", [role])
    objects = client.CustomObjectsApi(api)
    await client.CoreV1Api(api).create_namespaced_secret(shoot.namespace, client.V1Secret.model_validate(secret))
    await objects.create_namespaced_custom_object(
        gardener.RESOURCES_GROUP, gardener.RESOURCES_VERSION, shoot.namespace, "managedresources", resource
    )
    rbac = client.RbacAuthorizationV1Api(shoot_api)

    applied = await eventually_async(lambda: _cluster_role(rbac, role_name), limit=20)
    assert applied.rules is not None
    assert applied.rules[0].resources == ["nodes"]
    assert (applied.metadata.labels or {}).get("resources.gardener.cloud/managed-by") == "gardener"  # type: ignore[union-attr]

    async def applied_condition() -> bool:
        return (await _conditions(objects, shoot.namespace, resource["metadata"]["name"])).get(
            "ResourcesApplied"
        ) == "True"

    await eventually_async(applied_condition, limit=20)

    await objects.delete_namespaced_custom_object(
        gardener.RESOURCES_GROUP,
        gardener.RESOURCES_VERSION,
        shoot.namespace,
        "managedresources",
        resource["metadata"]["name"],
    )

    async def removed() -> bool:
        return await _cluster_role(rbac, role_name) is None

    await eventually_async(removed, limit=20)


async def test_shoot_access_secret_gets_a_token_for_the_service_account_in_the_shoot(
    shoot: Shoot, api: client.ApiClient, tmp_path: Path
) -> None:
    name = f"shoot-access-{SA_NAME}-{uuid.uuid4().hex[:4]}"
    secret = _access_secret(shoot.namespace, name)
    core = client.CoreV1Api(api)
    await core.create_namespaced_secret(shoot.namespace, client.V1Secret.model_validate(secret))

    async def token() -> str | None:
        data = (await core.read_namespaced_secret(name, shoot.namespace)).data or {}
        return base64.b64decode(data["token"]).decode() if "token" in data else None

    issued = await eventually_async(token, limit=20)

    async def who(plane: ControlPlane) -> str | int:
        kubeconfig = _token_kubeconfig(tmp_path / "token.kubeconfig", plane, issued)
        api_client = await new_api_client(kubeconfig=kubeconfig)
        try:
            review = await client.AuthenticationV1Api(api_client).create_self_subject_review(
                client.V1SelfSubjectReview.model_validate({})
            )
        except ApiException as error:
            return error.status
        finally:
            await api_client.close()
        return str(review.status.user_info.username)  # type: ignore[union-attr]

    assert await who(shoot.plane) == SA_USERNAME
    # The token is the shoot's: the seed does not accept it.
    assert await who(shoot.grm.seed) == 401


def _token_kubeconfig(path: Path, plane: ControlPlane, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": plane.server,
                    "certificate-authority-data": base64.b64encode(plane.ca.cert_pem).decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def test_gardenlet_stand_in_writes_what_an_extension_reads(
    shoot: Shoot, api: client.ApiClient, tmp_path: Path
) -> None:
    """Cluster with the Shoot and the generic token kubeconfig's name, the kubeconfig (with a shoot-access token it
    reaches the shoot), the Extension with gardenlet's annotations, judged as gardenlet does."""
    ns = shoot.namespace
    await gardener.apply_cluster(
        api,
        gardener.cluster_manifest(
            ns,
            shoot=gardener.shoot_manifest(ns, workers=[gardener.worker("pool-a", auto_preserve_failed_machine_max=1)]),
        ),
    )
    secret_name = await gardener.publish_generic_token_kubeconfig(api, ns, shoot.plane)
    objects = client.CustomObjectsApi(api)
    cluster = await objects.get_cluster_custom_object(
        gardener.EXTENSIONS_GROUP, gardener.EXTENSIONS_VERSION, "clusters", ns
    )
    assert isinstance(cluster, dict)
    assert cluster["metadata"]["annotations"][gardener.GENERIC_KUBECONFIG_ANNOTATION] == secret_name
    assert cluster["spec"]["shoot"]["spec"]["provider"]["workers"][0]["machineControllerManager"] == {
        "autoPreserveFailedMachineMax": 1
    }
    hibernated = gardener.shoot_manifest(ns, hibernated=True)
    cluster = await gardener.update_cluster_shoot(api, ns, hibernated)
    assert cluster["spec"]["shoot"]["spec"]["hibernation"] == {"enabled": True}

    # The generic kubeconfig's CA plus a token of a shoot-access Secret reach the shoot at its Service, as an
    # extension combines them: the kubeconfig's own server is the out-of-cluster address (Istio TLS termination).
    core = client.CoreV1Api(api)
    generic = yaml.safe_load(base64.b64decode((await core.read_namespaced_secret(secret_name, ns)).data["kubeconfig"]))  # type: ignore[index]
    assert generic["users"][0]["user"] == {"tokenFile": gardener.GENERIC_KUBECONFIG_TOKEN_FILE}
    assert (
        generic["clusters"][0]["cluster"]["server"] == f"https://api.{ns.split('--')[2]}.grm.{gardener.INTERNAL_DOMAIN}"
    )
    generic["clusters"][0]["cluster"]["server"] = in_seed_server(ns)
    access = f"shoot-access-{SA_NAME}-{uuid.uuid4().hex[:4]}"
    await core.create_namespaced_secret(ns, client.V1Secret.model_validate(_access_secret(ns, access)))

    async def token() -> str | None:
        data = (await core.read_namespaced_secret(access, ns)).data or {}
        return base64.b64decode(data["token"]).decode() if "token" in data else None

    generic["users"][0]["user"] = {"token": await eventually_async(token, limit=20)}
    (tmp_path / "combined.kubeconfig").write_text(yaml.safe_dump(generic))
    shoot_client = await new_api_client(kubeconfig=tmp_path / "combined.kubeconfig")
    try:
        review = await client.AuthenticationV1Api(shoot_client).create_self_subject_review(
            client.V1SelfSubjectReview.model_validate({})
        )
    finally:
        await shoot_client.close()
    assert review.status.user_info.username == SA_USERNAME  # type: ignore[union-attr]

    created = await gardener.apply_extension(api, ns, provider_config={"kind": "PreservationConfig"})
    assert created["metadata"]["annotations"][gardener.OPERATION_ANNOTATION] == "reconcile"
    assert gardener.extension_ready(created) == "observed generation outdated (0/1)"
    # What the extension controller does: take the annotation away, then report success.
    await objects.patch_namespaced_custom_object(
        gardener.EXTENSIONS_GROUP,
        gardener.EXTENSIONS_VERSION,
        ns,
        "extensions",
        gardener.EXTENSION_TYPE,
        [{"op": "remove", "path": "/metadata/annotations/gardener.cloud~1operation"}],
        _content_type=gardener.JSON_PATCH,
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "observedGeneration": 1,
        "lastOperation": {
            "type": "Create",
            "state": "Succeeded",
            "progress": 100,
            "description": "done",
            "lastUpdateTime": now,
        },
    }
    await objects.patch_namespaced_custom_object_status(
        gardener.EXTENSIONS_GROUP,
        gardener.EXTENSIONS_VERSION,
        ns,
        "extensions",
        gardener.EXTENSION_TYPE,
        {"status": status},
        _content_type="application/merge-patch+json",
    )
    assert gardener.extension_ready(await gardener.read_extension(api, ns)) is None
    requested = await gardener.request_operation(api, ns, "migrate")
    assert gardener.extension_ready(requested) == "gardener operation 'migrate' is not yet picked up by controller"

    await gardener.create_shoot_namespace(api, ns, extension_types=())
    labels = (await core.read_namespace(ns)).metadata.labels  # type: ignore[union-attr]
    assert labels is not None
    assert "extensions.gardener.cloud/machine-preservation" not in labels
    assert labels["gardener.cloud/role"] == "shoot"
    await gardener.delete_extension(api, ns)
    await gardener.create_shoot_namespace(api, ns)


def _access_secret(namespace: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "resources.gardener.cloud/purpose": "token-requestor",
                "resources.gardener.cloud/class": "shoot",
            },
            "annotations": {
                "serviceaccount.resources.gardener.cloud/name": SA_NAME,
                "serviceaccount.resources.gardener.cloud/namespace": SA_NAMESPACE,
            },
        },
        "type": "Opaque",
    }
