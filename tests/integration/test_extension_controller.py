"""The Gardener extension process (`machine-preservation extension`) against real parts: the seed's kube-apiserver
with Gardener's CRDs, a kube-apiserver per shoot (audience `gardener`) and each shoot's real
gardener-resource-manager. The test plays gardenlet (namespace, `Cluster`, generic token kubeconfig, `Extension`
with operation and timestamp annotations) and judges readiness as gardenlet does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pydantic
import pytest
from kubernetes.aio import client

from machine_preservation.certs.authority import generate_ca
from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.controller.gardener.extensions import ExtensionReconciler
from machine_preservation.controller.gardener.seed import DEFAULT_NODE_BUDGET, SeedController, SeedOptions
from machine_preservation.controller.gardener.shoots import ApiServerProbe
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener import shoot_resources
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.kube.clients import MERGE_PATCH
from machine_preservation.localcluster import gardener, hosts, seed_install
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import (
    BareShoot,
    bare_shoot,
    condition,
    managed_resource,
    read_extension,
    ready,
    served,
    shoot_webhooks,
)
from machine_preservation.localcluster.toolchain import ensure_toolchain
from tests.controller.running import with_runtime_options
from tests.controller.support import aio_client
from tests.controller.tcpproxy import TcpProxy
from tests.polling import eventually_async

MACHINES = ("machine.sapcloud.io", "v1alpha1")
WEBHOOK_URL = "https://127.0.0.1:9"  # nothing listens: the shoots' node webhooks fail open (Ignore)


@pytest.fixture(scope="module")
def seed(control_plane: ControlPlane) -> ControlPlane:
    gardener.install_seed_crds(control_plane.kubeconfig, operator=False)
    return control_plane


def new_shoot(seed: ControlPlane, api: client.ApiClient, directory: Path) -> AbstractAsyncContextManager[BareShoot]:
    """A shoot as gardenlet prepares it for extensions, without machines."""
    return bare_shoot(seed, api, directory, workers=[gardener.worker("worker1")])


@dataclasses.dataclass
class Extension:
    controller: SeedController
    namespace: str  # the extension's own namespace
    stop: asyncio.Event
    task: asyncio.Task[int]
    options: SeedOptions

    async def crash_and_restart(self) -> None:
        """End the process where it is (its task cancelled mid-await), then start a new one."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.controller, self.stop = SeedController(options=self.options), asyncio.Event()
        self.task = asyncio.create_task(self.controller.run(self.stop))


@pytest.fixture
async def api(seed: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api_client = await aio_client(seed.kubeconfig)
    yield api_client
    await api_client.close()


def new_ca_pem(name: str) -> bytes:
    return generate_ca(common_name=name, now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(days=1)).cert_pem


@pytest.fixture
def ca_pem() -> bytes:
    return new_ca_pem("test-webhook-ca")


async def installed_extension(
    seed: ControlPlane, api: client.ApiClient, ca_pem: bytes, directory: Path, **options: Any
) -> SeedOptions:
    """The extension's namespace, the certs manager's Secret and the seed chart's ServiceAccount with the RBAC the
    chart ships; the options of an extension process running as that ServiceAccount (never as an administrator),
    `options` overriding them. Its chart and kubeconfig go to `directory` (a test's own, which pytest removes)."""
    namespace = f"extension-machine-preservation-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
    documents = await asyncio.to_thread(
        seed_install.render,
        ensure_toolchain().helm,
        namespace=namespace,
        values=seed_install.gardenlet_values(),
        directory=directory,
        release=f"mp-{namespace[-6:]}",  # its cluster-wide RBAC apart from the other tests' installations
    )
    await processes.apply_manifests(api, seed_install.identities(documents))
    identity = await seed_install.service_account_kubeconfig(
        api,
        seed,
        namespace=namespace,
        name=seed_install.service_account_of(documents, seed_install.EXTENSION_DEPLOYMENT),
        path=directory / "extension.kubeconfig",
    )
    # What the certs manager keeps: the trust bundle in the Secret the chart names (its RBAC grants it by name).
    args = seed_install.container_args(documents, seed_install.EXTENSION_DEPLOYMENT)
    ca_secret = next(a.split("=", 1)[1] for a in args if a.startswith("--ca-secret=")).split("/", 1)[1]
    await core.create_namespaced_secret(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": ca_secret},
            "data": {CA_BUNDLE_KEY: base64.b64encode(ca_pem).decode()},
        },
    )
    settings: dict[str, Any] = {
        "identity": "test-extension",
        "leader_elect": False,
        "metrics_port": 0,
        "heartbeat_period": 1.0,
        "native_preservation": NativePreservationMode.FALSE,
        "node_budget": DEFAULT_NODE_BUDGET,
        **options,
    }
    process, runtime = with_runtime_options(settings)
    return SeedOptions(
        namespace=namespace,
        webhook_url=WEBHOOK_URL,
        ca_secret=(namespace, ca_secret),
        kubeconfig=identity,
        runtime=runtime,
        **process,
    )


