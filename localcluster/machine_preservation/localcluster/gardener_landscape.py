"""A local Gardener landscape for the playground and the tests of the Gardener extension: a seed, one installation of
the product per seed, and shoots as gardenlet prepares them (developer tooling, not part of the image).

- `seed_plane`: the seed's control plane (etcd, kube-apiserver, kube-controller-manager) with MCM's CRDs and
  Gardener's seed CRDs; `seed_client`: an administrator's client of it.
- `installation`: the seed chart rendered with gardenlet's values (`seed_install`), its ServiceAccounts and RBAC
  applied as they are, its webhook and extension processes run with the rendered arguments as those
  ServiceAccounts; the certs manager's part (the CA Secret, the seed's Machine webhook configuration) done here.
- `bare_shoot`: a shoot namespace as gardenlet labels it, its `Cluster` and generic token kubeconfig, the shoot's
  own kube-apiserver (on the seed's etcd) and its real gardener-resource-manager; `new_shoot`: that and its real
  MCM (Machines in the shoot namespace of the seed as the namespace's MCM ServiceAccount, Nodes in the shoot) and
  fake kubelets.
- Reads of what a Gardener operator, the walk-through and the tests look at: the `Extension`, its conditions, the
  shoot's ManagedResource and node webhooks, Machines (seed) and Nodes (shoot).
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.extension import CONTROL_PLANE_HEALTHY
from machine_preservation.core.gardener.shoot_resources import MANAGED_RESOURCE, WEBHOOK_CONFIGURATION
from machine_preservation.core.mcm_evidence import MCM_DEPLOYMENT
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.crds import install_crds
from machine_preservation.localcluster.grm import GrmRunner
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import FakeKubelets
from machine_preservation.localcluster.mcm_runner import McmRunner, McmSettings, grant_mcm_rbac
from machine_preservation.localcluster.toolchain import Toolchain

MCM_SERVICE_ACCOUNT = "machine-controller-manager"
MCM_IMAGE = "europe-docker.pkg.dev/gardener-project/releases/gardener/machine-controller-manager"
T = TypeVar("T")


# --- the seed ------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def seed_plane(
    *,
    directory: Path,
    bin_dir: Path,
    mcm_version: str = DEFAULT_MCM_VERSION,
    audit_policy: dict[str, object] | None = None,
    feature_gates: Mapping[str, bool] | None = None,
) -> Iterator[ControlPlane]:
    """A started seed control plane with MCM's CRDs of `mcm_version` (plus the Shoot and `Cluster` CRDs) and MCM's
    ClusterRole; stopped afterwards. Gardener's other seed CRDs come with `seed_client`."""
    plane = ControlPlane(
        directory=directory, bin_dir=bin_dir, audit_policy=audit_policy, feature_gates=dict(feature_gates or {})
    )
    plane.start()
    try:
        install_crds(plane.kubeconfig, mcm_version=mcm_version)
        grant_mcm_rbac(plane.kubeconfig)
        yield plane
    finally:
        plane.stop()


