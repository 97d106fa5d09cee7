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
import base64
import contextlib
import datetime as dt
import logging
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes.aio import client, config

from machine_preservation.cluster.controlplane import ControlPlane, free_port
from machine_preservation.cluster.crds import install_crds
from machine_preservation.cluster.toolchain import Toolchain
from machine_preservation.standin.mcm import MCM_USERNAME, McmStandIn

logger = logging.getLogger(__name__)

# The chart installed as release "mp" into namespace "mp" with fullnameOverride "mp": its ServiceAccounts are
# mp/mp-controller and mp/mp-webhook. RBAC matches a ServiceAccount subject by the user name
# system:serviceaccount:<namespace>:<name>, so client certificates with these common names (an X.509 common
# name has at most 64 characters: the default release names would not fit) get exactly the chart's roles.
RELEASE_NAMESPACE = "mp"
IDENTITIES = {
    "controller": f"system:serviceaccount:{RELEASE_NAMESPACE}:mp-controller",
    "mcm": MCM_USERNAME,
    "webhook": f"system:serviceaccount:{RELEASE_NAMESPACE}:mp-webhook",
}
READY_TIMEOUT = 60.0


def chart_directory() -> Path:
    # src/machine_preservation/playground/stack.py -> repository root
    chart = Path(__file__).resolve().parents[3] / "charts" / "machine-preservation"
    if not chart.is_dir():
        raise FileNotFoundError(f"the Helm chart is not at {chart}: run the playground from a source checkout")
    return chart


async def api_client_for(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration=configuration)


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
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", name)
                process.kill()
                await asyncio.to_thread(process.wait)
        self._processes.clear()
        await self.standin.api.close()  # type: ignore[no-untyped-call]
        await self.admin.close()  # type: ignore[no-untyped-call]
        self.control_plane.stop()

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log: IO[bytes] = self.log_file(name).open("ab")
        with log:
            process = subprocess.Popen(
                [sys.executable, "-m", "machine_preservation", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._processes[name] = process
        return process

    def check_processes(self) -> None:
        """Raise if a component died, with the end of its log."""
        for name, process in self._processes.items():
            if process.poll() is not None:
                tail = "\n".join(self.log_file(name).read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"{name} exited with code {process.returncode}:\n{tail}")


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
        await _apply_chart_rbac(admin, helm=toolchain.helm, control_namespace=namespace)
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
    process = stack._spawn(
        "webhook",
        [
            "webhook",
            "--host=127.0.0.1",
            f"--port={stack.webhook_port}",
            f"--cert-dir={cert_dir}",
            "--self-signed",
            f"--kubeconfig={stack.kubeconfigs['webhook']}",
            f"--controller-username={IDENTITIES['controller']}",
            f"--mcm-username={MCM_USERNAME}",
        ],
    )
    deadline = asyncio.get_running_loop().time() + READY_TIMEOUT
    while not await _https_ok(port=stack.webhook_port, path="/readyz", cafile=cert_dir / "ca.crt"):
        stack.check_processes()
        if asyncio.get_running_loop().time() > deadline or process.poll() is not None:
            raise RuntimeError(f"the webhook did not become ready; see {stack.log_file('webhook')}")
        await asyncio.sleep(0.2)


async def _https_ok(*, port: int, path: str, cafile: Path) -> bool:
    try:
        context = ssl.create_default_context(cafile=str(cafile))
    except FileNotFoundError:  # the webhook has not written its certificates yet
        return False
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
    except (OSError, ssl.SSLError):
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        return status_line.split(b" ")[1:2] == [b"200"]
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def render_component_rbac(*, helm: Path, control_namespace: str) -> list[dict[str, Any]]:
    """The chart's Roles, ClusterRoles and their bindings for the webhook and the controller."""
    result = subprocess.run(
        [
            str(helm), "template", "mp", str(chart_directory()),
            "--namespace", RELEASE_NAMESPACE,
            "--set", "fullnameOverride=mp",
            "--set", f"clusters.control.namespace={control_namespace}",
            "--set", "controller.leaderElection.enabled=false",
            "--show-only", "templates/controller-rbac.yaml",
            "--show-only", "templates/webhook-rbac.yaml",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(result.stdout) if d]


async def _apply_chart_rbac(admin: client.ApiClient, *, helm: Path, control_namespace: str) -> None:
    manifests = await asyncio.to_thread(render_component_rbac, helm=helm, control_namespace=control_namespace)
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    for name in (RELEASE_NAMESPACE, control_namespace):  # the Roles live in both
        await core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    for manifest in manifests:
        match manifest["kind"]:
            case "Role":
                await rbac.create_namespaced_role(manifest["metadata"]["namespace"], manifest)  # type: ignore[arg-type]
            case "RoleBinding":
                namespace = manifest["metadata"]["namespace"]
                await rbac.create_namespaced_role_binding(namespace, manifest)  # type: ignore[arg-type]
            case "ClusterRole":
                await rbac.create_cluster_role(manifest)  # type: ignore[arg-type]
            case "ClusterRoleBinding":
                await rbac.create_cluster_role_binding(manifest)  # type: ignore[arg-type]
            case kind:
                raise ValueError(f"unexpected {kind} among the chart's RBAC manifests")


def render_webhook_configurations(
    *, helm: Path, url: str, ca_bundle: bytes, control_namespace: str
) -> list[dict[str, Any]]:
    """The chart's webhook configurations, registered in this one cluster and pointed at `url`; the Machine
    webhooks judge `control_namespace` only."""
    result = subprocess.run(
        [
            str(helm), "template", "machine-preservation", str(chart_directory()),
            "--namespace", "machine-preservation",
            "--set", "webhook.enabled=false",
            "--set", "controller.enabled=false",
            "--set", "rbac.create=false",
            "--set", f"webhooks.clientConfig.url={url}",
            "--set", "webhooks.shoots.register=true",
            "--set", "certificates.mode=provided",
            "--set", f"certificates.provided.caBundle={base64.b64encode(ca_bundle).decode()}",
            "--set", f"webhook.controllerUsername={IDENTITIES['controller']}",
            "--set", f"clusters.control.namespace={control_namespace}",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    return [d for d in documents if d.get("kind") in kinds]


async def _register_webhooks(stack: Stack, *, control_namespace: str) -> None:
    ca_bundle = (stack.directory / "webhook-certs" / "ca.crt").read_bytes()
    manifests = await asyncio.to_thread(
        render_webhook_configurations,
        helm=stack.toolchain.helm,
        url=f"https://127.0.0.1:{stack.webhook_port}",
        ca_bundle=ca_bundle,
        control_namespace=control_namespace,
    )
    registration = client.AdmissionregistrationV1Api(stack.admin)
    for manifest in manifests:
        if manifest["kind"] == "ValidatingWebhookConfiguration":
            await registration.create_validating_webhook_configuration(manifest)  # type: ignore[arg-type]
        else:
            await registration.create_mutating_webhook_configuration(manifest)  # type: ignore[arg-type]


def _start_controller(stack: Stack, *, namespace: str, preserve_timeout: dt.timedelta) -> None:
    stack.controller_metrics_port = free_port()
    kubeconfig = stack.kubeconfigs["controller"]
    stack._spawn(
        "controller",
        [
            "controller",
            f"--control-kubeconfig={kubeconfig}",
            f"--target-kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--machine-preserve-timeout={int(preserve_timeout.total_seconds())}s",
            "--no-leader-elect",
            f"--metrics-port={stack.controller_metrics_port}",
        ],
    )