@contextlib.asynccontextmanager
async def running_extension(
    seed: ControlPlane, api: client.ApiClient, ca_pem: bytes, directory: Path, **options: Any
) -> AsyncIterator[Extension]:
    """The extension process of an `installed_extension`, in this event loop; `options` override SeedOptions."""
    seed_options = await installed_extension(seed, api, ca_pem, directory, **options)
    namespace = seed_options.namespace
    core = client.CoreV1Api(api)
    controller = SeedController(options=seed_options)
    stop = asyncio.Event()
    running = Extension(
        controller=controller,
        namespace=namespace,
        stop=stop,
        task=asyncio.create_task(controller.run(stop)),
        options=seed_options,
    )
    try:
        yield running
    finally:
        running.stop.set()
        assert await asyncio.wait_for(running.task, 60) == 0
        await core.delete_namespace(namespace)


@pytest.fixture
async def extension(
    seed: ControlPlane, api: client.ApiClient, ca_pem: bytes, tmp_path: Path
) -> AsyncIterator[Extension]:
    async with running_extension(seed, api, ca_pem, tmp_path / "extension") as running:
        yield running


async def test_enable_serves_the_shoot_and_delete_cleans_up(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, ca_pem: bytes, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await gardener.apply_extension(api, shoot.namespace)
        obj = await ready(api, shoot.namespace)
        assert contract.FINALIZER in obj["metadata"]["finalizers"]
        assert obj["status"]["lastOperation"]["type"] == "Create"

        # The shoot's GRM put the node webhooks into the shoot, pointing at this shoot's path of the one webhook.
        webhooks = await eventually_async(lambda: shoot_webhooks(shoot), limit=20)
        # GRM injected Gardener's no-cleanup label (a shoot deletion leaves the objects to GRM).
        assert webhooks["metadata"]["labels"]["shoot.gardener.cloud/no-cleanup"] == "true"
        for webhook in webhooks["webhooks"]:
            assert webhook["clientConfig"]["url"].startswith(f"{WEBHOOK_URL}/shoots/{shoot.namespace}/")
            assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca_pem
            assert webhook["failurePolicy"] == "Ignore"
            assert webhook["timeoutSeconds"] <= 5

        # The lifecycle runs with the shoot-access token GRM wrote: the condition says the shoot is served.

        await eventually_async(lambda: served(api, shoot.namespace), limit=30)
        lease = await client.CoordinationV1Api(api).read_namespaced_lease(
            contract.HEARTBEAT_LEASE_NAME, extension.namespace
        )
        assert lease.spec is not None
        assert lease.spec.renew_time is not None

        # gardenlet's delete: the finalizer goes once the shoot's objects and the Secrets are gone.
        await gardener.delete_extension(api, shoot.namespace)
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=30)
        assert await shoot_webhooks(shoot) is None
        secrets = await client.CoreV1Api(api).list_namespaced_secret(shoot.namespace)
        names = {s.metadata.name for s in secrets.items if s.metadata is not None}
        assert shoot_resources.SHOOT_ACCESS_SECRET not in names
        assert not [n for n in names if n.startswith(shoot_resources.MANAGED_RESOURCE_SECRET)]
        assert shoot.namespace not in extension.controller.supervisor.namespaces()  # type: ignore[union-attr]


