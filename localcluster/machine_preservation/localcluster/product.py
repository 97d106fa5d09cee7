"""Our product as a landscape runs it, on a local control plane: the webhook and the controller as their own
processes, with the chart's RBAC and the chart's webhook configurations (developer tooling for the playground
and the end-to-end tests; not part of the image).

Each component authenticates with a client certificate whose user name is the chart's ServiceAccount user
(`component_users`), so RBAC rendered from the chart (`render_component_rbac`, `apply_manifests`) grants it
exactly what a release grants, and the webhook's identity rules apply for real. The chart's webhook
configurations are registered by URL (`render_webhook_configurations`, `apply_manifests`), pointed at the
webhook process. Processes log to a file of their own (`spawn`) and are waited for until ready
(`wait_webhook_ready`, `wait_controller_ready`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import signal
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

logger = logging.getLogger(__name__)

# The chart installed as release "mp" with fullnameOverride "mp": its ServiceAccounts are <namespace>/mp-controller
# and <namespace>/mp-webhook. RBAC matches a ServiceAccount subject by the user name
# system:serviceaccount:<namespace>:<name>, so client certificates with these common names (an X.509 common
# name has at most 64 characters: the default release names would not fit) get exactly the chart's roles.
RELEASE_NAME = "mp"
RELEASE_NAMESPACE = "mp"
READY_TIMEOUT = 60.0
STOP_GRACE = 10.0


def component_users(release_namespace: str = RELEASE_NAMESPACE) -> dict[str, str]:
    """The user names of the release's controller and webhook ServiceAccounts."""
    return {
        "controller": f"system:serviceaccount:{release_namespace}:{RELEASE_NAME}-controller",
        "webhook": f"system:serviceaccount:{release_namespace}:{RELEASE_NAME}-webhook",
    }


def chart_directory() -> Path:
    # localcluster/machine_preservation/localcluster/product.py -> repository root
    chart = Path(__file__).resolve().parents[3] / "charts" / "machine-preservation"
    if not chart.is_dir():
        raise FileNotFoundError(f"the Helm chart is not at {chart}: run this from a source checkout")
    return chart


async def api_client_for(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration=configuration)


# --- the chart's objects ------------------------------------------------------------------------------------


