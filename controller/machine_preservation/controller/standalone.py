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
import logging
from dataclasses import dataclass, field
from pathlib import Path

from machine_preservation.controller.machinery.leader import (
    EXIT_LOST_LEADERSHIP,
    EXIT_OK,
    WriteFence,
    lead_when_elected,
)
from machine_preservation.controller.machinery.loop import Outcome
from machine_preservation.controller.machinery.metrics import Metrics, start_metrics_server
from machine_preservation.controller.preservation.caches import Caches
from machine_preservation.controller.preservation.clients import Clients
from machine_preservation.controller.preservation.crd_check import inspect_control
from machine_preservation.controller.preservation.runtime import RuntimeOptions, ShootRuntime
from machine_preservation.core.config import PreservationConfig
from machine_preservation.kube.clients import new_api_client

logger = logging.getLogger(__name__)

EXIT_INFORMER_FAILED = 3  # 2 is the CLI's bad setup
LEASE_NAME = "machine-preservation-controller"
_EXIT_CODES = {
    Outcome.STOPPED: EXIT_OK,
    Outcome.LOST: EXIT_LOST_LEADERSHIP,
    Outcome.INFORMER_FAILED: EXIT_INFORMER_FAILED,
}


@dataclass(frozen=True)
class ControllerOptions:
    namespace: str
    control_kubeconfig: Path | None = None
    target_kubeconfig: Path | None = None
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    leader_elect: bool = True
    leader_election_namespace: str | None = None
    lease_name: str = LEASE_NAME
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8080


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
        return self.runtime.preservation if self.runtime is not None else self.options.runtime.preservation

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
            identity=options.runtime.identity,
        )
        target = await new_api_client(
            kubeconfig=options.target_kubeconfig,
            trace_configs=[self.fence.trace_config(), self.metrics.trace_config(cluster="target")],
            identity=options.runtime.identity,
        )
        self.clients = Clients(control=control, target=target)
        runner = None
        try:
            self.runtime = ShootRuntime(
                namespace=options.namespace,
                options=options.runtime,
                control=control,
                target=target,
                metrics=self.metrics,
            )
            await self.runtime.prepare(await inspect_control(control))
            runner, self.metrics_port = await start_metrics_server(
                self.metrics, ready=self.ready, host=options.metrics_host, port=options.metrics_port
            )
            return await lead_when_elected(
                options,
                lease=(control, options.leader_election_namespace or options.namespace, options.lease_name),
                identity=options.runtime.identity,
                fence=self.fence,
                stop=stop,
                lead=lambda lost: self._lead(stop=stop, lost=lost),
                on_leading=lambda leading: self.metrics.leader.set(1 if leading else 0),
            )
        finally:
            if runner is not None:
                await runner.cleanup()
            await self.clients.close()

    async def _lead(self, *, stop: asyncio.Event, lost: asyncio.Event) -> int:
        """Run the lifecycle while leading. An informer that ended for good ends the process (crash-only: its
        replacement lists everything afresh), and the process is not ready meanwhile."""
        assert self.runtime is not None
        self.leading = True
        try:
            return _EXIT_CODES[await self.runtime.run(stop=stop, lost=lost)]
        finally:
            self.leading = False
