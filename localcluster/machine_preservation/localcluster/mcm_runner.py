"""Run the real machine-controller-manager against a local control plane, for one namespace.

Two processes, as a Gardener seed runs them: MCM's controller-manager (MachineDeployments, MachineSets,
safety) and the provider machine controller with our in-memory `fake` driver (Machines, drain, VMs). Both
run as MCM's own identity (a client certificate for its service-account user name), so whatever treats MCM
specially (our webhook's deletion guard) sees real MCM requests. The driver plays the cloud and the
kubelets' registration with an identity of its own.

Processes bind 127.0.0.1 on free ports, die with the process that started them when `attached`, and log to
`<directory>/logs/<binary>.log` (appended across restarts, each start marked).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.core.admission.settings import DEFAULT_MCM_USERNAMES
from machine_preservation.localcluster.controlplane import (
    LOOPBACK,
    ControlPlane,
    _die_with_parent,
    _terminate,
    free_port,
    wait_for_http_ok,
)
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION, ensure_mcm_binaries

MCM_USERNAME = DEFAULT_MCM_USERNAMES[0]
# The groups a service account's token carries; RBAC here binds the user, they are for realism.
MCM_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system")
# The identity of the fake cloud (it registers and deletes Nodes, as kubelets and the cloud's node
# lifecycle would); an administrator so it needs no RBAC of its own.
FAKE_CLOUD_USERNAME = "machine-preservation:fake-cloud"
RBAC_NAME = "machine-preservation:real-mcm"

CONTROLLER_MANAGER = "machine-controller-manager"
MACHINE_CONTROLLER = "machine-controller"
BINARIES = (CONTROLLER_MANAGER, MACHINE_CONTROLLER)

_ALL = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
_READ = ["get", "list", "watch"]
# What MCM does in the control namespace (its Machine kinds, the pool's Secret, Events) and in the target
# cluster (Node finalizers, labels, taints and deletion; draining; bootstrap-token Secrets in kube-system).
MCM_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["machine.sapcloud.io"],
        "resources": [
            "machineclasses",
            "machines",
            "machines/status",
            "machinesets",
            "machinesets/status",
            "machinedeployments",
            "machinedeployments/status",
        ],
        "verbs": _ALL,
    },
    {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": _ALL},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "update", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "watch", "create", "update"]},
    {"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": [*_READ, "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": [*_READ, "delete"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {
        "apiGroups": [""],
        "resources": ["persistentvolumes", "persistentvolumeclaims", "replicationcontrollers"],
        "verbs": _READ,
    },
    {"apiGroups": ["apps"], "resources": ["daemonsets", "replicasets", "statefulsets", "deployments"], "verbs": _READ},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _READ},
    {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"], "verbs": [*_READ, "delete"]},
]


class McmError(RuntimeError):
    """MCM could not be started; the message includes the log tail."""


@dataclass(frozen=True)
class McmSettings:
    """The knobs tests turn; the defaults make a failure-and-replace cycle take well under a minute."""

    machine_health_timeout: str = "3s"
    machine_creation_timeout: str = "2m"
    machine_drain_timeout: str = "30s"
    safety_up: int = 2
    safety_down: int = 1
    verbosity: int = 2
    extra_controller_manager_args: tuple[str, ...] = ()
    extra_machine_controller_args: tuple[str, ...] = ()


def grant_mcm_rbac(admin_kubeconfig: Path, *, username: str = MCM_USERNAME) -> None:
    """A ClusterRole with what MCM needs, bound to its user (idempotent; one binding per user, so that the MCMs
    of several shoot namespaces of one seed each keep theirs)."""
    binding_name = RBAC_NAME if username == MCM_USERNAME else f"{RBAC_NAME}:{username}"
    api_client = config.new_client_from_config(config_file=str(admin_kubeconfig))  # type: ignore[no-untyped-call]
    with api_client:
        rbac = client.RbacAuthorizationV1Api(api_client)
        role: dict[str, Any] = {"metadata": {"name": RBAC_NAME}, "rules": MCM_RULES}
        binding: dict[str, Any] = {
            "metadata": {"name": binding_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RBAC_NAME},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": username}],
        }
        for kind, body in (("cluster_role", role), ("cluster_role_binding", binding)):
            try:
                getattr(rbac, f"create_{kind}")(body)
            except ApiException as error:
                if error.status != 409:
                    raise
                getattr(rbac, f"replace_{kind}")(body["metadata"]["name"], body)


@dataclass
class McmRunner:
    """Real MCM (`version`) for `namespace` of `plane`; the Nodes are in `target` (a Gardener shoot's own API
    server), or in `plane` too when there is none."""

    plane: ControlPlane
    namespace: str
    directory: Path
    target: ControlPlane | None = None
    # MCM's identity towards `plane` (in a Gardener seed: its ServiceAccount in the shoot namespace); towards
    # the target it is always MCM_USERNAME, as in a shoot.
    control_user: str = MCM_USERNAME
    version: str = DEFAULT_MCM_VERSION
    settings: McmSettings = field(default_factory=McmSettings)
    bin_dir: Path | None = None
    attached: bool = True
    ports: dict[str, int] = field(default_factory=dict)
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def vm_state(self) -> Path:
        """Where the fake driver keeps its VMs, so they survive a restart."""
        return self.directory / "vms.json"

    def log(self, binary: str) -> Path:
        return self.logs_dir / f"{binary}.log"

    def start(self, *, timeout: float = 60.0) -> None:
        """Start both processes; returns once each serves /healthz."""
        if self._processes:
            raise McmError("MCM is already running")
        if self.bin_dir is None:
            self.bin_dir = ensure_mcm_binaries(self.version)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        target = self.target or self.plane
        mcm_kubeconfig = self.plane.write_kubeconfig(
            self.directory / "mcm.kubeconfig", user=self.control_user, groups=MCM_GROUPS
        )
        mcm_target_kubeconfig = target.write_kubeconfig(
            self.directory / "mcm-target.kubeconfig", user=MCM_USERNAME, groups=MCM_GROUPS
        )
        cloud_kubeconfig = target.write_kubeconfig(
            self.directory / "fake-cloud.kubeconfig", user=FAKE_CLOUD_USERNAME, groups=("system:masters",)
        )
        grant_mcm_rbac(self.plane.kubeconfig, username=self.control_user)
        if target is not self.plane:
            grant_mcm_rbac(target.kubeconfig)
        common = [
            f"--control-kubeconfig={mcm_kubeconfig}",
            f"--target-kubeconfig={mcm_target_kubeconfig}",
            f"--namespace={self.namespace}",
            "--leader-elect=false",
            f"--address={LOOPBACK}",
            f"--v={self.settings.verbosity}",
        ]
        s = self.settings
        args = {
            CONTROLLER_MANAGER: [
                *common,
                f"--safety-up={s.safety_up}",
                f"--safety-down={s.safety_down}",
                *s.extra_controller_manager_args,
            ],
            MACHINE_CONTROLLER: [
                *common,
                f"--machine-creation-timeout={s.machine_creation_timeout}",
                f"--machine-health-timeout={s.machine_health_timeout}",
                f"--machine-drain-timeout={s.machine_drain_timeout}",
                *s.extra_machine_controller_args,
            ],
        }
        env = {
            **os.environ,
            "FAKE_PROVIDER_KUBECONFIG": str(cloud_kubeconfig),
            "FAKE_PROVIDER_STATE": str(self.vm_state),
        }
        deadline = time.monotonic() + timeout
        try:
            for binary in BINARIES:
                self.ports[binary] = free_port()
                self._spawn(binary, [*args[binary], f"--port={self.ports[binary]}"], env)
            for binary in BINARIES:
                self._wait_healthy(binary, deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for binary in reversed(BINARIES):
            process = self._processes.pop(binary, None)
            if process is not None:
                _terminate(process.pid, is_alive=lambda p=process: p.poll() is None)  # type: ignore[misc]

    def restart(self, *, keep_vms: bool = True) -> None:
        """Stop and start both processes. Without `keep_vms` the fake cloud forgets its VMs, as a driver
        that keeps them in memory only would (MCM then finds no VM for its Machines)."""
        self.stop()
        if not keep_vms:
            self.vm_state.unlink(missing_ok=True)
        self.start()

    def running(self) -> bool:
        return bool(self._processes) and all(p.poll() is None for p in self._processes.values())

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for binary in BINARIES:
            path = self.log(binary)
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {path} (last {lines} lines) ---\n" + "\n".join(text))
        return "\n".join(parts)

    def _spawn(self, binary: str, args: list[str], env: dict[str, str]) -> None:
        assert self.bin_dir is not None
        with self.log(binary).open("ab") as log:
            log.write(f"=== {dt.datetime.now(dt.UTC).isoformat()} starting {binary} {self.version}\n".encode())
            log.flush()
            self._processes[binary] = subprocess.Popen(
                [str(self.bin_dir / binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.attached else None,
            )

    def _wait_healthy(self, binary: str, deadline: float) -> None:
        process = self._processes[binary]
        problem = wait_for_http_ok(process, port=self.ports[binary], path="/healthz", deadline=deadline)
        if problem is not None:
            raise McmError(f"{binary} {problem}:\n{self.log_tail()}")
