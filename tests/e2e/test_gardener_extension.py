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
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.controller.clients import MERGE_PATCH, new_api_client
from machine_preservation.core import extension as contract
from machine_preservation.core import vocabulary as v
from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.grm import GrmRunner
from machine_preservation.localcluster.mcm_pool import POOL_LABEL, FakeKubelets, create_pool, wait_for_pool
from machine_preservation.localcluster.mcm_runner import McmRunner
from machine_preservation.localcluster.toolchain import Toolchain
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
MCM_SERVICE_ACCOUNT = "machine-controller-manager"


@dataclasses.dataclass
class Shoot:
    namespace: str
    plane: ControlPlane
    grm: GrmRunner
    mcm: McmRunner
    api: client.ApiClient  # the shoot's kube-apiserver, as an administrator
    kubelets: FakeKubelets


@dataclasses.dataclass
class Installation:
    """The seed chart's webhook and extension processes, running as the chart's ServiceAccounts."""

    namespace: str
    webhook: subprocess.Popen[bytes]
    extension: subprocess.Popen[bytes]
    logs: Path

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(
            f"--- {name} ---\n{processes.log_tail(self.logs / f'{name}.log', lines)}"
            for name in ("webhook", "extension")
        )


@pytest.fixture
async def seed(mcm_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    await asyncio.to_thread(gardener.install_seed_crds, mcm_plane.kubeconfig, operator=False)
    api = await new_api_client(kubeconfig=mcm_plane.kubeconfig)
    yield api
    await api.close()


@contextlib.asynccontextmanager
async def installation(
    plane: ControlPlane, api: client.ApiClient, toolchain: Toolchain, directory: Path
) -> AsyncIterator[Installation]:
    namespace = f"extension-machine-preservation-{uuid.uuid4().hex[:5]}"
    documents = seed_install.render(
        toolchain.helm, namespace=namespace, values=seed_install.gardenlet_values(), directory=directory
    )
    await processes.apply_manifests(api, seed_install.identities(documents))
    kubeconfigs = {
        component: await seed_install.service_account_kubeconfig(
            api,
            plane,
            namespace=namespace,
            name=seed_install.service_account_of(documents, deployment),
            path=directory / f"{component}.kubeconfig",
        )
        for component, deployment in (
            ("webhook", seed_install.WEBHOOK_DEPLOYMENT),
            ("extension", seed_install.EXTENSION_DEPLOYMENT),
        )
    }
    logs = directory / "logs"
    cert_dir = directory / "webhook-certs"
    cert_dir.mkdir(parents=True)
    port = free_port()
    webhook_args = seed_install.replace_args(
        seed_install.container_args(documents, seed_install.WEBHOOK_DEPLOYMENT),
        {"--host": "127.0.0.1", "--port": str(port), "--cert-dir": str(cert_dir)},
        extra=["--self-signed", "--san=127.0.0.1", f"--kubeconfig={kubeconfigs['webhook']}"],
    )
    webhook = processes.spawn(webhook_args, log_file=logs / "webhook.log")
    extension: subprocess.Popen[bytes] | None = None
    configuration_name = ""
    try:
        await processes.wait_webhook_ready(
            webhook, port=port, cafile=cert_dir / "ca.crt", log_file=logs / "webhook.log"
        )
        ca = (cert_dir / "ca.crt").read_bytes()
        # What the certs manager keeps: the trust bundle in its Secret, the seed webhooks registered with it.
        extension_args = seed_install.container_args(documents, seed_install.EXTENSION_DEPLOYMENT)
        ca_secret = next(a.split("=", 1)[1] for a in extension_args if a.startswith("--ca-secret="))
        await client.CoreV1Api(api).create_namespaced_secret(
            namespace,
            {  # type: ignore[arg-type]
                "metadata": {"name": ca_secret.split("/", 1)[1]},
                "data": {CA_BUNDLE_KEY: base64.b64encode(ca).decode()},
            },
        )
        url = f"https://127.0.0.1:{port}"
        configuration = seed_install.served_by(
            seed_install.seed_webhook_configuration(documents), url=url, ca_bundle=ca
        )
        configuration_name = configuration["metadata"]["name"]
        await processes.apply_manifests(api, [configuration])
        metrics_port = free_port()
        extension = processes.spawn(
            seed_install.replace_args(
                extension_args,
                {
                    "--namespace": namespace,
                    "--webhook-url": url,
                    "--metrics-bind-address": "127.0.0.1",
                    "--metrics-port": str(metrics_port),
                },
                extra=[f"--kubeconfig={kubeconfigs['extension']}"],
            ),
            log_file=logs / "extension.log",
        )
        await processes.wait_controller_ready(extension, metrics_port=metrics_port, log_file=logs / "extension.log")
        yield Installation(namespace=namespace, webhook=webhook, extension=extension, logs=logs)
    finally:
        if extension is not None:
            await processes.stop_process("extension", extension)
        await processes.stop_process("webhook", webhook)
        if configuration_name:
            with contextlib.suppress(ApiException):
                await client.AdmissionregistrationV1Api(api).delete_validating_webhook_configuration(configuration_name)


@contextlib.asynccontextmanager
async def new_shoot(
    plane: ControlPlane,
    api: client.ApiClient,
    directory: Path,
    *,
    workers: list[dict[str, Any]],
    provider_config: dict[str, Any] | None = None,
) -> AsyncIterator[Shoot]:
    """A shoot as gardenlet prepares it, with its API server, its GRM and its MCM (as Gardener runs MCM: its
    ServiceAccount in the shoot namespace towards the seed)."""
    # Short: client certificates carry `system:serviceaccount:<namespace>:machine-controller-manager` (≤ 64).
    namespace = gardener.shoot_namespace_name("t", uuid.uuid4().hex[:4])
    shoot_plane = await asyncio.to_thread(
        gardener.start_shoot_control_plane, plane, directory / "plane", name=namespace.rpartition("--")[2]
    )
    grm = GrmRunner(seed=plane, shoot=shoot_plane, namespace=namespace, directory=directory / "grm")
    mcm = McmRunner(
        plane=plane,
        namespace=namespace,
        directory=directory / "mcm",
        target=shoot_plane,
        control_user=f"system:serviceaccount:{namespace}:{MCM_SERVICE_ACCOUNT}",
    )
    shoot_api = await new_api_client(kubeconfig=shoot_plane.kubeconfig)
    kubelets = FakeKubelets(api, namespace, target=shoot_api)
    try:
        await gardener.create_shoot_namespace(api, namespace)
        # gardenlet copies the whole Shoot into the Cluster, the extension's providerConfig included.
        entry: dict[str, Any] = {"type": gardener.EXTENSION_TYPE}
        if provider_config is not None:
            entry["providerConfig"] = provider_config
        shoot = gardener.shoot_manifest(namespace, workers=workers, extensions=[entry])
        await gardener.apply_cluster(api, gardener.cluster_manifest(namespace, shoot=shoot))
        await gardener.publish_generic_token_kubeconfig(api, namespace, shoot_plane)
        await asyncio.to_thread(grm.start)
        await asyncio.to_thread(mcm.start)
        async with kubelets.running():
            yield Shoot(namespace=namespace, plane=shoot_plane, grm=grm, mcm=mcm, api=shoot_api, kubelets=kubelets)
    finally:
        await asyncio.to_thread(mcm.stop)
        await asyncio.to_thread(grm.stop)
        await shoot_api.close()
        await asyncio.to_thread(shoot_plane.stop)


async def read_extension(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    try:
        return await gardener.read_extension(api, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def ready(api: client.ApiClient, namespace: str, *, limit: float = 30.0) -> dict[str, Any]:
    """Until gardenlet would count the Extension as ready."""

    async def check() -> dict[str, Any] | None:
        found = await read_extension(api, namespace)
        return found if found is not None and gardener.extension_ready(found) is None else None

    return await eventually_async(check, limit=limit, interval=0.2)


def condition(extension: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((extension or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


async def machine(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, namespace, "machines", name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


async def node(shoot: Shoot, name: str) -> dict[str, Any] | None:
    try:
        response = await client.CoreV1Api(shoot.api).read_node_without_preload_content(name)
        body = await response.read()
    except ApiException:
        return None
    return json.loads(body) if response.status == 200 else None


def annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def tainted(found: dict[str, Any] | None) -> bool:
    taints = ((found or {}).get("spec") or {}).get("taints") or []
    return any(t.get("key") == v.PRESERVED_TAINT_KEY for t in taints)


async def annotate_node(shoot: Shoot, name: str, value: str) -> None:
    await client.CoreV1Api(shoot.api).patch_node(
        name, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}}, _content_type=MERGE_PATCH
    )


async def preserved(api: client.ApiClient, shoot: Shoot, name: str) -> dict[str, str] | None:
    """The machine's preservation record once it is Failed, preserved and its node tainted."""
    found = await machine(api, shoot.namespace, name)
    record = annotations(found)
    phase = ((found or {}).get("status") or {}).get("currentStatus", {}).get("phase")
    if phase == "Failed" and v.PRESERVED_UNTIL_ANNOTATION in record and tainted(await node(shoot, name)):
        return record
    return None


def preserved_for(record: dict[str, str]) -> dt.timedelta:
    since = dt.datetime.fromisoformat(record[v.PRESERVED_SINCE_ANNOTATION].replace("Z", "+00:00"))
    until = dt.datetime.fromisoformat(record[v.PRESERVED_UNTIL_ANNOTATION].replace("Z", "+00:00"))
    return until - since


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
            await _scenario(mcm_plane, seed, a, b)
        except BaseException:
            print(installed.log_tail())
            for shoot in (a, b):
                print(f"MCM of {shoot.namespace}:\n{shoot.mcm.log_tail(40)}")
            raise


async def _scenario(plane: ControlPlane, seed: client.ApiClient, a: Shoot, b: Shoot) -> None:
    # Enable: gardenlet creates the Extensions; both are ready within 30 s, the shoots served.
    started = time.monotonic()
    await gardener.apply_extension(seed, a.namespace, provider_config=PROVIDER_CONFIG)
    await gardener.apply_extension(seed, b.namespace)
    for shoot in (a, b):
        await ready(seed, shoot.namespace, limit=30)
    print(f"both Extensions ready {time.monotonic() - started:.1f} s after they were created")

    async def served(shoot: Shoot) -> bool:
        return (
            condition(await read_extension(seed, shoot.namespace), contract.CONTROL_PLANE_HEALTHY).get("status")
            == "True"
        )

    for shoot in (a, b):
        await eventually_async(lambda s=shoot: served(s), limit=30)  # type: ignore[misc]

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
        print("machine:", json.dumps((found or {}).get("status"), indent=1), annotations(found))
        print("node:", json.dumps(await node(a, second), indent=1))
        raise
    print(f"shoot a's second machine preserved {time.monotonic() - failed_at:.1f} s after its node failed")

    async def unserved() -> dict[str, Any]:
        found = condition(await read_extension(seed, b.namespace), contract.CONTROL_PLANE_HEALTHY)
        return found if found.get("status") == "False" else {}

    reported = await eventually_async(unserved, limit=60)
    print(f"shoot b reported: {reported.get('message')}")

    # Disable shoot a: every preservation ends (records, taints), the Extension and the shoot's objects go.
    await gardener.delete_extension(seed, a.namespace)

    async def released() -> bool:
        for name in (victims[a.namespace], second):
            found = await machine(seed, a.namespace, name)
            if found is not None and v.PRESERVED_UNTIL_ANNOTATION in annotations(found):
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
