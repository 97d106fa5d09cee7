"""The controller process: clients, startup check, metrics server, leader election, caches, workers.

Lifecycle (controller-runtime's manager, in one event loop):
1. build the API clients, inspect MCM's CRDs (exit with a clear error if the Machine CRD is unusable) and
   decide whether MCM preserves natively (then hand over and only observe);
2. serve /metrics, /healthz and /readyz (ready once every cache has synced);
3. with leader election, wait until this process leads (or a stop is requested);
4. start the informers, wait until they have synced, start the workers;
5. on stop: stop taking work (queues shut down), let in-flight reconciles finish (bounded), stop the
   informers, release the Lease. Losing the Lease instead ends the process with an error (crash-only:
   the replacement starts from the API objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.api_errors import ApiError, classify
from machine_preservation.controller.apply import Writer
from machine_preservation.controller.caches import Caches, new_caches
from machine_preservation.controller.clients import Clients, new_api_client
from machine_preservation.controller.crd_check import inspect_crds
from machine_preservation.controller.drain import Drainer
from machine_preservation.controller.events import EventRecorder
from machine_preservation.controller.handlers import Queues, wire_handlers
from machine_preservation.controller.leader import LeaderElector
from machine_preservation.controller.metrics import (
    Metrics,
    Probes,
    metrics_app,
    preserved_counts,
    start_metrics_server,
)
from machine_preservation.controller.pools import PoolSettingsReader
from machine_preservation.controller.queue import WorkQueue, run_worker
from machine_preservation.controller.reconcile import (
    MachineDeploymentReconciler,
    MachineReconciler,
    MachineSetReconciler,
)
from machine_preservation.core.clock import system_clock
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.mcm_evidence import MCM_DEPLOYMENT, mcm_image
from machine_preservation.core.mcm_generation import ClusterEvidence, NativePreservationMode, decide_native_preservation
from machine_preservation.core.pool_settings import CLUSTER_API_GROUP, CLUSTER_PLURAL, PoolDefaults

logger = logging.getLogger(__name__)

DEFAULT_DRAIN_ATTEMPT_TIMEOUT = dt.timedelta(minutes=2)

EXIT_OK = 0
EXIT_LOST_LEADERSHIP = 1
EXIT_INFORMER_FAILED = 3  # 2 is the CLI's bad setup
LEASE_NAME = "machine-preservation-controller"
CLUSTER_CRD = f"{CLUSTER_PLURAL}.{CLUSTER_API_GROUP}"


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
    caches: Caches | None = None
    clients: Clients | None = None
    metrics_port: int = 0  # the port actually bound (options.metrics_port may be 0)
    leading: bool = False
    native: bool = False  # MCM preserves natively (decided at start)
    informer_failed: asyncio.Event = field(default_factory=asyncio.Event)
    preservation: PreservationConfig = field(default_factory=PreservationConfig)  # options' + what the CRDs keep

    def ready(self) -> bool:
        """A standby replica is ready (it must not block a rollout); the leader once its caches synced."""
        if self.informer_failed.is_set():
            return False  # a cache no longer follows the cluster
        if not self.leading:
            return self.options.leader_elect
        return self.caches is not None and self.caches.synced()

    async def run(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set (exit 0) or leadership is lost (exit 1)."""
        options = self.options
        control = await new_api_client(
            kubeconfig=options.control_kubeconfig, trace_configs=[self.metrics.trace_config(cluster="control")]
        )
        target = await new_api_client(
            kubeconfig=options.target_kubeconfig, trace_configs=[self.metrics.trace_config(cluster="target")]
        )
        self.clients = Clients(control=control, target=target)
        runner = None
        try:
            self.preservation = await self._inspect_cluster(control)
            self.caches = new_caches(
                control=control,
                target=target,
                namespace=self.options.namespace,
                resync_period=self.options.resync_period,
                with_cluster=await has_crd(control, CLUSTER_CRD),
            )
            app = metrics_app(metrics=self.metrics, probes=Probes(ready=self.ready))
            runner = await start_metrics_server(app=app, host=options.metrics_host, port=options.metrics_port)
            self.metrics_port = runner.addresses[0][1] if runner.addresses else options.metrics_port
            if not options.leader_elect:
                return await self._lead(stop=stop, lost=asyncio.Event())
            return await self._run_elected(stop=stop, api_client=control)
        finally:
            if runner is not None:
                await runner.cleanup()
            await self.clients.close()

    async def _inspect_cluster(self, control: client.ApiClient) -> PreservationConfig:
        """What MCM's CRDs keep and whether MCM preserves natively; the settings to run with."""
        facts = await inspect_crds(control)
        evidence = ClusterEvidence(
            mcm_image=await read_mcm_image(control, namespace=self.options.namespace),
            machine_crd_has_expiry=facts.machine_keeps_expiry,
            machine_set_crd_has_auto_max=facts.machine_set_keeps_auto_max,
        )
        decision = decide_native_preservation(mode=self.options.native_preservation, evidence=evidence)
        self.native = decision.native
        logger.info(
            "MCM native preservation: %s (%s)%s",
            "on" if decision.native else "off",
            decision.because,
            "; the controller hands over and only observes" if decision.native else "",
        )
        return dataclasses.replace(self.options.preservation, mirror_status=facts.machine_keeps_expiry)

    async def _run_elected(self, *, stop: asyncio.Event, api_client: client.ApiClient) -> int:
        options = self.options
        elector = LeaderElector(
            api_client=api_client,
            namespace=options.leader_election_namespace or options.namespace,
            name=options.lease_name,
            identity=options.identity,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
        )
        election = asyncio.create_task(elector.run(), name="leader-election")
        try:
            await _wait_any(stop, elector.leading, elector.lost)
            if stop.is_set():
                logger.info("stopping before leading")
                return EXIT_OK
            if elector.lost.is_set():
                return EXIT_LOST_LEADERSHIP
            self.metrics.leader.set(1)
            return await self._lead(stop=stop, lost=elector.lost)
        finally:
            self.metrics.leader.set(0)
            election.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await election
            if not elector.lost.is_set():
                await elector.release()

    async def _lead(self, *, stop: asyncio.Event, lost: asyncio.Event) -> int:
        assert self.caches is not None
        assert self.clients is not None
        caches, options = self.caches, self.options
        self.leading = True
        queues = Queues(
            machines=WorkQueue(name="machines"),
            machine_sets=WorkQueue(name="machinesets"),
            machine_deployments=WorkQueue(name="machinedeployments"),
        )
        for queue in queues.all:
            self.metrics.watch_queue(queue.name, queue.__len__)
        # Handlers first: the initial lists enqueue every object; workers start once all caches synced.
        wire_handlers(caches=caches, queues=queues)
        informers = [asyncio.create_task(i.run(), name=f"informer-{i.name}") for i in caches.all]
        for task in informers:
            task.add_done_callback(self._supervise)
        workers: list[asyncio.Task[None]] = []
        synced = asyncio.Event()
        waiting = asyncio.create_task(_set_when_synced(caches, synced))
        failed = self.informer_failed
        try:
            await _wait_any(stop, lost, synced, failed)
            if synced.is_set() and not (stop.is_set() or lost.is_set() or failed.is_set()):
                logger.info(
                    "caches synced: %d machines, %d machinesets, %d nodes, %d pods",
                    len(caches.machines),
                    len(caches.machine_sets),
                    len(caches.nodes),
                    len(caches.pods),
                )
                workers = self._start_workers(queues)
                await _wait_any(stop, lost, failed)
            if failed.is_set():
                return EXIT_INFORMER_FAILED
            return EXIT_LOST_LEADERSHIP if lost.is_set() else EXIT_OK
        finally:
            for queue in queues.all:
                queue.shutdown()
            if workers:
                # On a stop, in-flight reconciles finish (bounded); without the lease, another leader may
                # already be writing, so nothing more is written from here.
                grace = 0.0 if lost.is_set() else options.shutdown_grace
                _, pending = await asyncio.wait(workers, timeout=grace) if grace else (set(), set(workers))
                for task in pending:
                    task.cancel()
            self.leading = False
            waiting.cancel()
            for task in informers:
                task.cancel()
            await asyncio.gather(waiting, *informers, *workers, return_exceptions=True)

    def _supervise(self, task: asyncio.Task[None]) -> None:
        """An informer runs until cancelled; one that ended otherwise leaves its cache stale for good, so the
        process stops (crash-only: its replacement lists everything afresh) and is not ready meanwhile."""
        if task.cancelled():
            return
        error = task.exception()
        logger.error("%s ended (%r): its cache no longer follows the cluster; stopping", task.get_name(), error)
        self.informer_failed.set()

    def _start_workers(self, queues: Queues) -> list[asyncio.Task[None]]:
        assert self.caches is not None
        assert self.clients is not None
        options, caches = self.options, self.caches
        recorder = EventRecorder(
            control=self.clients.control,
            target=self.clients.target,
            machine_namespace=options.namespace,
            instance=options.identity,
        )
        writer = Writer(
            control=self.clients.control, target=self.clients.target, namespace=options.namespace, recorder=recorder
        )
        machines = MachineReconciler(
            caches=caches,
            writer=writer,
            drainer=Drainer(target=self.clients.target, pods=caches.pods),
            config=self.preservation,
            metrics=self.metrics,
            native=self.native,
            max_drain_attempt=options.max_drain_attempt,
            max_concurrent_drains=max(options.workers // 2, 1),
        )
        pools = PoolSettingsReader(
            caches=caches,
            namespace=options.namespace,
            defaults=PoolDefaults(preserve_timeout=self.preservation.default_preserve_timeout),
        )
        machines.pool_timeout = pools.preserve_timeout
        machine_sets = MachineSetReconciler(
            caches=caches, writer=writer, config=self.preservation, pool_limit=pools.auto_preserve_max
        )
        deployments = MachineDeploymentReconciler(caches=caches, writer=writer)
        config, native = self.preservation, self.native
        self.metrics.watch_preserved(
            lambda: preserved_counts(caches.machines.values(), now=system_clock(), config=config, native=native)
        )
        workers = [(queues.machines, machines.reconcile, max(options.workers, 1))]
        if not self.native:  # MCM runs auto-preservation and its counters itself
            workers.append((queues.machine_sets, machine_sets.reconcile, 1))
            if self.preservation.mirror_status:  # the counters are all a MachineDeployment plan writes
                workers.append((queues.machine_deployments, deployments.reconcile, 1))
        return [
            asyncio.create_task(run_worker(queue, reconcile, metrics=self.metrics), name=f"{queue.name}-worker-{n}")
            for queue, reconcile, count in workers
            for n in range(count)
        ]


async def has_crd(api_client: client.ApiClient, name: str) -> bool:
    """Whether the CRD is installed; said in the log either way, since what depends on it is then left out."""
    response = await client.ApiextensionsV1Api(api_client).read_custom_resource_definition_without_preload_content(name)
    body = await response.read()
    if response.status == 200:
        logger.info("CRD %s is installed", name)
        return True
    if classify(response.status) is ApiError.NOT_FOUND:
        logger.info("CRD %s is not installed", name)
    else:
        logger.warning(
            "cannot read CRD %s (HTTP %d %s): treated as not installed",
            name,
            response.status,
            body[:200].decode(errors="replace"),
        )
    return False


async def read_mcm_image(api_client: client.ApiClient, *, namespace: str) -> str | None:
    """The image of MCM's Deployment in the control namespace (as Gardener runs it), if it can be read."""
    response = await client.AppsV1Api(api_client).read_namespaced_deployment_without_preload_content(
        MCM_DEPLOYMENT, namespace
    )
    body = await response.read()
    if classify(response.status) in (ApiError.FORBIDDEN, ApiError.NOT_FOUND):
        return None  # not a Gardener-style install, or no right to look: the CRDs decide
    if response.status != 200:
        raise ApiException(status=response.status, reason=response.reason, body=body.decode(errors="replace"))
    return mcm_image(json.loads(body))


async def _set_when_synced(caches: Caches, synced: asyncio.Event) -> None:
    await asyncio.gather(*(informer.wait_synced() for informer in caches.all))
    synced.set()


async def _wait_any(*events: asyncio.Event) -> None:
    """Until one of the events is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
