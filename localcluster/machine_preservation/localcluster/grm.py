"""The real gardener-resource-manager (GRM) of one shoot, run as a plain process against local API servers.

In a Gardener seed every shoot namespace runs its own GRM: it reads ManagedResources and shoot-access Secrets from
the shoot namespace of the seed (the source cluster) and applies the objects to the shoot, and writes service-account
tokens for the shoot into the access Secrets (the target cluster). Here it runs with only those controllers on
(managedResource, health, tokenRequestor), without leader election, every server bound to 127.0.0.1 on a free port.

- Binary: localcluster/go/gardener-resource-manager/build.sh builds it from the Gardener Go module into a cache
  directory (MACHINE_PRESERVATION_GRM_BIN=<dir> overrides, for installs without the source tree).
- The shoot's API server must accept the audience `gardener` (`ControlPlane(extra_api_audiences=("gardener",))`,
  see `gardener.start_shoot_control_plane`), or the token requestor fails in a tight loop.
- Logs go to `<directory>/logs/gardener-resource-manager.log` (appended across restarts, each start marked).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from machine_preservation.certs.authority import generate_ca, issue_serving_cert
from machine_preservation.localcluster.controlplane import (
    LOOPBACK,
    ControlPlane,
    _die_with_parent,
    _terminate,
    free_port,
    wait_for_http_ok,
)
from machine_preservation.localcluster.toolchain import ToolchainError, configured_bin_dir, run_build_script

GRM_BINARY = "gardener-resource-manager"
GRM_BINARIES = (GRM_BINARY,)
# The identities GRM has in the seed and in the shoot; both are administrators here, so they need no RBAC of their
# own. (In a seed GRM is the service account of its shoot namespace; that user name is too long for the common name
# of the client certificate the local API servers authenticate.)
GRM_SEED_USERNAME = "gardener-resource-manager"
GRM_SHOOT_USERNAME = "system:serviceaccount:kube-system:gardener-resource-manager"
CERT_VALIDITY = dt.timedelta(days=7)
# Every webhook GRM has (all off here: the shoot's API server would call them, and nothing here needs them).
WEBHOOKS = (
    "crdDeletionProtection",
    "extensionValidation",
    "highAvailabilityConfig",
    "kubernetesServiceHost",
    "systemComponentsConfig",
    "podKubeAPIServerLoadBalancing",
    "podSchedulerName",
    "podTopologySpreadConstraints",
    "projectedTokenMount",
    "nodeAgentAuthorizer",
    "seccompProfile",
    "vpaInPlaceUpdates",
)


class GrmError(RuntimeError):
    """GRM could not be started; the message includes the log tail."""


def _tools_dir() -> Path | None:
    # localcluster/machine_preservation/localcluster/grm.py -> repository root
    directory = Path(__file__).resolve().parents[3] / "localcluster" / "go" / "gardener-resource-manager"
    return directory if (directory / "build.sh").is_file() else None


def grm_version() -> str:
    """The Gardener version localcluster/go/gardener-resource-manager builds GRM from (its versions.env)."""
    tools = _tools_dir()
    if tools is None:
        raise ToolchainError("localcluster/go/gardener-resource-manager is missing (not a source checkout)")
    match = re.search(r"^GRM_VERSION=(\S+)", (tools / "versions.env").read_text(), re.MULTILINE)
    if match is None:
        raise ToolchainError(f"{tools / 'versions.env'} has no GRM_VERSION line")
    return match.group(1)


def ensure_grm_binary() -> Path:
    """The directory holding `gardener-resource-manager`, building it if needed (a cold build takes minutes)."""
    configured = configured_bin_dir("MACHINE_PRESERVATION_GRM_BIN", GRM_BINARIES)
    if configured is not None:
        return configured
    tools = _tools_dir()
    if tools is None:
        raise ToolchainError(
            "gardener-resource-manager not found: set MACHINE_PRESERVATION_GRM_BIN to a directory holding it, or "
            "run from a source checkout (localcluster/go/gardener-resource-manager/build.sh builds it with Go)"
        )
    return run_build_script(tools / "build.sh")


@dataclass(frozen=True)
class GrmSettings:
    """The knobs tests turn; the defaults are Gardener's, except a quicker sync."""

    sync_period: str = "1m"
    health_sync_period: str = "1m"
    concurrent_syncs: int = 5
    log_level: str = "info"


