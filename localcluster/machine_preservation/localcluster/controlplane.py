"""Start and stop etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 with free ports.

Everything the control plane owns lives in one directory: pki/, etcd/, logs/, state.json and the
admin kubeconfig. `ControlPlane.start` returns once /readyz is 200 and the `default` namespace exists;
`stop_control_plane(directory)` works from any process (it is what `cluster down` runs).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import datetime as dt
import http.client
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from machine_preservation.certs.authority import (
    KeyPair,
    generate_ca,
    generate_signing_key,
    issue_client_cert,
    issue_serving_cert,
)

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
STATE_FILE = "state.json"
KUBECONFIG_FILE = "kubeconfig"
CERT_VALIDITY = dt.timedelta(days=7)
# kube-controller-manager controllers that work without kubelets. Node lifecycle, IPAM, the
# workload controllers etc. would fight (or wait forever for) nodes that have no kubelet.
CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "disruption-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    # Type-checks ValidatingAdmissionPolicies against the schemas and reports problems in their status.
    "validatingadmissionpolicy-status-controller",
)
AUDIT_LOG = "audit.log"
AUDIT_POLICY_FILE = "audit-policy.yaml"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or stopped; the message includes the log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Linux only: the child gets SIGTERM when the process that started it dies, so a killed test
    # run never leaves an apiserver behind.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class _Pki:
    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    sa_private: bytes
    sa_public: bytes


@dataclass
class ControlPlane:
    """One local control plane. `attached=True` ties the processes' lifetime to this process."""

    directory: Path
    bin_dir: Path
    attached: bool = True
    # An audit policy (audit.k8s.io/v1 Policy): the apiserver then writes one JSON line per event to
    # logs/audit.log, so tests can tell exactly which identity wrote what.
    audit_policy: dict[str, object] | None = None
    # Another control plane's etcd (its client URL, see `etcd_url`) instead of an etcd of its own: several API
    # servers (a seed and its shoots) then share one etcd, kept apart by `etcd_prefix`. Such a plane stops only its
    # own processes.
    etcd_servers: str | None = None
    etcd_prefix: str = "/registry"
    # Audiences besides the issuer that tokens may be requested for (a Gardener shoot's API server adds "gardener").
    extra_api_audiences: tuple[str, ...] = ()
    # kube-controller-manager (namespace deletion, garbage collection, service-account tokens); off saves memory.
    controller_manager: bool = True
    # kube-apiserver feature gates to set, e.g. {"DetectCacheInconsistency": False}.
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    # Where kube-apiserver listens: a loopback address of its own and a fixed port (a Gardener shoot's API server on
    # 443, reached by its Service name through the hosts file, see `hosts`); port 0 picks a free one.
    address: str = LOOPBACK
    apiserver_port: int = 0
    # More names for its serving certificate (a shoot's `kube-apiserver.<namespace>.svc`).
    dns_names: tuple[str, ...] = ()
    etcd_port: int = 0
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _ca: KeyPair | None = None

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        """The client URL of the etcd this plane stores its objects in."""
        return self.etcd_servers or f"http://{LOOPBACK}:{self.etcd_port}"

    @property
    def issuer(self) -> str:
        """The service-account token issuer (also the default token audience)."""
        return self.server

    @property
    def kubeconfig(self) -> Path:
        return self.directory / KUBECONFIG_FILE

    @property
    def ca(self) -> KeyPair:
        if self._ca is None:
            raise ControlPlaneError("control plane not started")
        return self._ca

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def audit_log(self) -> Path:
        return self.directory / "logs" / AUDIT_LOG

    def start(self, *, timeout: float = 120.0) -> None:
        if (self.directory / STATE_FILE).exists():
            raise ControlPlaneError(f"{self.directory} already holds a control plane; run `cluster down` first")
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        pki = self._write_pki()
        self._ca = pki.ca
        deadline = time.monotonic() + timeout
        try:
            if self.etcd_servers is None:
                self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self.write_kubeconfig(self.kubeconfig, user="admin", groups=("system:masters",))
            self._wait_for_default_namespace(deadline)
            if self.controller_manager:
                self._start_controller_manager()
            self._save_state()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            process = self._processes.pop(name, None)
            if process is not None:
                _terminate(process.pid, is_alive=lambda p=process: p.poll() is None)  # type: ignore[misc]
        (self.directory / STATE_FILE).unlink(missing_ok=True)

    def write_kubeconfig(self, path: Path, *, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for any identity: a client certificate signed by the cluster's client CA."""
        client = issue_client_cert(
            ca=self.ca, user=user, groups=groups, now=dt.datetime.now(dt.UTC), valid_for=CERT_VALIDITY
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.ca.cert_pem),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": _b64(client.cert_pem),
                        "client-key-data": _b64(client.key_pem),
                    },
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # --- internals -------------------------------------------------------------------------------

    def _write_pki(self) -> _Pki:
        now = dt.datetime.now(dt.UTC)
        ca = generate_ca(common_name="machine-preservation-local-ca", now=now, valid_for=CERT_VALIDITY)
        apiserver = issue_serving_cert(
            ca=ca,
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", *self.dns_names),
            ip_addresses=tuple(dict.fromkeys((LOOPBACK, self.address))),
            now=now,
            valid_for=CERT_VALIDITY,
        )
        admin = issue_client_cert(ca=ca, user="admin", groups=("system:masters",), now=now, valid_for=CERT_VALIDITY)
        sa_private, sa_public = generate_signing_key()
        pki = _Pki(ca=ca, apiserver=apiserver, admin=admin, sa_private=sa_private, sa_public=sa_public)
        self.pki_dir.mkdir(exist_ok=True)
        files = {
            "ca.crt": ca.cert_pem,
            "ca.key": ca.key_pem,
            "apiserver.crt": apiserver.cert_pem,
            "apiserver.key": apiserver.key_pem,
            "admin.crt": admin.cert_pem,
            "admin.key": admin.key_pem,
            "sa.key": sa_private,
            "sa.pub": sa_public,
        }
        for name, content in files.items():
            target = self.pki_dir / name
            target.write_bytes(content)
            target.chmod(0o600)
        return pki

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.directory / "logs" / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if self.attached else None,
        )
        log.close()
        self._processes[name] = process
        return process

    def _start_etcd(self, deadline: float) -> None:
        self.etcd_port, peer_port = free_port(), free_port()
        client_url, peer_url = f"http://{LOOPBACK}:{self.etcd_port}", f"http://{LOOPBACK}:{peer_port}"
        process = self._spawn(
            "etcd",
            [
                "--name=local",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=local={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            status, body = _http_get(LOOPBACK, self.etcd_port, "/health", context=None)
            return status == 200 and b'"health":"true"' in body

        self._wait("etcd", process, healthy, deadline)

    def _start_apiserver(self, deadline: float) -> None:
        self.apiserver_port = self.apiserver_port or free_port()
        pki = self.pki_dir
        process = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                f"--etcd-prefix={self.etcd_prefix}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-issuer={self.issuer}",
                f"--api-audiences={','.join((self.issuer, *self.extra_api_audiences))}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                *self._feature_gate_args(),
                *self._audit_args(),
            ],
        )
        context = self._client_ssl_context()

        def ready() -> bool:
            status, _ = _http_get(self.address, self.apiserver_port, "/readyz", context=context)
            return status == 200

        self._wait("kube-apiserver", process, ready, deadline)

    def _feature_gate_args(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"]

    def _audit_args(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.directory / AUDIT_POLICY_FILE
        policy.write_text(yaml.safe_dump(self.audit_policy))
        # Blocking mode: each event is written by the request's own handler, not buffered for seconds; the
        # event of a request's last stage may still trail its response by milliseconds.
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
        ]

    def _client_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return context

    def _wait_for_default_namespace(self, deadline: float) -> None:
        context = self._client_ssl_context()

        def exists() -> bool:
            status, _ = _http_get(self.address, self.apiserver_port, "/api/v1/namespaces/default", context=context)
            return status == 200

        self._wait("kube-apiserver", self._processes["kube-apiserver"], exists, deadline)

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                "--secure-port=0",
                "--use-service-account-credentials=false",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={self.pki_dir / 'sa.key'}",
                f"--root-ca-file={self.pki_dir / 'ca.crt'}",
            ],
        )

    def _wait(self, name: str, process: subprocess.Popen[bytes], check: Callable[[], bool], deadline: float) -> None:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ControlPlaneError(f"{name} exited with code {process.returncode}:\n{self._log_tail(name)}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if check():
                    return
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not ready in time:\n{self._log_tail(name)}")

    def _log_tail(self, name: str, lines: int = 30) -> str:
        log = self.directory / "logs" / f"{name}.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def _save_state(self) -> None:
        state = {
            "apiserver_port": self.apiserver_port,
            "etcd_port": self.etcd_port,
            "processes": {
                name: {"pid": process.pid, "binary": str(self.bin_dir / name)}
                for name, process in self._processes.items()
            },
        }
        (self.directory / STATE_FILE).write_text(json.dumps(state, indent=2))


def stop_control_plane(directory: Path, *, remove: bool = True) -> bool:
    """Stop the control plane recorded in `directory` (from any process). False if none was recorded."""
    state_file = directory / STATE_FILE
    if not state_file.exists():
        return False
    state = json.loads(state_file.read_text())
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        entry = state["processes"].get(name)
        if entry is not None:
            pid, binary = int(entry["pid"]), str(entry["binary"])
            _terminate(pid, is_alive=lambda pid=pid, binary=binary: _runs(pid, binary))  # type: ignore[misc]
    state_file.unlink(missing_ok=True)
    if remove:
        for child in ("pki", "etcd", "logs", KUBECONFIG_FILE):
            target = directory / child
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()
    return True


def _runs(pid: int, binary: str) -> bool:
    """Whether `pid` is alive and still the binary we started (pids are recycled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == binary


def _terminate(pid: int, *, is_alive: Callable[[], bool], grace: float = 10.0) -> None:
    if not is_alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not is_alive():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def wait_for_http_ok(
    process: subprocess.Popen[bytes], *, port: int, path: str, deadline: float, interval: float = 0.1
) -> str | None:
    """Poll http://127.0.0.1:`port``path` until it answers 200 (None), the process exits or `deadline` (monotonic)
    passes (why not, for the caller's error)."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"exited with code {process.returncode}"
        with contextlib.suppress(OSError, http.client.HTTPException):
            if _http_get(LOOPBACK, port, path, context=None)[0] == 200:
                return None
        time.sleep(interval)
    return f"did not answer {path} with 200 in time"


def _http_get(host: str, port: int, path: str, *, context: ssl.SSLContext | None) -> tuple[int, bytes]:
    connection: http.client.HTTPConnection
    if context is None:
        connection = http.client.HTTPConnection(host, port, timeout=5)
    else:
        connection = http.client.HTTPSConnection(host, port, timeout=5, context=context)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