@contextlib.asynccontextmanager
async def seed_client(plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An administrator's client of the seed, once Gardener's seed CRDs are installed in it."""
    await asyncio.to_thread(gardener.install_seed_crds, plane.kubeconfig, operator=False)
    api = await new_api_client(kubeconfig=plane.kubeconfig)
    try:
        yield api
    finally:
        await api.close()  # type: ignore[no-untyped-call]


# --- one installation per seed ---------------------------------------------------------------------------------------


# The installation's processes, by log name: the webhook Deployment's two containers, then the extension.
PROCESSES = ("webhook", "seed-webhook", "extension")


@dataclasses.dataclass
class Installation:
    """The seed chart's webhook and extension processes, running as the chart's ServiceAccounts."""

    namespace: str
    webhook: subprocess.Popen[bytes]  # the shoots' routes (the chart's `webhook` container)
    seed_webhook: subprocess.Popen[bytes]  # the seed's routes (its `seed-webhook` container)
    extension: subprocess.Popen[bytes]
    logs: Path
    extension_user: str  # the extension process's identity towards the seed (its ServiceAccount)
    metrics_port: int = 0
    documents: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the chart as rendered for it

    def extension_log(self) -> str:
        return (self.logs / "extension.log").read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(
            f"--- {name} ---\n{processes.log_tail(self.logs / f'{name}.log', lines)}" for name in PROCESSES
        )

    def exited(self) -> str | None:
        """Why a process of the installation is no longer running (with its log's end), or None."""
        for name, process in zip(PROCESSES, (self.webhook, self.seed_webhook, self.extension), strict=True):
            problem = processes.exited(name, process, self.logs / f"{name}.log")
            if problem is not None:
                return problem
        return None


@contextlib.asynccontextmanager
async def installation(
    plane: ControlPlane,
    api: client.ApiClient,
    toolchain: Toolchain,
    directory: Path,
    *,
    extra_extension_args: Sequence[str] = (),
) -> AsyncIterator[Installation]:
    """The seed chart's webhook and extension processes; `extra_extension_args` go after the rendered ones."""
    namespace = f"extension-machine-preservation-{uuid.uuid4().hex[:5]}"
    documents = seed_install.render(
        toolchain.helm,
        namespace=namespace,
        values=seed_install.gardenlet_values(),
        directory=directory,
        # A release name of its own: installations made one after the other in one seed keep their
        # cluster-wide RBAC apart (gardenlet names the release after the registration).
        release=f"mp-{namespace[-5:]}",
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
    # The chart's two webhook containers as two processes, each on its own port: the shoots' routes and the seed's.
    # Both serve the pair the first writes into the directory they share (as the pod's containers share /certs).
    ports = {name: free_port() for name in ("webhook", "seed-webhook")}
    webhooks: dict[str, subprocess.Popen[bytes]] = {}
    extension: subprocess.Popen[bytes] | None = None
    configuration_name = ""
    try:
        for name, port in ports.items():
            webhooks[name] = processes.spawn(
                seed_install.replace_args(
                    seed_install.container_args(documents, seed_install.WEBHOOK_DEPLOYMENT, name),
                    {"--host": "127.0.0.1", "--port": str(port), "--cert-dir": str(cert_dir)},
                    extra=["--self-signed", "--san=127.0.0.1", f"--kubeconfig={kubeconfigs['webhook']}"],
                ),
                log_file=logs / f"{name}.log",
            )
            await processes.wait_webhook_ready(
                webhooks[name], port=port, cafile=cert_dir / "ca.crt", log_file=logs / f"{name}.log"
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
        configuration = seed_install.served_by(
            seed_install.seed_webhook_configuration(documents),
            url=f"https://127.0.0.1:{ports['seed-webhook']}",
            ca_bundle=ca,
        )
        configuration_name = configuration["metadata"]["name"]
        await processes.apply_manifests(api, [configuration])
        metrics_port = free_port()
        extension = processes.spawn(
            seed_install.replace_args(
                extension_args,
                {
                    "--namespace": namespace,
                    "--webhook-url": f"https://127.0.0.1:{ports['webhook']}",
                    "--metrics-bind-address": "127.0.0.1",
                    "--metrics-port": str(metrics_port),
                },
                extra=[f"--kubeconfig={kubeconfigs['extension']}", *extra_extension_args],
            ),
            log_file=logs / "extension.log",
        )
        await processes.wait_controller_ready(extension, metrics_port=metrics_port, log_file=logs / "extension.log")
        extension_account = seed_install.service_account_of(documents, seed_install.EXTENSION_DEPLOYMENT)
        yield Installation(
            namespace=namespace,
            webhook=webhooks["webhook"],
            seed_webhook=webhooks["seed-webhook"],
            extension=extension,
            logs=logs,
            extension_user=f"system:serviceaccount:{namespace}:{extension_account}",
            metrics_port=metrics_port,
            documents=documents,
        )
    finally:
        if extension is not None:
            await processes.stop_process("extension", extension)
        for name, process in webhooks.items():
            await processes.stop_process(name, process)
        if configuration_name:
            with contextlib.suppress(ApiException, OSError):
                await client.AdmissionregistrationV1Api(api).delete_validating_webhook_configuration(configuration_name)


# --- shoots --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class BareShoot:
    """A shoot as gardenlet prepares it for extensions, without machines."""

    namespace: str
    plane: ControlPlane
    grm: GrmRunner
    api: client.ApiClient  # the shoot's kube-apiserver, as an administrator


@dataclasses.dataclass
class Shoot(BareShoot):
    """A shoot with its MCM and fake kubelets."""

    mcm: McmRunner
    kubelets: FakeKubelets


@contextlib.asynccontextmanager
async def bare_shoot(
    plane: ControlPlane,
    api: client.ApiClient,
    directory: Path,
    *,
    workers: list[dict[str, Any]],
    provider_config: dict[str, Any] | None = None,
    namespace: str | None = None,
    audit_policy: dict[str, object] | None = None,
) -> AsyncIterator[BareShoot]:
    """A shoot as gardenlet prepares it for extensions: namespace, `Cluster`, generic token kubeconfig, its API
    server (audited with `audit_policy`) and its GRM. `namespace` (default `shoot--t--<5 hex>`) must stay short:
    GRM's client certificate names its ServiceAccount in it, within 64 characters."""
    namespace = namespace or gardener.shoot_namespace_name("t", uuid.uuid4().hex[:5])
    shoot_plane = await asyncio.to_thread(
        gardener.start_shoot_control_plane,
        plane,
        directory / "plane",
        name=namespace.rpartition("--")[2],
        namespaces=[namespace],
        audit_policy=audit_policy,
    )
    grm = GrmRunner(seed=plane, shoot=shoot_plane, namespace=namespace, directory=directory / "grm")
    shoot_api = await new_api_client(kubeconfig=shoot_plane.kubeconfig)
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
        yield BareShoot(namespace=namespace, plane=shoot_plane, grm=grm, api=shoot_api)
    finally:
        await asyncio.to_thread(grm.stop)
        await shoot_api.close()  # type: ignore[no-untyped-call]
        await asyncio.to_thread(shoot_plane.stop)


@contextlib.asynccontextmanager
async def new_shoot(
    plane: ControlPlane,
    api: client.ApiClient,
    directory: Path,
    *,
    workers: list[dict[str, Any]],
    provider_config: dict[str, Any] | None = None,
    mcm_version: str = DEFAULT_MCM_VERSION,
    mcm_deployment: bool = False,
    mcm_settings: McmSettings | None = None,
    namespace: str | None = None,
) -> AsyncIterator[Shoot]:
    """A `bare_shoot` with its MCM `mcm_version` (as Gardener runs MCM: its ServiceAccount in the shoot namespace
    towards the seed; `mcm_settings` its flags) and fake kubelets. With `mcm_deployment`, MCM's Deployment object
    in the shoot namespace too, with the image of that version (see `mcm_deployment_manifest`). `namespace`
    (default `shoot--t--<4 hex>`) must stay at most 14 characters: client certificates carry
    `system:serviceaccount:<namespace>:machine-controller-manager`, at most 64."""
    namespace = namespace or gardener.shoot_namespace_name("t", uuid.uuid4().hex[:4])
    if len(f"system:serviceaccount:{namespace}:{MCM_SERVICE_ACCOUNT}") > 64:
        raise ValueError(f"shoot namespace {namespace!r} is too long for MCM's client certificate name")
    async with bare_shoot(
        plane, api, directory, workers=workers, provider_config=provider_config, namespace=namespace
    ) as bare:
        mcm = McmRunner(
            plane=plane,
            namespace=namespace,
            directory=directory / "mcm",
            target=bare.plane,
            control_user=f"system:serviceaccount:{namespace}:{MCM_SERVICE_ACCOUNT}",
            version=mcm_version,
            settings=mcm_settings or McmSettings(),
        )
        kubelets = FakeKubelets(api, namespace, target=bare.api)
        try:
            if mcm_deployment:
                await client.AppsV1Api(api).create_namespaced_deployment(
                    namespace,
                    mcm_deployment_manifest(mcm_version),  # type: ignore[arg-type]
                )
            await asyncio.to_thread(mcm.start)
            async with kubelets.running():
                yield Shoot(
                    namespace=namespace, plane=bare.plane, grm=bare.grm, api=bare.api, mcm=mcm, kubelets=kubelets
                )
        finally:
            await asyncio.to_thread(mcm.stop)


def mcm_image(version: str) -> str:
    """MCM's image of `version`, as a shoot's MCM Deployment names it."""
    return f"{MCM_IMAGE}:{version}"


def mcm_deployment_manifest(version: str) -> dict[str, Any]:
    """MCM's Deployment as Gardener keeps it in a shoot namespace, for what our processes read from it: the image.
    Only the object: MCM runs as local processes (`McmRunner`), and nothing runs its pods; no replicas says so."""
    labels = {"app": "kubernetes", "role": MCM_DEPLOYMENT}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": MCM_DEPLOYMENT, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": MCM_DEPLOYMENT, "image": mcm_image(version)}]},
            },
        },
    }


