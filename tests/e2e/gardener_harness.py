"""What the Gardener extension's end-to-end tests share: one installation of the product per seed (the seed chart
rendered with gardenlet's values, its webhook and extension processes run as the chart's ServiceAccounts), shoots
as gardenlet prepares them (each with its own kube-apiserver, gardener-resource-manager and real MCM, optionally
MCM's Deployment object Gardener keeps in the shoot namespace), and the reads the tests judge by.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.controller.clients import MERGE_PATCH, new_api_client
from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import parse_go_duration_nanoseconds
from machine_preservation.core.mcm_evidence import MCM_DEPLOYMENT
from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.grm import GrmRunner
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import FakeKubelets
from machine_preservation.localcluster.mcm_runner import McmRunner
from machine_preservation.localcluster.toolchain import Toolchain
from tests.polling import eventually_async

MCM_SERVICE_ACCOUNT = "machine-controller-manager"
MCM_IMAGE = "europe-docker.pkg.dev/gardener-project/releases/gardener/machine-controller-manager"


@contextlib.asynccontextmanager
async def seed_client(plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An administrator's client of the seed, once Gardener's seed CRDs are installed in it."""
    await asyncio.to_thread(gardener.install_seed_crds, plane.kubeconfig, operator=False)
    api = await new_api_client(kubeconfig=plane.kubeconfig)
    try:
        yield api
    finally:
        await api.close()


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
    extension_user: str  # the extension process's identity towards the seed (its ServiceAccount)

    def extension_log(self) -> str:
        return (self.logs / "extension.log").read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(
            f"--- {name} ---\n{processes.log_tail(self.logs / f'{name}.log', lines)}"
            for name in ("webhook", "extension")
        )


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
                extra=[f"--kubeconfig={kubeconfigs['extension']}", *extra_extension_args],
            ),
            log_file=logs / "extension.log",
        )
        await processes.wait_controller_ready(extension, metrics_port=metrics_port, log_file=logs / "extension.log")
        extension_account = seed_install.service_account_of(documents, seed_install.EXTENSION_DEPLOYMENT)
        yield Installation(
            namespace=namespace,
            webhook=webhook,
            extension=extension,
            logs=logs,
            extension_user=f"system:serviceaccount:{namespace}:{extension_account}",
        )
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
    mcm_version: str = DEFAULT_MCM_VERSION,
    mcm_deployment: bool = False,
) -> AsyncIterator[Shoot]:
    """A shoot as gardenlet prepares it, with its API server, its GRM and its MCM `mcm_version` (as Gardener runs
    MCM: its ServiceAccount in the shoot namespace towards the seed). With `mcm_deployment`, MCM's Deployment
    object in the shoot namespace too, with the image of that version (see `mcm_deployment_manifest`)."""
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
        version=mcm_version,
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
        if mcm_deployment:
            await client.AppsV1Api(api).create_namespaced_deployment(
                namespace,
                mcm_deployment_manifest(mcm_version),  # type: ignore[arg-type]
            )
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


def annotations_of(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def tainted(found: dict[str, Any] | None) -> bool:
    taints = ((found or {}).get("spec") or {}).get("taints") or []
    return any(t.get("key") == v.PRESERVED_TAINT_KEY for t in taints)


async def annotate_node(shoot: Shoot, name: str, value: str) -> None:
    await client.CoreV1Api(shoot.api).patch_node(
        name, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}}, _content_type=MERGE_PATCH
    )


async def annotate_machine(api: client.ApiClient, shoot: Shoot, name: str, value: str) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        v.MACHINE_API_GROUP,
        v.MACHINE_API_VERSION,
        shoot.namespace,
        "machines",
        name,
        {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}},
        _content_type=MERGE_PATCH,
    )


async def fail_node(api: client.ApiClient, shoot: Shoot, name: str, *, limit: float = 60.0) -> None:
    """The machine's node dies: its Ready turns False and, once MCM has had the machine Unknown for longer than its
    health timeout, Unknown (as the node lifecycle controller marks a kubelet that stopped posting). MCM checks the
    machine again at once on that change; MCM v0.62 would otherwise look again only a minute later. Returns once
    the machine is Failed."""
    await shoot.kubelets.set_ready(name, False)
    timeout = parse_go_duration_nanoseconds(shoot.mcm.settings.machine_health_timeout) / 1e9

    async def phase() -> str | None:
        found = await machine(api, shoot.namespace, name)
        return str(((found or {}).get("status") or {}).get("currentStatus", {}).get("phase") or "") or None

    if await eventually_async(lambda: _phase_in(phase, ("Unknown", "Failed")), limit=limit, interval=0.2) == "Unknown":
        await asyncio.sleep(timeout + 0.5)
        await shoot.kubelets.set_ready(name, "Unknown")
    await eventually_async(lambda: _phase_in(phase, ("Failed",)), limit=limit, interval=0.2)


