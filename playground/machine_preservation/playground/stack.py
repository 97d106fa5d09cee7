"""Everything the playground runs, started in order and torn down in reverse.

- the local control plane (etcd, kube-apiserver, kube-controller-manager) with MCM v0.61.3's own CRDs, our
  Shoot CRD and Gardener's `Cluster` CRD;
- the webhook, as its own process (`machine-preservation webhook --self-signed`), and the webhook
  configurations rendered from the Helm chart, pointed at it by URL;
- the controller, as its own process (`machine-preservation controller`); its flags keep the product's
  default timeout, so the short one the playground shows comes from the Shoot's pools (via the `Cluster`);
- the real machine-controller-manager (its controller-manager and a provider machine controller whose fake
  cloud registers the Nodes), built from its Go module, as MCM's own identity under a ClusterRole of what it
  uses;
- fake kubelets, in this process: they keep each Node's Ready condition as the walk-through set it and
  finish the termination of evicted pods.

Each component authenticates with its own identity (a client certificate whose user name is the chart's
ServiceAccount user name), as in a real landscape, so the webhook's identity rules apply for real, and the
webhook and the controller run under exactly the RBAC the chart grants them (rendered from the chart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.aio import client

from machine_preservation.localcluster import product
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.crds import install_crds
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import FakeKubelets
from machine_preservation.localcluster.mcm_runner import MCM_USERNAME, McmRunner, McmSettings
from machine_preservation.localcluster.product import RELEASE_NAMESPACE, api_client_for, component_users
from machine_preservation.localcluster.toolchain import Toolchain

logger = logging.getLogger(__name__)

# The chart installed as release "mp" into namespace "mp" (see localcluster/product.py for the identities).
IDENTITIES = {**component_users(RELEASE_NAMESPACE), "mcm": MCM_USERNAME}
# The controller's own default: the timeouts the walk-through shows must come from the Shoot's pools.
CONTROLLER_PRESERVE_TIMEOUT = "72h"
# MCM's flags, shortened by configuration. The health timeout is 0: MCM checks an Unknown machine's timeout
# only when something changes it, else a minute later, so with a few seconds' timeout a failure would take
# between seconds and a minute to become Failed; with 0 it is Failed on the check right after Unknown.
MCM_SETTINGS = McmSettings(machine_health_timeout="0s", machine_drain_timeout="30s", verbosity=2)


@dataclass
class Stack:
    directory: Path
    toolchain: Toolchain
    control_plane: ControlPlane
    admin: client.ApiClient
    kubeconfigs: dict[str, Path]
    mcm: McmRunner
    kubelets: FakeKubelets
    webhook_port: int = 0
    controller_metrics_port: int = 0
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _background: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @property
    def admin_kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def log_file(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    async def stop(self) -> None:
        await self._background.aclose()
        await asyncio.to_thread(self.mcm.stop)
        for name, process in reversed(self._processes.items()):
            await product.stop_process(name, process)
        self._processes.clear()
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
        if not self.mcm.running():
            raise RuntimeError(f"machine-controller-manager exited:\n{self.mcm.log_tail(20)}")


async def start_stack(*, directory: Path, toolchain: Toolchain, namespace: str, mcm_bin: Path | None = None) -> Stack:
    """Start every component; on any failure, stop what was started and re-raise. `mcm_bin`: where MCM's
    binaries are (built if not given)."""
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(directory=directory / "cluster", bin_dir=toolchain.bin_dir)
    await asyncio.to_thread(plane.start)
    stack: Stack | None = None
    try:
        await asyncio.to_thread(install_crds, plane.kubeconfig, mcm_version=DEFAULT_MCM_VERSION)
        mcm = McmRunner(plane=plane, namespace=namespace, directory=directory / "mcm", version=DEFAULT_MCM_VERSION,
                        settings=MCM_SETTINGS, bin_dir=mcm_bin)  # fmt: skip
        kubeconfigs = {
            role: plane.write_kubeconfig(directory / f"{role}.kubeconfig", user=user)
            for role, user in IDENTITIES.items()
            if role != "mcm"
        }
        # MCM's own (McmRunner writes it with the service account's groups); for kubectl as MCM.
        kubeconfigs["mcm"] = mcm.directory / "mcm.kubeconfig"
        admin = await api_client_for(plane.kubeconfig)
        await product.apply_manifests(
            admin,
            await asyncio.to_thread(product.render_component_rbac, helm=toolchain.helm, control_namespace=namespace),
        )
        stack = Stack(directory=directory, toolchain=toolchain, control_plane=plane, admin=admin,
                      kubeconfigs=kubeconfigs, mcm=mcm, kubelets=FakeKubelets(admin, namespace))  # fmt: skip
        await _start_webhook(stack)
        await _register_webhooks(stack, control_namespace=namespace)
        await _start_controller(stack, namespace=namespace)
        # MCM last: its first deletes already meet the deletion guard, and the controller is watching.
        await asyncio.to_thread(mcm.start)
        await stack._background.enter_async_context(stack.kubelets.running())
    except BaseException:
        if stack is not None:
            await stack.stop()
        else:
            plane.stop()
        raise
    return stack


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


async def _start_controller(stack: Stack, *, namespace: str) -> None:
    stack.controller_metrics_port = free_port()
    process = stack._spawn(
        "controller",
        product.controller_args(
            kubeconfig=stack.kubeconfigs["controller"],
            namespace=namespace,
            preserve_timeout=CONTROLLER_PRESERVE_TIMEOUT,
            metrics_port=stack.controller_metrics_port,
        ),
    )
    await product.wait_controller_ready(
        process, metrics_port=stack.controller_metrics_port, log_file=stack.log_file("controller")
    )