# --- reads -----------------------------------------------------------------------------------------------------------


async def eventually(check: Callable[[], Awaitable[T | None]], *, limit: float, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; return that (TimeoutError with the last outcome)."""
    deadline = time.monotonic() + limit
    last: object = None
    while True:
        try:
            result = await check()
        except ApiException as error:
            result, last = None, error
        else:
            last = result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {limit:g} s; last outcome: {last!r}")
        await asyncio.sleep(interval)


async def read_extension(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    try:
        return await gardener.read_extension(api, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def ready(api: client.ApiClient, namespace: str, *, limit: float = 30.0) -> dict[str, Any]:
    """Until gardenlet would count the Extension as ready; return it (TimeoutError with why it is not)."""

    async def check() -> dict[str, Any] | None:
        found = await read_extension(api, namespace)
        return found if found is not None and gardener.extension_ready(found) is None else None

    try:
        return await eventually(check, limit=limit)
    except TimeoutError as timeout:
        found = await read_extension(api, namespace)
        raise TimeoutError(
            f"not ready: {found and gardener.extension_ready(found)}; {found and found.get('status')}"
        ) from timeout


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """The condition `kind` of an object's `status.conditions` (an Extension's, a ManagedResource's), or {}."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


async def served(api: client.ApiClient, namespace: str, *, reason: str | None = None) -> dict[str, Any] | None:
    """The Extension's ControlPlaneHealthy condition if it is True (with `reason`, if given), else None."""
    found = condition(await read_extension(api, namespace), CONTROL_PLANE_HEALTHY)
    return found if found.get("status") == "True" and reason in (None, found.get("reason")) else None


async def managed_resource(
    api: client.ApiClient, namespace: str, name: str = MANAGED_RESOURCE
) -> dict[str, Any] | None:
    """The shoot's ManagedResource the extension keeps in its namespace, or None."""
    return await _custom_object(
        api, gardener.RESOURCES_GROUP, gardener.RESOURCES_VERSION, namespace, "managedresources", name
    )


async def machine(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    return await _custom_object(api, v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, namespace, "machines", name)


async def _custom_object(
    api: client.ApiClient, group: str, version: str, namespace: str, plural: str, name: str
) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(  # type: ignore[assignment]
            group, version, namespace, plural, name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


async def node(shoot: BareShoot, name: str) -> dict[str, Any] | None:
    return await _raw(client.CoreV1Api(shoot.api).read_node_without_preload_content(name))


async def shoot_webhooks(shoot: BareShoot) -> dict[str, Any] | None:
    """The node ValidatingWebhookConfiguration the extension's ManagedResource puts into the shoot, or None."""
    admission = client.AdmissionregistrationV1Api(shoot.api)
    return await _raw(admission.read_validating_webhook_configuration_without_preload_content(WEBHOOK_CONFIGURATION))


async def _raw(read: Awaitable[Any]) -> dict[str, Any] | None:
    """The object a `..._without_preload_content` read returns, or None if it cannot be read."""
    try:
        response = await read
        body = await response.read()
    except ApiException:
        return None
    if response.status != 200:
        return None
    found: dict[str, Any] = json.loads(body)
    return found


def annotations_of(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def tainted(found: dict[str, Any] | None) -> bool:
    taints = ((found or {}).get("spec") or {}).get("taints") or []
    return any(t.get("key") == v.PRESERVED_TAINT_KEY for t in taints)


async def annotate_node(shoot: BareShoot, name: str, value: str) -> None:
    await client.CoreV1Api(shoot.api).patch_node(
        name, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}}, _content_type=MERGE_PATCH
    )


async def annotate_machine(api: client.ApiClient, shoot: BareShoot, name: str, value: str) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        v.MACHINE_API_GROUP,
        v.MACHINE_API_VERSION,
        shoot.namespace,
        "machines",
        name,
        {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}},
        _content_type=MERGE_PATCH,
    )


async def preserved(api: client.ApiClient, shoot: BareShoot, name: str) -> dict[str, str] | None:
    """The machine's preservation record once it is Failed, preserved and its node tainted."""
    found = await machine(api, shoot.namespace, name)
    record = annotations_of(found)
    phase = ((found or {}).get("status") or {}).get("currentStatus", {}).get("phase")
    if phase == "Failed" and v.PRESERVED_UNTIL_ANNOTATION in record and tainted(await node(shoot, name)):
        return record
    return None


def preserved_for(record: dict[str, str]) -> dt.timedelta:
    return preserved_until(record) - _timestamp(record[v.PRESERVED_SINCE_ANNOTATION])


def preserved_until(record: dict[str, str]) -> dt.datetime:
    return _timestamp(record[v.PRESERVED_UNTIL_ANNOTATION])


def _timestamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
