"""The standalone controller process: one namespace's preservation lifecycle (`runtime.ShootRuntime`), with
clients, metrics server and leader election around it.

Lifecycle (controller-runtime's manager, in one event loop):
1. build the API clients; the runtime inspects MCM's CRDs (exit with a clear error if the Machine CRD is
   unusable) and decides whether MCM preserves natively (then hands over and only observes);
2. serve /metrics, /healthz and /readyz (ready once every cache has synced);
3. with leader election, wait until this process leads (or a stop is requested);
4. run the lifecycle: informers, then workers once the caches synced;
5. on stop: the runtime stops taking work and lets in-flight reconciles finish (bounded); the Lease is
   released. Losing the Lease, or an informer ending for good, ends the process with an error (crash-only:
   the replacement starts from the API objects).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from machine_preservation.controller.machinery.leader import LeaderElector, WriteFence, run_elected
from machine_preservation.controller.machinery.metrics import Metrics, Probes, metrics_app, start_metrics_server
from machine_preservation.controller.preservation.caches import Caches
from machine_preservation.controller.preservation.clients import Clients
from machine_preservation.controller.preservation.crd_check import inspect_control
from machine_preservation.controller.preservation.runtime import (
    DEFAULT_DRAIN_ATTEMPT_TIMEOUT,
    Outcome,
    RuntimeOptions,
    ShootRuntime,
)
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.kube.clients import new_api_client

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_DRAIN_ATTEMPT_TIMEOUT", "Controller", "ControllerOptions"]

EXIT_OK = 0
EXIT_LOST_LEADERSHIP = 1
EXIT_INFORMER_FAILED = 3  # 2 is the CLI's bad setup
LEASE_NAME = "machine-preservation-controller"
_EXIT_CODES = {
    Outcome.STOPPED: EXIT_OK,
    Outcome.LOST: EXIT_LOST_LEADERSHIP,
    Outcome.INFORMER_FAILED: EXIT_INFORMER_FAILED,
}


def default_identity() -> str:
    """The pod's name when the chart passes it (POD_NAME), else host name; unique per process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ControllerOptions:
    namespace: str
    control_kubeconfig: Path | None = None
    target_kubeconfig: Path | None = None
    preservation: PreservationConfig = field(default_factory=PreservationConfig)
    workers: int = 4
    leader_elect: bool = True
    leader_election_namespace: str | None = None
    lease_name: str = LEASE_NAME
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = field(default_factory=default_identity)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8080
    resync_period: float = 600.0
    native_preservation: NativePreservationMode = NativePreservationMode.AUTO
    max_drain_attempt: dt.timedelta = DEFAULT_DRAIN_ATTEMPT_TIMEOUT
    shutdown_grace: float = 30.0


@dataclass
class Controller:
    options: ControllerOptions
    metrics: Metrics = field(default_factory=Metrics)
    clients: Clients | None = None
    runtime: ShootRuntime | None = None
    metrics_port: int = 0  # the port actually bound (options.metrics_port may be 0)
    leading: bool = False
    # In both clients: no write is sent once leadership may be gone.
    fence: WriteFence = field(default_factory=WriteFence)

    @property
    def caches(self) -> Caches | None:
        return self.runtime.caches if self.runtime is not None else None

    @property
    def native(self) -> bool:
        """MCM preserves natively (decided at start)."""
        return self.runtime is not None and self.runtime.native

    @property
    def preservation(self) -> PreservationConfig:
        """The options' settings plus what MCM's CRDs keep."""
        return self.runtime.preservation if self.runtime is not None else self.options.preservation

    @property
    def informer_failed(self) -> asyncio.Event:
        assert self.runtime is not None
        return self.runtime.informer_failed

    def ready(self) -> bool:
        """A standby replica is ready (it must not block a rollout); the leader once its caches synced."""
        if self.runtime is not None and self.runtime.informer_failed.is_set():
            return False  # a cache no longer follows the cluster
        if not self.leading:
            return self.options.leader_elect
        return self.runtime is not None and self.runtime.synced()

    async def run(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set (exit 0) or leadership is lost (exit 1)."""
        options = self.options
        control = await new_api_client(
            kubeconfig=options.control_kubeconfig,
            trace_configs=[self.fence.trace_config(), self.metrics.trace_config(cluster="control")],
            identity=options.identity,
        )
        target = await new_api_client(
            kubeconfig=options.target_kubeconfig,
            trace_configs=[self.fence.trace_config(), self.metrics.trace_config(cluster="target")],
            identity=options.identity,
        )
        self.clients = Clients(control=control, target=target)
        runner = None
        try:
            self.runtime = ShootRuntime(
                options=RuntimeOptions(
                    namespace=options.namespace,
                    identity=options.identity,
                    preservation=options.preservation,
                    native_preservation=options.native_preservation,
                    workers=options.workers,
                    resync_period=options.resync_period,
                    max_drain_attempt=options.max_drain_attempt,
                    shutdown_grace=options.shutdown_grace,
                ),
                control=control,
                target=target,
                metrics=self.metrics,
            )
            await self.runtime.prepare(await inspect_control(control))
            app = metrics_app(metrics=self.metrics, probes=Probes(ready=self.ready))
            runner = await start_metrics_server(app=app, host=options.metrics_host, port=options.metrics_port)
            self.metrics_port = runner.addresses[0][1] if runner.addresses else options.metrics_port
            if not options.leader_elect:
                return await self._lead(stop=stop, lost=asyncio.Event())
            return await self._run_elected(stop=stop)
        finally:
            if runner is not None:
                await runner.cleanup()
            await self.clients.close()

    async def _run_elected(self, *, stop: asyncio.Event) -> int:
        assert self.clients is not None
        options = self.options
        elector = LeaderElector(
            api_client=self.clients.control,
            namespace=options.leader_election_namespace or options.namespace,
            name=options.lease_name,
            identity=options.identity,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
        )
        self.fence.elector = elector
        return await run_elected(
            elector,
            stop=stop,
            lead=lambda lost: self._lead(stop=stop, lost=lost),
            on_leading=lambda leading: self.metrics.leader.set(1 if leading else 0),
            lost_code=EXIT_LOST_LEADERSHIP,
            stopped_code=EXIT_OK,
        )

    async def _lead(self, *, stop: asyncio.Event, lost: asyncio.Event) -> int:
        """Run the lifecycle while leading. An informer that ended for good ends the process (crash-only: its
        replacement lists everything afresh), and the process is not ready meanwhile."""
        assert self.runtime is not None
        self.leading = True
        try:
            return _EXIT_CODES[await self.runtime.run(stop=stop, lost=lost)]
        finally:
            self.leading = False