async def _set_kubernetes_version(api: client.ApiClient, namespace: str, version: str) -> None:
    """As gardenlet copies a Shoot's Kubernetes version into its Cluster."""
    patch = {"spec": {"shoot": {"spec": {"kubernetes": {"version": version}}}}}
    await client.CustomObjectsApi(api).patch_cluster_custom_object(
        "extensions.gardener.cloud", "v1alpha1", "clusters", namespace, patch, _content_type=MERGE_PATCH
    )


async def test_a_shoot_too_old_for_the_node_protection_is_reported_and_served_with_rbac_only(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await _set_kubernetes_version(api, shoot.namespace, "1.29.4")
        await gardener.apply_extension(api, shoot.namespace)
        await ready(api, shoot.namespace)  # not an Error: the shoot's own reconcile is never blocked

        async def unhealthy() -> dict[str, Any] | None:
            found = condition(await read_extension(api, shoot.namespace), contract.CONTROL_PLANE_HEALTHY)
            return found if found.get("status") == "False" else None

        found = await eventually_async(unhealthy, limit=30)
        assert found["reason"] == "HealthCheckUnsuccessful"
        assert "Kubernetes 1.29.4" in found["message"]
        warning = await eventually_async(lambda: _event(api, shoot.namespace, "ShootKubernetesTooOld"), limit=30)
        assert warning.type == "Warning"
        assert "upgrade the shoot to Kubernetes 1.30" in warning.message
        # The RBAC alone is applied (the lifecycle runs); no node webhook or policy that would half-work.
        resource = await eventually_async(lambda: _applied(api, shoot.namespace), limit=30)
        kinds = {entry["kind"] for entry in resource["status"].get("resources", [])}
        assert "ClusterRole" in kinds
        assert "ValidatingWebhookConfiguration" not in kinds
        assert await shoot_webhooks(shoot) is None
        # ... and counted, for the seed's alerting.
        registry = extension.controller.metrics.registry  # type: ignore[union-attr]

        def missing() -> float | None:
            labels = {"namespace": shoot.namespace}
            return registry.get_sample_value("machine_preservation_shoot_node_protection_missing", labels)

        await eventually_async(lambda: missing() == 1, limit=30)

        # After the upgrade, gardenlet's next reconcile installs the rest and the shoot is served.
        await _set_kubernetes_version(api, shoot.namespace, "1.30.2")
        await gardener.apply_extension(api, shoot.namespace)
        await eventually_async(lambda: shoot_webhooks(shoot), limit=30)
        await eventually_async(lambda: served(api, shoot.namespace), limit=30)
        await eventually_async(lambda: missing() == 0, limit=30)
        # Disabled: the shoot's series goes with its lifecycle.
        await gardener.delete_extension(api, shoot.namespace)
        await eventually_async(lambda: missing() is None, limit=30)


async def _applied(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    found = await managed_resource(api, namespace)
    return found if condition(found, shoot_resources.RESOURCES_APPLIED).get("status") == "True" else None


async def test_a_slow_shoot_api_server_is_reported_until_it_answers_in_time_again(
    seed: ControlPlane, api: client.ApiClient, ca_pem: bytes, tmp_path: Path
) -> None:
    # A timeout well above the proxy's delay: a probe that has to open a connection through the proxy waits for
    # several delayed chunks (the TLS handshake's and the answer's).
    probe = ApiServerProbe(period=0.5, slow_answer=1.0, timeout=10.0)
    async with (
        new_shoot(seed, api, tmp_path) as shoot,
        running_extension(seed, api, ca_pem, tmp_path / "extension", shoot_probe=probe) as extension,
    ):
        # The extension reaches the shoot's API server, at its Service's name, through a proxy that can pass its
        # answers on late.
        proxy = TcpProxy(
            upstream=shoot.plane.address,
            upstream_port=shoot.plane.apiserver_port,
            address=hosts.free_loopback_address(),
            port=hosts.SHOOT_API_SERVER_PORT,
        )
        await proxy.start()
        hosts.set_host(hosts.api_server_service(shoot.namespace), proxy.address)
        try:
            await gardener.apply_extension(api, shoot.namespace)
            await eventually_async(lambda: served(api, shoot.namespace), limit=30)

            proxy.delay = 1.5  # the watches stay open; only a request tells
            # Not a condition False (that is gardenlet's APIServerAvailable): a Warning Event on the Extension and a
            # gauge say it, while the shoot stays served.
            warning = await eventually_async(lambda: _event(api, shoot.namespace, "ShootAPIServerSlow"), limit=30)
            assert warning.type == "Warning"
            assert re.search(r"^The shoot's API server answers slowly \(GET /version took \d+\.\d s\)", warning.message)
            assert warning.involved_object.kind == "Extension"
            assert await served(api, shoot.namespace, reason="HealthCheckSuccessful")
            registry = extension.controller.metrics.registry

            def slow() -> float | None:
                labels = {"namespace": shoot.namespace}
                return registry.get_sample_value("machine_preservation_shoot_api_server_slow", labels)

            assert slow() == 1

            proxy.delay = 0.0
            await eventually_async(lambda: slow() == 0, limit=30)
            assert await served(api, shoot.namespace, reason="HealthCheckSuccessful")
        finally:
            await proxy.cut()


async def _event(api: client.ApiClient, namespace: str, reason: str) -> Any:
    """The extension's Event about the namespace's Extension with this reason, or None."""
    listed = await client.CoreV1Api(api).list_namespaced_event(namespace)
    return next((e for e in listed.items if e.reason == reason and e.involved_object.kind == "Extension"), None)


async def test_force_deletion_waits_for_nothing_in_the_shoot(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await gardener.apply_extension(api, shoot.namespace)
        await eventually_async(lambda: served(api, shoot.namespace), limit=30)
        # The shoot is broken, as when its owner resorts to force deletion: its API server and its GRM are gone.
        await asyncio.to_thread(shoot.grm.stop)
        await asyncio.to_thread(shoot.plane.stop)
        started = time.monotonic()
        await gardener.force_delete_shoot(api, shoot.namespace, workers=[gardener.worker("worker1")])

        # The finalizer goes promptly (a Delete would wait a minute for GRM, then report an Error, again and again).
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=15, interval=0.2)
        print(f"force-deleted Extension gone {time.monotonic() - started:.1f} s after its deletion")
        # The ManagedResource is being deleted with keepObjects: its finalizer asks nothing of the broken shoot
        # (gardenlet's force deletion removes what is left); our Secrets are gone.
        managed = await managed_resource(api, shoot.namespace)
        assert managed is not None
        assert managed["spec"]["keepObjects"] is True
        assert managed["metadata"].get("deletionTimestamp")
        secrets = await client.CoreV1Api(api).list_namespaced_secret(shoot.namespace)
        names = {s.metadata.name for s in secrets.items if s.metadata is not None}
        assert shoot_resources.SHOOT_ACCESS_SECRET not in names
        assert not [n for n in names if n.startswith(shoot_resources.MANAGED_RESOURCE_SECRET)]
        assert shoot.namespace not in extension.controller.supervisor.namespaces()  # type: ignore[union-attr]


async def _gone(api: client.ApiClient, namespace: str) -> bool:
    return await read_extension(api, namespace) is None


async def test_a_bad_provider_config_is_an_error_naming_the_field_and_the_shoot_stays_served(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await gardener.apply_extension(
            api,
            shoot.namespace,
            provider_config={
                "apiVersion": "machine-preservation.extensions.gardener.cloud/v1alpha1",
                "kind": "PreservationConfig",
                "workers": [{"name": "worker1", "machinePreserveTimeout": "three days"}],
            },
        )

        async def errored() -> dict[str, Any] | None:
            obj = await read_extension(api, shoot.namespace)
            return obj if obj and (obj.get("status") or {}).get("lastError") else None

        obj = await eventually_async(errored, limit=30)
        assert obj["status"]["lastOperation"]["state"] == "Error"
        # Named as the Shoot owner finds it: the Shoot's field, judged with the garden admission's words.
        description = obj["status"]["lastError"]["description"]
        assert "spec.extensions[0].providerConfig.workers[0].machinePreserveTimeout" in description
        # Gardener's code for it: gardenlet tells the Shoot owner it is theirs to fix, and does not retry blindly.
        assert obj["status"]["lastError"]["codes"] == ["ERR_CONFIGURATION_PROBLEM"]
        assert gardener.extension_ready(obj) is not None
        # Everything else is provisioned all the same.
        await eventually_async(lambda: shoot_webhooks(shoot), limit=20)

        # Fixed by the shoot owner: the next reconcile succeeds.
        await gardener.apply_extension(api, shoot.namespace, provider_config=None)
        await client.CustomObjectsApi(api).patch_namespaced_custom_object(
            gardener.EXTENSIONS_GROUP,
            gardener.EXTENSIONS_VERSION,
            shoot.namespace,
            "extensions",
            gardener.EXTENSION_TYPE,
            {"spec": {"providerConfig": None}},
            _content_type=MERGE_PATCH,
        )
        await gardener.request_operation(api, shoot.namespace, "reconcile")
        await ready(api, shoot.namespace)
        await gardener.delete_extension(api, shoot.namespace)
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=30)


async def test_a_new_ca_reaches_every_shoot(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with (
        new_shoot(seed, api, tmp_path / "a") as first,
        new_shoot(seed, api, tmp_path / "b") as second,
    ):
        for shoot in (first, second):
            await gardener.apply_extension(api, shoot.namespace)
        for shoot in (first, second):
            await ready(api, shoot.namespace)
        rotated = new_ca_pem("rotated-ca")
        await client.CoreV1Api(api).patch_namespaced_secret(
            extension.options.ca_secret[1],
            extension.namespace,
            {"data": {CA_BUNDLE_KEY: base64.b64encode(rotated).decode()}},
            _content_type=MERGE_PATCH,
        )

        async def rotated_in(shoot: BareShoot) -> bool:
            webhooks = await shoot_webhooks(shoot)
            return bool(webhooks) and all(
                base64.b64decode(w["clientConfig"]["caBundle"]) == rotated
                for w in webhooks["webhooks"]  # type: ignore[index]
            )

        for shoot in (first, second):
            await eventually_async(lambda s=shoot: rotated_in(s), limit=30)  # type: ignore[misc]
        for shoot in (first, second):
            await gardener.delete_extension(api, shoot.namespace)
        for shoot in (first, second):
            await eventually_async(lambda s=shoot: _gone(api, s.namespace), limit=30)  # type: ignore[misc]


async def test_migrate_keeps_the_shoots_objects_and_restore_takes_them_over(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await gardener.apply_extension(api, shoot.namespace)
        await ready(api, shoot.namespace)
        before = await eventually_async(lambda: shoot_webhooks(shoot), limit=20)

        # The source seed's gardenlet migrates: the shoot's objects stay, ours in the seed go, nothing holds the
        # Extension any more.
        await gardener.request_operation(api, shoot.namespace, "migrate")

        async def migrated() -> dict[str, Any] | None:
            obj = await read_extension(api, shoot.namespace)
            last = ((obj or {}).get("status") or {}).get("lastOperation") or {}
            done = last.get("type") == "Migrate" and last.get("state") == "Succeeded"
            return obj if done and gardener.OPERATION_ANNOTATION not in obj["metadata"].get("annotations", {}) else None  # type: ignore[index]

        obj = await eventually_async(migrated, limit=30)
        assert not obj["metadata"].get("finalizers")
        assert shoot.namespace not in extension.controller.supervisor.namespaces()  # type: ignore[union-attr]
        custom = client.CustomObjectsApi(api)
        managed = await custom.list_namespaced_custom_object(
            gardener.RESOURCES_GROUP, gardener.RESOURCES_VERSION, shoot.namespace, "managedresources"
        )
        assert not managed["items"]
        secrets = await client.CoreV1Api(api).list_namespaced_secret(shoot.namespace)
        assert shoot_resources.SHOOT_ACCESS_SECRET not in {s.metadata.name for s in secrets.items if s.metadata}
        kept = await shoot_webhooks(shoot)
        assert kept is not None
        assert kept["webhooks"] == before["webhooks"]
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            gardener.EXTENSIONS_GROUP,
            gardener.EXTENSIONS_VERSION,
            shoot.namespace,
            "extensions",
            gardener.EXTENSION_TYPE,
        )
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=10)

        # The destination seed's gardenlet (the same seed here): the Extension waits for its state, then restores.
        await gardener.apply_extension(api, shoot.namespace, operation="wait-for-state")
        await asyncio.sleep(2)  # a wait-for-state object is left alone
        waiting = await read_extension(api, shoot.namespace)
        assert waiting is not None
        assert not (waiting.get("status") or {}).get("lastOperation")
        await gardener.request_operation(api, shoot.namespace, "restore")
        restored = await ready(api, shoot.namespace)
        assert restored["status"]["lastOperation"]["type"] == "Restore"
        assert contract.FINALIZER in restored["metadata"]["finalizers"]

        await eventually_async(lambda: served(api, shoot.namespace), limit=30)
        await gardener.delete_extension(api, shoot.namespace)
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=30)


async def test_hibernation_pauses_the_shoots_lifecycle_and_waking_up_resumes_it(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await gardener.apply_extension(api, shoot.namespace)
        await ready(api, shoot.namespace)
        supervisor = extension.controller.supervisor
        assert supervisor is not None

        await eventually_async(lambda: served(api, shoot.namespace, reason="HealthCheckSuccessful"), limit=30)
        workers = [gardener.worker("worker1")]
        await gardener.update_cluster_shoot(
            api, shoot.namespace, gardener.shoot_manifest(shoot.namespace, workers=workers, hibernated=True)
        )
        await eventually_async(lambda: shoot.namespace not in supervisor.namespaces(), limit=10)

        async def hibernated() -> bool:
            found = await served(api, shoot.namespace, reason="HealthCheckSuccessful")
            return found is not None and found["message"] == "Shoot is hibernated"

        await eventually_async(hibernated, limit=10)
        await gardener.update_cluster_shoot(
            api, shoot.namespace, gardener.shoot_manifest(shoot.namespace, workers=workers, hibernated=False)
        )

        async def awake() -> bool:  # served again, not hibernated (the same reason, another message)
            found = await served(api, shoot.namespace, reason="HealthCheckSuccessful")
            return found is not None and found["message"].startswith("All health checks successful")

        await eventually_async(awake, limit=30)
        assert shoot.namespace in supervisor.namespaces()
        await gardener.delete_extension(api, shoot.namespace)
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=30)


async def test_a_restart_at_any_point_loses_nothing(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        await gardener.apply_extension(api, shoot.namespace)

        async def started() -> bool:
            obj = await read_extension(api, shoot.namespace)
            return bool(obj and (obj.get("status") or {}).get("lastOperation"))

        await eventually_async(started, limit=30, interval=0.01)
        await extension.crash_and_restart()  # mid-Create
        await ready(api, shoot.namespace)

        await eventually_async(lambda: served(api, shoot.namespace), limit=30)
        await eventually_async(lambda: shoot_webhooks(shoot), limit=20)

        await gardener.delete_extension(api, shoot.namespace)

        async def deleting() -> bool:
            obj = await read_extension(api, shoot.namespace)
            return bool(obj and obj["metadata"].get("deletionTimestamp"))

        await eventually_async(deleting, limit=10, interval=0.01)
        await extension.crash_and_restart()  # mid-Delete
        await eventually_async(lambda: _gone(api, shoot.namespace), limit=30)
        assert await shoot_webhooks(shoot) is None


class _Failing:
    """An actuator whose every operation fails as `failure` says."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure

    async def reconcile(self, *_: Any) -> str | None:
        raise self.failure


class _One:
    """An informer's `get` over one object."""

    def __init__(self, key: str, value: Any) -> None:
        self.key, self.value = key, value

    def get(self, key: str) -> Any:
        return self.value if key == self.key else None


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (TimeoutError(), "TimeoutError"),
        (aiohttp.ClientConnectionError("Cannot connect to host"), "Cannot connect to host"),
        (pydantic.ValidationError.from_exception_data("Extension", []), "validation errors for Extension"),
        (KeyError("spec"), "'spec'"),
    ],
    ids=["timeout", "aiohttp", "pydantic", "anything"],
)
async def test_every_failure_of_an_operation_ends_in_error_not_processing(
    seed: ControlPlane, api: client.ApiClient, failure: Exception, said: str
) -> None:
    namespace = f"shoot--fail--{uuid.uuid4().hex[:5]}"
    await gardener.create_shoot_namespace(api, namespace)
    raw = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        gardener.EXTENSIONS_GROUP,
        gardener.EXTENSIONS_VERSION,
        namespace,
        "extensions",
        gardener.extension_manifest(namespace),
    )
    reconciler = ExtensionReconciler(
        seed=api,
        extensions=_One(f"{namespace}/{contract.EXTENSION_TYPE}", contract.Extension.model_validate(raw)),  # type: ignore[arg-type]
        clusters=_One("", None),  # type: ignore[arg-type]
        clock=lambda: dt.datetime.now(dt.UTC),
        actuator=_Failing(failure),  # type: ignore[arg-type]
    )
    with pytest.raises(type(failure)):
        await reconciler.reconcile(namespace)
    status = (await read_extension(api, namespace))["status"]
    assert status["lastOperation"]["state"] == "Error"
    assert said in status["lastError"]["description"]
    assert status["lastError"]["description"].startswith("Error reconciling the Extension: ")


