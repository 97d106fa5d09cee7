"""Run the whole controller in the test's event loop against the real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ConflictException

from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.preservation.runtime import RuntimeOptions
from machine_preservation.controller.standalone import Controller, ControllerOptions
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import product as mp
from machine_preservation.localcluster.toolchain import ensure_toolchain
from tests.polling import eventually_async


@dataclasses.dataclass
class Running:
    controller: Controller
    stop: asyncio.Event
    task: asyncio.Task[int]

    async def shutdown(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, 60)


async def chart_identity(
    admin_kubeconfig: Path, namespace: str, *, leader_election: bool, component: str = "controller"
) -> Path:
    """A kubeconfig of the standalone chart's `component` ServiceAccount (controller or webhook; release in
    `namespace`, serving it), under the RBAC the chart ships: the tests run the product as users run it, never as an
    administrator."""
    admin = await new_api_client(kubeconfig=admin_kubeconfig)
    try:
        rbac = await asyncio.to_thread(
            mp.render_component_rbac,
            helm=ensure_toolchain().helm,
            control_namespace=namespace,
            release_namespace=namespace,
            leader_election=leader_election,
        )
        account = mp.component_users(namespace)[component].rpartition(":")[2]
        core = client.CoreV1Api(admin)
        with contextlib.suppress(ConflictException):  # there already (a second controller of the same test)
            await core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})  # type: ignore[arg-type]
        with contextlib.suppress(ConflictException):
            await mp.apply_manifests(admin, rbac)
        document = yaml.safe_load(await asyncio.to_thread(admin_kubeconfig.read_text))
        server = document["clusters"][0]["cluster"]["server"]
        answer = await core.create_namespaced_service_account_token(
            account,
            namespace,
            {"spec": {"audiences": [server], "expirationSeconds": 3600}},  # type: ignore[arg-type]
        )
    finally:
        await admin.close()
    assert answer.status is not None
    document["users"] = [{"name": account, "user": {"token": answer.status.token}}]
    for context in document["contexts"]:
        context["context"]["user"] = account
    path = admin_kubeconfig.parent / f"{component}-{namespace}.kubeconfig"
    await asyncio.to_thread(path.write_text, yaml.safe_dump(document))
    await asyncio.to_thread(path.chmod, 0o600)
    return path


def with_runtime_options(settings: dict[str, Any]) -> tuple[dict[str, Any], RuntimeOptions]:
    """Tests name a process's options flat; those of every namespace's runtime go into one `RuntimeOptions`."""
    names = {f.name for f in dataclasses.fields(RuntimeOptions)}
    runtime = RuntimeOptions(**{key: value for key, value in settings.items() if key in names})
    return {key: value for key, value in settings.items() if key not in names}, runtime


@contextlib.asynccontextmanager
async def running_controller(
    *, kubeconfig: Path, namespace: str, metrics: Metrics | None = None, **options: Any
) -> AsyncIterator[Running]:
    """The controller with `options` (ControllerOptions' fields), as the chart's controller identity under the chart's
    RBAC (`kubeconfig`: an administrator's, which sets that up); `metrics` may hook into its API clients."""
    # Not native by default: the test control plane's CRDs carry v0.62's preservation fields, which `auto` would
    # take for an MCM that preserves itself, and these tests exercise the controller's own lifecycle.
    settings: dict[str, Any] = {
        "leader_elect": False,
        "metrics_port": 0,
        "resync_period": 600.0,
        "native_preservation": NativePreservationMode.FALSE,
    }
    settings.update(options)
    kubeconfig = await chart_identity(kubeconfig, namespace, leader_election=bool(settings["leader_elect"]))
    process, runtime = with_runtime_options(settings)
    controller = Controller(
        options=ControllerOptions(
            namespace=namespace, control_kubeconfig=kubeconfig, target_kubeconfig=kubeconfig, runtime=runtime, **process
        ),
        metrics=metrics or Metrics(),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    running = Running(controller=controller, stop=stop, task=task)
    try:
        if not settings["leader_elect"]:
            await eventually_async(
                lambda: task.done() or (controller.caches is not None and controller.caches.synced())
            )
            if task.done():
                task.result()  # surface a startup failure
        yield running
    finally:
        if not task.done():
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)
