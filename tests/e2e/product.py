"""Our webhook and controller for one end-to-end test, beside real MCM in the test's namespace.

Both run as their own processes (`machine_preservation.localcluster.product`), as a release of the chart installed
into the test's namespace would: client certificates for the chart's ServiceAccount users
(`system:serviceaccount:<namespace>:mp-controller` and `...:mp-webhook`), exactly the chart's RBAC rendered for
that namespace, the chart's webhook configurations registered by URL and its ValidatingAdmissionPolicies (their
Machine webhooks judge the test's namespace only; their names carry it, so nothing is shared between tests). The
webhook guards deletes by MCM's own identity (`--mcm-username`), the controller reconciles the test's
namespace (`--namespace`).

What the controller wrote comes from the API server's audit log (`controller_writes`): the e2e control plane
records every write to the machine kinds, Nodes and Pods (with the request body), and the controller's user is
unique per test. managedFields would not do: they keep one entry per manager and operation (the last time
only), and they record neither deletes nor writes that changed nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.localcluster import product as mp
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.gardener_landscape import seed_plane
from machine_preservation.localcluster.mcm_pool import GROUP, VERSION
from machine_preservation.localcluster.mcm_runner import MCM_USERNAME
from machine_preservation.localcluster.toolchain import Toolchain

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
# The audit annotations the API server adds when a webhook that may fail open did not answer.
FAILED_OPEN_PREFIXES = (
    "failed-open.mutation.webhook.admission.k8s.io/",
    "failed-open.validating.webhook.admission.k8s.io/",
)
# Passed to the e2e control plane: every write to what MCM and our product act on, with its body.
AUDIT_POLICY: dict[str, object] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Request",
            "verbs": list(WRITE_VERBS),
            "resources": [
                {"group": GROUP},
                # configmaps: the evidence of a failure.
                {"group": "", "resources": ["nodes", "nodes/status", "pods", "pods/eviction", "configmaps"]},
            ],
        },
        # Every other request of a ServiceAccount, without bodies: tests/e2e/rbac_audit.py derives the calls the
        # product's identities make from them.
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def mcm_control_plane(
    *, directory: Path, bin_dir: Path, mcm_version: str
) -> contextlib.AbstractContextManager[ControlPlane]:
    """A started control plane with MCM's own CRDs of `mcm_version` (plus the Shoot and Gardener Cluster CRDs),
    MCM's RBAC, and the audit log `Product.controller_writes` reads; stopped afterwards (the Gardener landscape's
    seed, audited)."""
    return seed_plane(directory=directory, bin_dir=bin_dir, mcm_version=mcm_version, audit_policy=AUDIT_POLICY)


KINDS = {
    "machines": "Machine",
    "machinesets": "MachineSet",
    "machinedeployments": "MachineDeployment",
    "nodes": "Node",
    "pods": "Pod",
}
NODE_EVENT_NAMESPACE = "default"
EventKind = Literal["Machine", "MachineSet", "MachineDeployment", "Node"]


@dataclass(frozen=True)
class Event:
    """A core/v1 Event about one object, as `kubectl describe` shows it."""

    reason: str
    message: str
    count: int
    type: str
    source: str  # the component that recorded it (ours: machine-preservation-controller)


@dataclass(frozen=True)
class Write:
    """One write request the API server answered, from its audit log."""

    kind: str  # Machine, MachineSet, MachineDeployment, Node, Pod
    name: str
    namespace: str  # "" for Nodes
    operation: str  # the audit verb: create, update, patch, delete
    subresource: str  # "", "status", "eviction"
    fields: tuple[str, ...]  # paths the request body sets, e.g. metadata.annotations[node.machine.sapcloud.io/x]
    code: int  # the response's HTTP status (a 409 conflict is a write that changed nothing)
    at: dt.datetime  # when the API server received it
    completed: dt.datetime  # when it answered: admission (our webhook's verdict) lies between the two
    body: Any = field(compare=False, repr=False)
    # The API server's audit annotations: which mutating webhooks patched the request, which failed open.
    audit_annotations: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def failed_open(self) -> bool:
        """A webhook with failurePolicy Ignore (every node webhook) could not answer, and the write went in as
        sent."""
        return any(key.startswith(FAILED_OPEN_PREFIXES) for key in self.audit_annotations)


def field_paths(body: Any, prefix: str = "") -> tuple[str, ...]:
    """The leaf paths a patch body sets; maps under annotations/labels are keyed by their (dotted) keys. A JSON
    patch gives the paths of its operations (list positions left out: `spec.taints`)."""
    if isinstance(body, list) and not prefix:
        return tuple(sorted({_pointer_path(op["path"]) for op in body if isinstance(op, dict) and "path" in op}))
    if not isinstance(body, dict) or not body:
        return (prefix,) if prefix else ()
    paths: list[str] = []
    keyed = prefix.endswith(("annotations", "labels"))
    for key, value in body.items():
        if keyed:
            paths.append(f"{prefix}[{key}]")
        else:
            paths.extend(field_paths(value, f"{prefix}.{key}" if prefix else key))
    return tuple(sorted(paths))


def _pointer_path(pointer: str) -> str:
    parts = [part.replace("~1", "/").replace("~0", "~") for part in pointer.strip("/").split("/")]
    if len(parts) > 2 and parts[1] in ("annotations", "labels"):
        return f"{parts[0]}.{parts[1]}[{parts[2]}]"
    return ".".join(part for part in parts if part != "-" and not part.isdigit())


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


@dataclass
class Product:
    """What the `product` fixture gives a test; `start` first (then the other calls make sense)."""

    plane: ControlPlane
    toolchain: Toolchain
    namespace: str
    directory: Path
    api: client.ApiClient  # an administrator's
    controller_user: str = ""
    webhook_user: str = ""
    mcm_user: str = MCM_USERNAME
    settings: dict[str, Any] = field(default_factory=dict)
    _manifests: list[dict[str, Any]] = field(default_factory=list)
    _webhook: subprocess.Popen[bytes] | None = None
    _controller: subprocess.Popen[bytes] | None = None
    _webhook_port: int = 0
    _metrics_port: int = 0
    _audit_offset: int = 0

    def __post_init__(self) -> None:
        users = mp.component_users(self.namespace)
        self.controller_user, self.webhook_user = users["controller"], users["webhook"]

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(
        self,
        *,
        native: str = "false",
        preserve_timeout: str = "90s",
        max_preserve_timeout: str = "720h",
        webhook: bool = True,
        drain_retry_interval: str = "5s",
        evidence_grace: str = "24h",
    ) -> None:
        """Chart RBAC, then the webhook (and its configurations) if asked, then the controller; returns once
        each is ready. A second call with the same settings does nothing."""
        wanted = {
            "native": native,
            "preserve_timeout": preserve_timeout,
            "max_preserve_timeout": max_preserve_timeout,
            "webhook": webhook,
            "drain_retry_interval": drain_retry_interval,
            "evidence_grace": evidence_grace,
        }
        if self.settings:
            if self.settings != wanted:
                raise ValueError(f"the product runs with {self.settings}; asked again with {wanted}")
            return
        self.settings = wanted
        self._audit_offset = self.plane.audit_log.stat().st_size if self.plane.audit_log.exists() else 0
        rbac = await asyncio.to_thread(
            mp.render_component_rbac,
            helm=self.toolchain.helm,
            control_namespace=self.namespace,
            release_namespace=self.namespace,
        )
        await self._apply(rbac)
        if webhook:
            await self.start_webhook()
            configurations = await asyncio.to_thread(
                mp.render_webhook_configurations,
                helm=self.toolchain.helm,
                url=f"https://127.0.0.1:{self._webhook_port}",
                ca_bundle=(self._cert_dir / "ca.crt").read_bytes(),
                control_namespace=self.namespace,
                controller_username=self.controller_user,
                mcm_usernames=[self.mcm_user],
                release_name=mp.RELEASE_NAME,
                release_namespace=self.namespace,
                policies=True,
            )
            await self._apply(configurations)
            await self._wait_for_webhook_registration()
        await self.start_controller()

    async def start_webhook(self) -> None:
        """Start the webhook process (again, after `stop_webhook`: same port and certificate)."""
        if self._webhook is not None and self._webhook.poll() is None:
            return
        self._webhook_port = self._webhook_port or free_port()
        args = mp.webhook_args(
            port=self._webhook_port,
            cert_dir=self._cert_dir,
            kubeconfig=self.kubeconfig_for(self.webhook_user),
            controller_username=self.controller_user,
            mcm_usernames=[self.mcm_user],
            native=self.settings["native"],
            control_namespace=self.namespace,
            max_preserve_timeout=self.settings["max_preserve_timeout"],
        )
        self._webhook = mp.spawn(args, log_file=self.log_file("webhook"))
        await mp.wait_webhook_ready(
            self._webhook, port=self._webhook_port, cafile=self._cert_dir / "ca.crt", log_file=self.log_file("webhook")
        )

    async def stop_webhook(self) -> None:
        if self._webhook is not None:
            await mp.stop_process("webhook", self._webhook)

    async def start_controller(self) -> None:
        """Start the controller process (again, after a stop or kill) and wait until its caches synced."""
        if self._controller is not None and self._controller.poll() is None:
            return
        self._metrics_port = free_port()
        args = mp.controller_args(
            kubeconfig=self.kubeconfig_for(self.controller_user),
            namespace=self.namespace,
            preserve_timeout=self.settings["preserve_timeout"],
            max_preserve_timeout=self.settings["max_preserve_timeout"],
            native=self.settings["native"],
            metrics_port=self._metrics_port,
            extra=[
                f"--drain-retry-interval={self.settings['drain_retry_interval']}",
                f"--evidence-grace={self.settings['evidence_grace']}",
            ],
        )
        self._controller = mp.spawn(args, log_file=self.log_file("controller"))
        await mp.wait_controller_ready(
            self._controller, metrics_port=self._metrics_port, log_file=self.log_file("controller")
        )

    async def stop_controller(self) -> None:
        """SIGTERM: the controller shuts down as in a rolling update."""
        if self._controller is not None:
            await mp.stop_process("controller", self._controller)

    async def kill_controller(self) -> None:
        """SIGKILL: no shutdown code runs, as when a node dies under it."""
        if self._controller is not None:
            await mp.kill_process(self._controller)

    def check_running(self) -> None:
        """Raise if a started process died on its own."""
        for name, process in (("webhook", self._webhook), ("controller", self._controller)):
            if process is not None:
                problem = mp.exited(name, process, self.log_file(name))
                if problem is not None and process.returncode not in (-9, -15):
                    raise AssertionError(problem)

    async def tear_down(self) -> None:
        """Stop both processes and remove what lives outside the test's namespace (webhook configurations,
        cluster roles, the Node-event Role in `default`)."""
        await self.stop_controller()
        await self.stop_webhook()
        await mp.delete_manifests(self.api, self._manifests)
        self._manifests.clear()

    # --- what a test asks -----------------------------------------------------------------------------------

    def kubeconfig_for(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig authenticating as `user` (a client certificate of the test cluster's CA)."""
        path = self.directory / "kubeconfigs" / f"{_safe(user)}.kubeconfig"
        if not path.exists():
            self.plane.write_kubeconfig(path, user=user, groups=groups)
        return path

    def log_file(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    def log(self, name: Literal["webhook", "controller"]) -> str:
        path = self.log_file(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- {name} ({self.log_file(name)}):\n{mp.log_tail(self.log_file(name), lines)}"
            for name in ("webhook", "controller")
        )

    async def events(self, kind: EventKind = "Machine", name: str = "") -> list[Event]:
        """The Events about one object (Nodes' live in `default`), oldest first."""
        namespace = NODE_EVENT_NAMESPACE if kind == "Node" else self.namespace
        selector = f"involvedObject.kind={kind}" + (f",involvedObject.name={name}" if name else "")
        listed = await client.CoreV1Api(self.api).list_namespaced_event(namespace, field_selector=selector)
        items = sorted(listed.items, key=lambda e: e.metadata.creation_timestamp)
        return [
            Event(
                reason=item.reason or "",
                message=item.message or "",
                count=item.count or 1,
                type=item.type or "",
                source=(item.source.component if item.source else None) or item.reporting_component or "",
            )
            for item in items
        ]

    async def controller_writes(self, namespace: str | None = None) -> list[Write]:
        """Every write the controller's identity made since `start` to Machines, MachineSets,
        MachineDeployments, Nodes and Pods (evictions), oldest first. `namespace` (default: the test's)
        narrows the namespaced ones; Nodes are always included."""
        namespace = self.namespace if namespace is None else namespace
        return [
            w
            for w in await asyncio.to_thread(self._read_audit, self.controller_user)
            if w.kind == "Node" or w.namespace == namespace
        ]

    async def writes_by(self, user: str) -> list[Write]:
        """Every write of `user` since `start` (e.g. MCM's), as `controller_writes` reads them."""
        return await asyncio.to_thread(self._read_audit, user)

    # --- internals ------------------------------------------------------------------------------------------

    @property
    def _cert_dir(self) -> Path:
        return self.directory / "webhook-certs"

    async def _apply(self, manifests: list[dict[str, Any]]) -> None:
        # Remembered before they exist: a failure half-way still removes what was created.
        self._manifests.extend(manifests)
        await mp.apply_manifests(self.api, manifests)

    async def _wait_for_webhook_registration(self, limit: float = 30.0) -> None:
        """The API server picks registrations up asynchronously: wait until a bad preserve value on a Machine
        of the namespace is denied (a dry run: nothing is stored)."""
        custom = client.CustomObjectsApi(self.api)
        probe = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Machine",
            "metadata": {"name": "webhook-probe", "annotations": {"node.machine.sapcloud.io/preserve": "probe"}},
            "spec": {"class": {"kind": "MachineClass", "name": "none"}},
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            try:
                await custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "machines", probe, dry_run="All"
                )
            except ApiException as error:
                if "denied the request" in str(error.body):
                    return
                if error.status not in (403, 409):
                    raise
            if loop.time() > deadline:
                raise AssertionError(f"the webhook configurations did not take effect in {limit:.0f} s")
            await asyncio.sleep(0.2)

    def _read_audit(self, user: str) -> list[Write]:
        writes: list[Write] = []
        path = self.plane.audit_log
        if not path.exists():
            raise AssertionError(f"the control plane keeps no audit log at {path}: start it with AUDIT_POLICY")
        with path.open("rb") as log:
            log.seek(self._audit_offset)
            for line in log:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    write = self._write_from(event, user)
                    if write is not None:
                        writes.append(write)
        return writes

    @staticmethod
    def _write_from(event: dict[str, Any], user: str) -> Write | None:
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
            return None
        if (event.get("user") or {}).get("username") != user:
            return None
        ref = event.get("objectRef") or {}
        kind = KINDS.get(ref.get("resource", ""))
        if kind is None:
            return None
        body = event.get("requestObject")
        return Write(
            kind=kind,
            name=ref.get("name", ""),
            namespace=ref.get("namespace", ""),
            operation=event["verb"],
            subresource=ref.get("subresource", ""),
            fields=field_paths(body) if ref.get("subresource") != "eviction" else (),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            at=dt.datetime.fromisoformat(event["requestReceivedTimestamp"]),
            completed=dt.datetime.fromisoformat(event["stageTimestamp"]),
            body=body,
            audit_annotations=dict(event.get("annotations") or {}),
        )