def render_component_rbac(
    *, helm: Path, control_namespace: str, release_namespace: str = RELEASE_NAMESPACE, leader_election: bool = False
) -> list[dict[str, Any]]:
    """The chart's Roles, ClusterRoles and their bindings for the webhook and the controller (with the Lease rights
    of leader election where asked)."""
    result = subprocess.run(
        [
            str(helm), "template", RELEASE_NAME, str(chart_directory()),
            "--namespace", release_namespace,
            "--set", f"fullnameOverride={RELEASE_NAME}",
            "--set", f"clusters.control.namespace={control_namespace}",
            "--set", f"controller.leaderElection.enabled={str(leader_election).lower()}",
            "--show-only", "templates/controller-rbac.yaml",
            "--show-only", "templates/webhook-rbac.yaml",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def render_webhook_configurations(
    *,
    helm: Path,
    url: str,
    ca_bundle: bytes,
    control_namespace: str,
    controller_username: str,
    mcm_usernames: Sequence[str] = (),
    release_name: str = "machine-preservation",
    release_namespace: str = "machine-preservation",
    policies: bool = False,
) -> list[dict[str, Any]]:
    """The chart's webhook configurations, registered in this one cluster and pointed at `url`; the Machine
    webhooks judge `control_namespace` only. Their names carry `release_namespace`, so releases of several
    namespaces live side by side. Empty `mcm_usernames`: the chart's default MCM identity. `policies`: the
    chart's ValidatingAdmissionPolicies (and bindings) as well, which the API server runs in-process."""
    mcm_values = [f"--set=webhook.mcmUsernames[{i}]={user}" for i, user in enumerate(mcm_usernames)]
    result = subprocess.run(
        [
            str(helm), "template", release_name, str(chart_directory()),
            "--namespace", release_namespace,
            "--set", "webhook.enabled=false",
            "--set", "controller.enabled=false",
            "--set", "rbac.create=false",
            "--set", f"webhooks.clientConfig.url={url}",
            "--set", "webhooks.shoots.register=true",
            "--set", "certificates.mode=provided",
            "--set", f"certificates.provided.caBundle={base64.b64encode(ca_bundle).decode()}",
            "--set", f"webhook.controllerUsername={controller_username}",
            "--set", f"clusters.control.namespace={control_namespace}",
            *mcm_values,
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"]
    if policies:
        kinds += ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    return [d for d in documents if d.get("kind") in kinds]


async def apply_manifests(admin: client.ApiClient, manifests: Iterable[dict[str, Any]]) -> None:
    """Create the chart's ServiceAccounts, RBAC objects and webhook configurations (and the namespaces they live
    in)."""
    manifests = list(manifests)
    core = client.CoreV1Api(admin)
    namespaces = sorted({m["metadata"]["namespace"] for m in manifests if m["metadata"].get("namespace")})
    for name in namespaces:
        try:
            await core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
        except ApiException as error:
            if error.status != 409:
                raise
    for manifest in manifests:
        await _call(admin, "create", manifest)


async def delete_manifests(admin: client.ApiClient, manifests: Iterable[dict[str, Any]]) -> None:
    """Delete what `apply_manifests` created (the namespaces stay); already gone is fine."""
    for manifest in reversed(list(manifests)):
        try:
            await _call(admin, "delete", manifest)
        except ApiException as error:
            if error.status != 404:
                raise


async def _call(admin: client.ApiClient, verb: str, manifest: dict[str, Any]) -> None:
    rbac = client.RbacAuthorizationV1Api(admin)
    registration = client.AdmissionregistrationV1Api(admin)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"].get("namespace")
    create = verb == "create"
    match manifest["kind"]:
        case "ServiceAccount":
            core = client.CoreV1Api(admin)
            if create:
                await core.create_namespaced_service_account(namespace, manifest)  # type: ignore[arg-type]
            else:
                await core.delete_namespaced_service_account(name, namespace)
        case "Role":
            if create:
                await rbac.create_namespaced_role(namespace, manifest)  # type: ignore[arg-type]
            else:
                await rbac.delete_namespaced_role(name, namespace)
        case "RoleBinding":
            if create:
                await rbac.create_namespaced_role_binding(namespace, manifest)  # type: ignore[arg-type]
            else:
                await rbac.delete_namespaced_role_binding(name, namespace)
        case "ClusterRole":
            if create:
                await rbac.create_cluster_role(manifest)  # type: ignore[arg-type]
            else:
                await rbac.delete_cluster_role(name)
        case "ClusterRoleBinding":
            if create:
                await rbac.create_cluster_role_binding(manifest)  # type: ignore[arg-type]
            else:
                await rbac.delete_cluster_role_binding(name)
        case "ValidatingWebhookConfiguration":
            if create:
                await registration.create_validating_webhook_configuration(manifest)  # type: ignore[arg-type]
            else:
                await registration.delete_validating_webhook_configuration(name)
        case "MutatingWebhookConfiguration":
            if create:
                await registration.create_mutating_webhook_configuration(manifest)  # type: ignore[arg-type]
            else:
                await registration.delete_mutating_webhook_configuration(name)
        case "ValidatingAdmissionPolicy":
            if create:
                await registration.create_validating_admission_policy(manifest)  # type: ignore[arg-type]
            else:
                await registration.delete_validating_admission_policy(name)
        case "ValidatingAdmissionPolicyBinding":
            if create:
                await registration.create_validating_admission_policy_binding(manifest)  # type: ignore[arg-type]
            else:
                await registration.delete_validating_admission_policy_binding(name)
        case kind:
            raise ValueError(f"unexpected {kind} among the chart's manifests")


# --- the processes --------------------------------------------------------------------------------------------


def webhook_args(
    *,
    port: int,
    cert_dir: Path,
    kubeconfig: Path,
    controller_username: str,
    mcm_usernames: Sequence[str],
    native: str | None = None,
    control_namespace: str | None = None,
    max_preserve_timeout: str | None = None,
) -> list[str]:
    """`machine-preservation webhook` on 127.0.0.1:`port` with a self-signed CA written to `cert_dir`."""
    args = [
        "webhook",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--cert-dir={cert_dir}",
        "--self-signed",
        f"--kubeconfig={kubeconfig}",
        f"--controller-username={controller_username}",
        *(f"--mcm-username={user}" for user in mcm_usernames),
    ]
    if native is not None:
        args.append(f"--mcm-native-preservation={native}")
    if control_namespace is not None:
        args.append(f"--control-namespace={control_namespace}")
    if max_preserve_timeout is not None:
        args.append(f"--max-preserve-timeout={max_preserve_timeout}")
    return args


def controller_args(
    *,
    kubeconfig: Path,
    namespace: str,
    preserve_timeout: str,
    metrics_port: int,
    max_preserve_timeout: str | None = None,
    native: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`machine-preservation controller` for one namespace, one identity for both clusters, no leader election."""
    args = [
        "controller",
        f"--control-kubeconfig={kubeconfig}",
        f"--target-kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        f"--machine-preserve-timeout={preserve_timeout}",
        "--no-leader-elect",
        f"--metrics-port={metrics_port}",
    ]
    if max_preserve_timeout is not None:
        args.append(f"--max-preserve-timeout={max_preserve_timeout}")
    if native is not None:
        args.append(f"--mcm-native-preservation={native}")
    return [*args, *extra]


def spawn(args: Sequence[str], *, log_file: Path) -> subprocess.Popen[bytes]:
    """`python -m machine_preservation.cli <args>`, its output appended to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log: IO[bytes] = log_file.open("ab")
    with log:
        log.write(f"--- started: {' '.join(args)}\n".encode())
        log.flush()
        return subprocess.Popen(
            [sys.executable, "-m", "machine_preservation.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def log_tail(log_file: Path, lines: int = 20) -> str:
    if not log_file.exists():
        return ""
    return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])


def exited(name: str, process: subprocess.Popen[bytes], log_file: Path) -> str | None:
    """None while the process runs; else what to tell (exit code and the end of its log)."""
    if process.poll() is None:
        return None
    return f"{name} exited with code {process.returncode}:\n{log_tail(log_file)}"


async def stop_process(name: str, process: subprocess.Popen[bytes], *, grace: float = STOP_GRACE) -> None:
    """SIGTERM, then SIGKILL if it has not stopped within `grace` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        await asyncio.to_thread(process.wait, grace)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not stop in time; killing it", name)
        await kill_process(process)


async def kill_process(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as a crash would end it: no shutdown code runs."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(process.wait)


async def wait_webhook_ready(
    process: subprocess.Popen[bytes], *, port: int, cafile: Path, log_file: Path, limit: float = READY_TIMEOUT
) -> None:
    """Until the webhook answers /readyz with 200 over TLS (verified against its own CA)."""
    await _wait_ready("webhook", process, log_file, limit, lambda: _get_ok(port=port, path="/readyz", cafile=cafile))


async def wait_controller_ready(
    process: subprocess.Popen[bytes], *, metrics_port: int, log_file: Path, limit: float = READY_TIMEOUT
) -> None:
    """Until the controller answers /readyz with 200: every cache has synced."""
    await _wait_ready(
        "controller", process, log_file, limit, lambda: _get_ok(port=metrics_port, path="/readyz", cafile=None)
    )


async def _wait_ready(
    name: str, process: subprocess.Popen[bytes], log_file: Path, limit: float, check: Callable[[], Awaitable[bool]]
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        problem = exited(name, process, log_file)
        if problem is not None:
            raise RuntimeError(problem)
        if loop.time() > deadline:
            raise RuntimeError(f"the {name} did not become ready in {limit:.0f} s:\n{log_tail(log_file)}")
        await asyncio.sleep(0.2)


async def _get_ok(*, port: int, path: str, cafile: Path | None) -> bool:
    context: ssl.SSLContext | None = None
    if cafile is not None:
        try:
            context = ssl.create_default_context(cafile=str(cafile))
        except FileNotFoundError:  # the webhook has not written its certificates yet
            return False
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None
        )
    except (OSError, ssl.SSLError):
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        return status_line.split(b" ")[1:2] == [b"200"]
    except (OSError, ssl.SSLError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