def grm_config(
    *, namespace: str, webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path, settings: GrmSettings
) -> dict[str, Any]:
    """GRM's ResourceManagerConfiguration: the shoot namespace only, the three controllers a seed's per-shoot GRM
    needs for extensions, everything else off, every server on 127.0.0.1."""
    off = {"enabled": False}
    return {
        "apiVersion": "resourcemanager.config.gardener.cloud/v1alpha1",
        "kind": "ResourceManagerConfiguration",
        "sourceClientConnection": {"qps": 100, "burst": 130, "namespaces": [namespace]},
        "targetClientConnection": {"qps": 100, "burst": 130},
        "leaderElection": {"leaderElect": False},
        "logLevel": settings.log_level,
        "logFormat": "text",
        "server": {
            # GRM always starts its webhook server, so it needs a certificate even with every webhook off.
            "webhooks": {"bindAddress": LOOPBACK, "port": webhook_port, "tls": {"serverCertDir": str(cert_dir)}},
            "healthProbes": {"bindAddress": LOOPBACK, "port": health_port},
            "metrics": {"bindAddress": LOOPBACK, "port": metrics_port},
        },
        "controllers": {
            # The key is singular; Gardener's example file's `managedResources` is silently ignored.
            "managedResource": {
                "concurrentSyncs": settings.concurrent_syncs,
                "syncPeriod": settings.sync_period,
                "managedByLabelValue": "gardener",
            },
            # Cannot be turned off; it watches workloads in the whole shoot.
            "health": {"concurrentSyncs": settings.concurrent_syncs, "syncPeriod": settings.health_sync_period},
            "tokenRequestor": {"enabled": True, "concurrentSyncs": settings.concurrent_syncs},
            "garbageCollector": off,
            "csrApprover": off,
            "networkPolicy": off,
            "nodeCriticalComponents": off,
            "nodeAgentReconciliationDelay": off,
            "istioClusterConfiguration": off,
        },
        "webhooks": dict.fromkeys(WEBHOOKS, off),
    }


@dataclass
class GrmRunner:
    """The real GRM of the shoot whose control plane lives in `namespace` of `seed`; its target is `shoot`.

    `start()` returns once GRM's /readyz is 200 (its caches of both clusters are synced); `stop()` ends it. Also a
    context manager (`with GrmRunner(...) as grm:`)."""

    seed: ControlPlane
    shoot: ControlPlane
    namespace: str
    directory: Path
    settings: GrmSettings = field(default_factory=GrmSettings)
    bin_dir: Path | None = None
    attached: bool = True
    ports: dict[str, int] = field(default_factory=dict)
    _process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.directory / "logs" / f"{GRM_BINARY}.log"

    def start(self, *, timeout: float = 60.0) -> None:
        if self._process is not None:
            raise GrmError("GRM is already running")
        if self.bin_dir is None:
            self.bin_dir = ensure_grm_binary()
        (self.directory / "logs").mkdir(parents=True, exist_ok=True)
        cert_dir = self._write_serving_cert()
        source = self.seed.write_kubeconfig(
            self.directory / "seed.kubeconfig", user=GRM_SEED_USERNAME, groups=("system:masters",)
        )
        # write_kubeconfig puts the CA inline, which GRM's target client needs.
        target = self.shoot.write_kubeconfig(
            self.directory / "shoot.kubeconfig", user=GRM_SHOOT_USERNAME, groups=("system:masters",)
        )
        self.ports = {"webhooks": free_port(), "health": free_port(), "metrics": free_port()}
        config_file = self.directory / "config.yaml"
        config_file.write_text(
            yaml.safe_dump(
                grm_config(
                    namespace=self.namespace,
                    webhook_port=self.ports["webhooks"],
                    health_port=self.ports["health"],
                    metrics_port=self.ports["metrics"],
                    cert_dir=cert_dir,
                    settings=self.settings,
                )
            )
        )
        env = {**os.environ, "KUBECONFIG": str(source), "TARGET_KUBECONFIG": str(target)}
        with self.log.open("ab") as log:
            log.write(f"=== {dt.datetime.now(dt.UTC).isoformat()} starting {GRM_BINARY}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                [str(self.bin_dir / GRM_BINARY), f"--config={config_file}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.attached else None,
            )
        try:
            self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _terminate(process.pid, is_alive=lambda: process.poll() is None)

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:] if self.log.exists() else []
        return f"--- {self.log} (last {lines} lines) ---\n" + "\n".join(text)

    def __enter__(self) -> GrmRunner:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def _write_serving_cert(self) -> Path:
        now = dt.datetime.now(dt.UTC)
        ca = generate_ca(common_name="gardener-resource-manager-local", now=now, valid_for=CERT_VALIDITY)
        pair = issue_serving_cert(
            ca=ca, dns_names=("localhost",), ip_addresses=(LOOPBACK,), now=now, valid_for=CERT_VALIDITY
        )
        cert_dir = self.directory / "tls"
        cert_dir.mkdir(parents=True, exist_ok=True)
        for name, content in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
            (cert_dir / name).write_bytes(content)
            (cert_dir / name).chmod(0o600)
        return cert_dir

    def _wait_ready(self, deadline: float) -> None:
        assert self._process is not None
        problem = wait_for_http_ok(self._process, port=self.ports["health"], path="/readyz", deadline=deadline)
        if problem is not None:
            raise GrmError(f"{GRM_BINARY} {problem}:\n{self.log_tail()}")