async def test_an_extension_of_another_class_is_left_alone(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    async with new_shoot(seed, api, tmp_path) as shoot:
        manifest = gardener.extension_manifest(shoot.namespace)
        manifest["spec"]["class"] = "garden"  # under our name and type, but for the garden's extension controller
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            gardener.EXTENSIONS_GROUP, gardener.EXTENSIONS_VERSION, shoot.namespace, "extensions", manifest
        )
        await asyncio.sleep(3)
        found = await read_extension(api, shoot.namespace)
        assert found is not None
        assert not found["metadata"].get("finalizers")
        assert not (found.get("status") or {}).get("lastOperation")
        assert shoot.namespace not in extension.controller.supervisor.namespaces()  # type: ignore[union-attr]


async def test_every_seed_wide_watch_that_ends_is_started_again(
    seed: ControlPlane, api: client.ApiClient, extension: Extension, tmp_path: Path
) -> None:
    """Each seed-wide informer is broken once (its next event handling raises what its own retries do not cover):
    it is started again and lists anew, readiness says false meanwhile, and the extension goes on serving."""
    controller = extension.controller
    await eventually_async(controller.ready, limit=30)
    broken: list[str] = []

    def break_once(informer: Any) -> None:
        original = informer._apply

        def raising(*args: Any, **kwargs: Any) -> None:
            informer._apply = original
            broken.append(informer.name)
            raise RuntimeError(f"{informer.name}: broken by the test")

        informer._apply = raising

    informers = {informer.name: informer for informer in controller.informers}
    names = sorted(informer.name for informer in controller.informers)
    assert names.count("clusters") == 1, "one watch of the Clusters, for the contract and every shoot's runtime"
    for informer in controller.informers:
        break_once(informer)
    unready: list[float] = []

    async def watch_readiness() -> None:
        while True:
            if not controller.ready():
                unready.append(time.monotonic())
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_readiness())
    try:
        async with new_shoot(seed, api, tmp_path) as shoot:  # namespace, Cluster, kubeconfig: Cluster events
            await gardener.apply_extension(api, shoot.namespace)  # Extension and ManagedResource events
            custom = client.CustomObjectsApi(api)
            for plural, kind in (
                ("machinedeployments", "MachineDeployment"),
                ("machinesets", "MachineSet"),
                ("machines", "Machine"),
            ):
                await custom.create_namespaced_custom_object(
                    *MACHINES,
                    shoot.namespace,
                    plural,
                    {
                        "apiVersion": f"{MACHINES[0]}/{MACHINES[1]}",
                        "kind": kind,
                        "metadata": {"name": "broken-watch"},
                        "spec": {} if kind == "Machine" else {"template": {"spec": {}}},
                    },
                )
            await client.CoreV1Api(api).patch_namespaced_secret(  # the CA Secret's informer
                extension.options.ca_secret[1],
                extension.namespace,
                {"metadata": {"labels": {"touched": "true"}}},
                _content_type=MERGE_PATCH,
            )
            await eventually_async(lambda: set(broken) == set(informers), limit=30)
            await eventually_async(controller.ready, limit=30)
            assert unready, "readiness said false while a cache was listed anew"
            # Every cache follows the seed again: the objects made after the break are in it.
            assert informers["machines"].get(f"{shoot.namespace}/broken-watch") is not None
            assert informers["machinedeployments"].get(f"{shoot.namespace}/broken-watch") is not None
            await eventually_async(lambda: served(api, shoot.namespace), limit=30)
            await gardener.delete_extension(api, shoot.namespace)
            await eventually_async(lambda: _gone(api, shoot.namespace), limit=30)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert sorted(broken) == names, "each broken once"
