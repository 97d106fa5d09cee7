"""Everything the playground runs, started in order and torn down in reverse.

- the local control plane (etcd, kube-apiserver, kube-controller-manager) with our CRDs;
- the webhook, as its own process (`machine-preservation webhook --self-signed`), and the webhook
  configurations rendered from the Helm chart, pointed at it by URL;
- the controller, as its own process (`machine-preservation controller`), with a short preserve timeout
  given by configuration (the Machines' spec.machinePreserveTimeout, from the Shoot pools);
- the MCM stand-in, in this process, authenticated as MCM.

Each component authenticates with its own identity (a client certificate whose user name is the chart's
ServiceAccount user name), as in a real landscape, so the webhook's identity rules apply for real, and the
webhook and the controller run under exactly the RBAC the chart grants them (rendered from the chart).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.cluster import product
from machine_preservation.cluster.controlplane import ControlPlane, free_port
from machine_preservation.cluster.crds import install_crds
from machine_preservation.cluster.product import RELEASE_NAMESPACE, api_client_for, component_users
from machine_preservation.cluster.toolchain import Toolchain
from machine_preservation.standin.mcm import MCM_USERNAME, McmStandIn

logger = logging.getLogger(__name__)

# The chart installed as release "mp" into namespace "mp" (see cluster/product.py for the identities).
IDENTITIES = {**component_users(RELEASE_NAMESPACE), "mcm": MCM_USERNAME}


@dataclass
class Stack:
    directory: Path
    toolchain: Toolchain
    control_plane: ControlPlane
    admin: client.ApiClient
    kubeconfigs: dict[str, Path]
    standin: McmStandIn
    webhook_port: int = 0
    controller_metrics_port: int = 0
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def admin_kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def log_file(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    async def stop(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for name, process in reversed(self._processes.items()):
            await product.stop_process(name, process)
        self._processes.clear()
        await self.standin.api.close()  # type: ignore[no-untyped-call]
        await self.admin.close()  # type: ignore[no-untyped-call]
        self.control_plane.stop()

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        process = product.spawn(args, log_file=self.log_file(name))
        self._processes[name] = process
        return process

    def check_processes(self) -> None:
        """Raise if a component died, with the end of its log."""
        for name, process in self._processes.items():
            problem = product.exited(name, process, self.log_file(name))
            if problem is not None:
                raise RuntimeError(problem)


async def start_stack(
    *, directory: Path, toolchain: Toolchain, namespace: str, preserve_timeout: dt.timedelta
) -> Stack:
    """Start every component; on any failure, stop what was started and re-raise."""
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(directory=directory / "cluster", bin_dir=toolchain.bin_dir)
    await asyncio.to_thread(plane.start)
    stack: Stack | None = None
    try:
        await asyncio.to_thread(install_crds, plane.kubeconfig)
        kubeconfigs = {
            role: plane.write_kubeconfig(directory / f"{role}.kubeconfig", user=user)
            for role, user in IDENTITIES.items()
        }
        admin = await api_client_for(plane.kubeconfig)
        await _grant_cluster_admin(admin, [IDENTITIES["mcm"]])
        await product.apply_manifests(
            admin,
            await asyncio.to_thread(product.render_component_rbac, helm=toolchain.helm, control_namespace=namespace),
        )
        standin = McmStandIn(api=await api_client_for(kubeconfigs["mcm"]), namespace=namespace)
        stack = Stack(directory=directory, toolchain=toolchain, control_plane=plane, admin=admin,
                      kubeconfigs=kubeconfigs, standin=standin)  # fmt: skip
        await _start_webhook(stack)
        await _register_webhooks(stack, control_namespace=namespace)
        _start_controller(stack, namespace=namespace, preserve_timeout=preserve_timeout)
        stack._tasks.append(asyncio.create_task(standin.run(stack._stopping)))
    except BaseException:
        if stack is not None:
            await stack.stop()
        else:
            plane.stop()
        raise
    return stack


async def _grant_cluster_admin(admin: client.ApiClient, users: Any) -> None:
    # Only the MCM stand-in: it plays MCM, the kubelets and the cloud provider at once.
    rbac = client.RbacAuthorizationV1Api(admin)
    await rbac.create_cluster_role_binding(
        {  # type: ignore[arg-type]
            "metadata": {"name": "playground-components"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user} for user in users],
        }
    )


async def _start_webhook(stack: Stack) -> None:
    stack.webhook_port = free_port()
    cert_dir = stack.directory / "webhook-certs"
    args = product.webhook_args(
        port=stack.webhook_port,
        cert_dir=cert_dir,
        kubeconfig=stack.kubeconfigs["webhook"],
        controller_username=IDENTITIES["controller"],
        mcm_usernames=[MCM_USERNAME],
    )
    process = stack._spawn("webhook", args)
    await product.wait_webhook_ready(
        process, port=stack.webhook_port, cafile=cert_dir / "ca.crt", log_file=stack.log_file("webhook")
    )


async def _register_webhooks(stack: Stack, *, control_namespace: str) -> None:
    manifests = await asyncio.to_thread(
        product.render_webhook_configurations,
        helm=stack.toolchain.helm,
        url=f"https://127.0.0.1:{stack.webhook_port}",
        ca_bundle=(stack.directory / "webhook-certs" / "ca.crt").read_bytes(),
        control_namespace=control_namespace,
        controller_username=IDENTITIES["controller"],
    )
    await product.apply_manifests(stack.admin, manifests)


def _start_controller(stack: Stack, *, namespace: str, preserve_timeout: dt.timedelta) -> None:
    stack.controller_metrics_port = free_port()
    stack._spawn(
        "controller",
        product.controller_args(
            kubeconfig=stack.kubeconfigs["controller"],
            namespace=namespace,
            preserve_timeout=f"{int(preserve_timeout.total_seconds())}s",
            metrics_port=stack.controller_metrics_port,
        ),
    )
