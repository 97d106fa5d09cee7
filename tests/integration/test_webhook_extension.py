"""The deletion guard as Gardener's extension, behind the real kube-apiserver with Gardener's Extension CRD: once
the shoot's `Extension` of type machine-preservation is being deleted, gone, or migrated away, MCM may replace a
Failed machine that a leftover preserve annotation would otherwise keep (the controller released the shoot and
left the users' annotations; the namespace label routing MCM's deletes here goes only later).

The webhook runs in-process (as in test_webhook.py) with `gardener_extension=True`, and reads the Extension from
the same API server; MCM's deletes come through the real admission chain.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.certs.authority import generate_ca
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import ShootExtension
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.mcm_detection import ExtensionNamespaces
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.integration.seed_identity import seed_chart_identity
from tests.integration.test_webhook import ServerThread
from tests.polling import eventually
from tests.webhook import configurations as wc

CONTROLLER = "system:serviceaccount:mp-test:controller"
MCM_SERVICE_ACCOUNT = "machine-controller-manager"
GROUP, VERSION = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION
EXT_GROUP, EXT_VERSION, EXTENSIONS = gardener.EXTENSIONS_GROUP, gardener.EXTENSIONS_VERSION, "extensions"
NAME = gardener.EXTENSION_TYPE
HOLD = "machine-preservation.test/hold"


@dataclass
class Seed:
    namespace: str
    admin: client.CustomObjectsApi
    mcm: client.CustomObjectsApi  # the shoot's MCM: its ServiceAccount in the shoot namespace
    server: ServerThread
    identity: Path  # the seed chart's webhook ServiceAccount


@pytest.fixture(scope="module")
def seed(
    control_plane: ControlPlane, kube_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Seed]:
    gardener.install_seed_crds(control_plane.kubeconfig, operator=False)
    token = uuid.uuid4().hex[:8]
    directory = tmp_path_factory.mktemp("webhook-extension")
    ca = generate_ca(common_name="webhook-test-ca", now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=3))
    install(directory, local_serving_pair(ca))
    settings = AdmissionSettings(
        controller_username=CONTROLLER, mcm_usernames=frozenset(), mcm_service_accounts=frozenset({MCM_SERVICE_ACCOUNT})
    )
    # The deletion guard's reads as the seed chart's webhook ServiceAccount, under the chart's RBAC.
    identity = asyncio.run(seed_chart_identity(control_plane, directory, deployment=seed_install.WEBHOOK_DEPLOYMENT))
    thread = ServerThread(
        lambda: WebhookServer(
            host="127.0.0.1",
            port=0,
            cert_dir=directory,
            settings=settings,
            machine_sets=KubernetesMachineSets(kubeconfig=identity, gardener_extension=True),
            cert_poll_interval=1.0,
        )
    )
    server = thread.start()
    # Short: MCM's username is the test client certificate's CN (at most 64 characters).
    namespace = gardener.shoot_namespace_name(token[:4], "s")
    core = client.CoreV1Api(kube_client)
    core.create_namespace(client.V1Namespace.model_validate(gardener.shoot_namespace_manifest(namespace)))
    mcm_user = f"system:serviceaccount:{namespace}:{MCM_SERVICE_ACCOUNT}"
    mcm_config = control_plane.write_kubeconfig(directory / "mcm.kubeconfig", user=mcm_user, groups=("system:masters",))
    mcm_client: client.ApiClient = config.new_client_from_config(config_file=str(mcm_config))  # type: ignore[no-untyped-call]

    client_config = wc.ClientConfig(ca_bundle=ca.cert_pem, url=f"https://127.0.0.1:{server.port}")
    scoped = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    name = f"mp-webhook-extension-test-{token}"
    configuration = wc.validating_configuration(
        name=name,
        webhooks=[
            wc.machine_deletion_webhook(client=client_config, mcm_usernames=[mcm_user], namespace_selector=scoped)
        ],
    )
    registration = client.AdmissionregistrationV1Api(kube_client)
    registration.create_validating_webhook_configuration(
        client.V1ValidatingWebhookConfiguration.model_validate(configuration)
    )
    try:
        yield Seed(
            namespace, client.CustomObjectsApi(kube_client), client.CustomObjectsApi(mcm_client), thread, identity
        )
    finally:
        registration.delete_validating_webhook_configuration(name)
        core.delete_namespace(namespace)
        mcm_client.close()
        thread.stop()


def _extension(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{EXT_GROUP}/{EXT_VERSION}",
        "kind": "Extension",
        # A finalizer of the test's, so that a deleted Extension stays "being deleted" until the test lets it go.
        "metadata": {"name": NAME, "namespace": namespace, "finalizers": [HOLD]},
        "spec": {"type": NAME},
    }


def _last_operation(seed: Seed, kind: str, state: str) -> None:
    operation = {"type": kind, "state": state, "progress": 100, "description": "test"}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    seed.admin.patch_namespaced_custom_object_status(
        EXT_GROUP,
        EXT_VERSION,
        seed.namespace,
        EXTENSIONS,
        NAME,
        {"status": {"lastOperation": {**operation, "lastUpdateTime": stamp}}},
    )


def _failed_machine(seed: Seed, name: str, annotations: dict[str, str]) -> None:
    manifest = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Machine",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
    }
    seed.admin.create_namespaced_custom_object(GROUP, VERSION, seed.namespace, "machines", manifest)
    seed.admin.patch_namespaced_custom_object_status(
        GROUP, VERSION, seed.namespace, "machines", name, {"status": {"currentStatus": {"phase": "Failed"}}}
    )


def _mcm_delete(seed: Seed, name: str, *, dry_run: bool = True) -> str:
    """MCM deletes the machine: "" when allowed, else the API server's answer (a denial: 403)."""
    try:
        seed.mcm.delete_namespaced_custom_object(
            GROUP, VERSION, seed.namespace, "machines", name, dry_run="All" if dry_run else None
        )
    except ApiException as error:
        return f"{error.status} {error.body}"
    return ""