async def _phase_in(phase: Callable[[], Awaitable[str | None]], wanted: tuple[str, ...]) -> str | None:
    found = await phase()
    return found if found in wanted else None


async def preserved(api: client.ApiClient, shoot: Shoot, name: str) -> dict[str, str] | None:
    """The machine's preservation record once it is Failed, preserved and its node tainted."""
    found = await machine(api, shoot.namespace, name)
    record = annotations_of(found)
    phase = ((found or {}).get("status") or {}).get("currentStatus", {}).get("phase")
    if phase == "Failed" and v.PRESERVED_UNTIL_ANNOTATION in record and tainted(await node(shoot, name)):
        return record
    return None


def preserved_for(record: dict[str, str]) -> dt.timedelta:
    since = dt.datetime.fromisoformat(record[v.PRESERVED_SINCE_ANNOTATION].replace("Z", "+00:00"))
    until = dt.datetime.fromisoformat(record[v.PRESERVED_UNTIL_ANNOTATION].replace("Z", "+00:00"))
    return until - since


def mcm_deployment_manifest(version: str) -> dict[str, Any]:
    """MCM's Deployment as Gardener keeps it in a shoot namespace, for what our processes read from it: the image.
    Only the object: MCM runs as local processes (`McmRunner`), and nothing would run its pods anyway (the e2e
    seed's kube-controller-manager runs no Deployment controller); no replicas says so."""
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
                "spec": {"containers": [{"name": MCM_DEPLOYMENT, "image": f"{MCM_IMAGE}:{version}"}]},
            },
        },
    }


async def upgrade_mcm(api: client.ApiClient, shoot: Shoot, version: str) -> None:
    """The shoot's MCM rolled to `version` as the shoot's reconcile does it: the Deployment's image changes, the
    old MCM stops and the new one starts."""
    await client.AppsV1Api(api).patch_namespaced_deployment(
        MCM_DEPLOYMENT,
        shoot.namespace,
        {"spec": {"template": {"spec": {"containers": [{"name": MCM_DEPLOYMENT, "image": f"{MCM_IMAGE}:{version}"}]}}}},
    )
    await asyncio.to_thread(shoot.mcm.stop)
    shoot.mcm.version, shoot.mcm.bin_dir = version, None
    await asyncio.to_thread(shoot.mcm.start)


def preserve_expiry(found: dict[str, Any] | None) -> dt.datetime | None:
    """`status.currentStatus.preserveExpiryTime` (MCM v0.62's expiry, our mirror of ours), if set."""
    text = (((found or {}).get("status") or {}).get("currentStatus") or {}).get("preserveExpiryTime")
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def record_of(found: dict[str, Any] | None) -> dict[str, str]:
    """Our preservation record's annotations on a Machine."""
    return {k: value for k, value in annotations_of(found).items() if k in v.PRESERVATION_RECORD_ANNOTATIONS}


@dataclasses.dataclass(frozen=True)
class AuditedWrite:
    verb: str
    resource: str  # machines, machines/status, ...
    name: str
    code: int
    body: Any = dataclasses.field(compare=False, repr=False)


def machine_writes(plane: ControlPlane, *, user: str, namespace: str) -> list[AuditedWrite]:
    """Every write of `user` to MCM's objects in `namespace` of `plane`, from its audit log, oldest first (the
    e2e seed audits every write to the machine.sapcloud.io kinds, tests/e2e/product.py AUDIT_POLICY)."""
    found: list[AuditedWrite] = []
    with plane.audit_log.open("rb") as log:
        for line in log:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if (
                    event.get("stage") == "ResponseComplete"
                    and (event.get("user") or {}).get("username") == user
                    and ref.get("apiGroup") == v.MACHINE_API_GROUP
                    and ref.get("namespace") == namespace
                    and event.get("verb") in ("create", "update", "patch", "delete")
                ):
                    resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                    found.append(
                        AuditedWrite(
                            verb=event["verb"],
                            resource=resource,
                            name=ref.get("name", ""),
                            code=int((event.get("responseStatus") or {}).get("code", 0)),
                            body=event.get("requestObject"),
                        )
                    )
    return found