def test_a_leftover_value_keeps_the_machine_until_the_extension_goes(seed: Seed) -> None:
    _failed_machine(seed, "leftover", {v.PRESERVE_ANNOTATION: "when-failed"})
    seed.admin.create_namespaced_custom_object(
        EXT_GROUP, EXT_VERSION, seed.namespace, EXTENSIONS, _extension(seed.namespace)
    )
    _last_operation(seed, "Reconcile", "Succeeded")
    # The API server learns about the configuration through an informer: wait for the first denial.
    eventually(lambda: "about to be preserved" in _mcm_delete(seed, "leftover"))
    denial = _mcm_delete(seed, "leftover")
    assert 'machine \\"leftover\\" is Failed and about to be preserved (preserve value \\"when-failed\\"' in denial

    # Migrated away: another seed runs the shoot now; while the migration runs, it is still ours.
    _last_operation(seed, "Migrate", "Processing")
    assert _mcm_delete(seed, "leftover")
    _last_operation(seed, "Migrate", "Succeeded")
    assert _mcm_delete(seed, "leftover") == ""
    _last_operation(seed, "Restore", "Succeeded")
    assert _mcm_delete(seed, "leftover")

    # Disabled: gardenlet deletes the Extension; while it is being deleted, and once it is gone, MCM may go ahead.
    seed.admin.delete_namespaced_custom_object(EXT_GROUP, EXT_VERSION, seed.namespace, EXTENSIONS, NAME)
    held = seed.admin.get_namespaced_custom_object(EXT_GROUP, EXT_VERSION, seed.namespace, EXTENSIONS, NAME)
    assert held["metadata"]["deletionTimestamp"]
    assert _mcm_delete(seed, "leftover") == ""
    seed.admin.patch_namespaced_custom_object(
        EXT_GROUP, EXT_VERSION, seed.namespace, EXTENSIONS, NAME, {"metadata": {"finalizers": None}}
    )
    eventually(lambda: not _listed(seed))
    assert _mcm_delete(seed, "leftover", dry_run=False) == ""


def _listed(seed: Seed) -> bool:
    return bool(seed.admin.list_namespaced_custom_object(EXT_GROUP, EXT_VERSION, seed.namespace, EXTENSIONS)["items"])


async def test_a_missing_extension_is_absent(seed: Seed) -> None:
    """A namespace without our Extension has the extension disabled ("absent"), as the seed chart's webhook reads
    it; a kind the API server does not serve at all is "unknown" (test_webhook_cached_reads.py)."""
    source = KubernetesMachineSets(kubeconfig=seed.identity, gardener_extension=True)
    try:
        assert await source.read_extension(namespace=f"{seed.namespace}-none") == ShootExtension(present=False)
    finally:
        await source.close()


async def test_the_shoots_with_our_extension_are_listed_as_the_chart_lets_the_webhook(
    control_plane: ControlPlane, kube_client: client.ApiClient, seed: Seed, tmp_path: Path
) -> None:
    """What keys the per-shoot caches: the namespaces holding our Extension, listed as the seed chart's webhook
    ServiceAccount; a name without one (anything a /shoots/<namespace>/ URL says) is not among them."""
    identity = await seed_chart_identity(control_plane, tmp_path, deployment=seed_install.WEBHOOK_DEPLOYMENT)
    namespace = gardener.shoot_namespace_name(uuid.uuid4().hex[:4], "listed")
    core = client.CoreV1Api(kube_client)
    core.create_namespace(client.V1Namespace.model_validate(gardener.shoot_namespace_manifest(namespace)))
    known = ExtensionNamespaces.from_kubeconfig(identity, min_interval=0.0)
    try:
        assert not await known.contains(namespace)
        extension = _extension(namespace)
        del extension["metadata"]["finalizers"]
        seed.admin.create_namespaced_custom_object(EXT_GROUP, EXT_VERSION, namespace, EXTENSIONS, extension)
        other = {**extension, "metadata": {"name": "another-extension", "namespace": f"{namespace}-x"}}
        assert await known.contains(namespace)
        assert not await known.contains(other["metadata"]["namespace"])
        assert known.lists == 3
    finally:
        await known.close()
        core.delete_namespace(namespace)
