"""The Gardener extension process: one per seed, serving every shoot whose `Extension` of our type exists.

Lifecycle:
1. the seed client; /metrics, /healthz, /readyz (ready: a standby, or the leader once its caches synced);
2. leader election on a Lease in the extension namespace;
3. while leading: caches of the Extensions (named after the type, in every namespace), the Clusters and the
   webhook CA Secret; one queue of shoot namespaces served by `workers` reconciles
   (`extensions.ExtensionReconciler`, the work in `actuator.ExtensionActuator`); the heartbeat Lease
   `gardener-extension-heartbeat` renewed every 30 s so gardenlet trusts our conditions; each enabled shoot's
   preservation lifecycle in `shoots.ShootSupervisor`;
4. on stop: no new work, in-flight reconciles finish (bounded), every shoot's lifecycle stops, the Lease is
   released. Losing the Lease (or passing its renew deadline, `leader.LeaderElector`) cancels every reconcile of
   every shoot at once, before another replica may lead, and ends the process with an error (crash-only).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.controller.gardener.actuator import EXTENSION_VERSION, ExtensionActuator, decode_ca_bundle
from machine_preservation.controller.gardener.extensions import ExtensionReconciler
from machine_preservation.controller.gardener.shoots import ApiServerProbe, ShootSupervisor
from machine_preservation.controller.machinery.leader import LeaderElector, WriteFence, run_elected
from machine_preservation.controller.machinery.metrics import Metrics, Probes, metrics_app, start_metrics_server
from machine_preservation.controller.machinery.queue import WorkQueue, run_worker, stop_workers
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.runtime import DEFAULT_DRAIN_ATTEMPT_TIMEOUT, RuntimeOptions, wait_any
from machine_preservation.controller.preservation.views import new_seed_informers
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.clock import system_clock
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener import shoot_resources
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    ShootFacts,
    read_shoot_facts,
)
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.kube.api_errors import Failed, NoAnswer, NotFound, call
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.kube.informer import Informer, Source, supervise

logger = logging.getLogger(__name__)

LEASE_NAME = "gardener-extension-machine-preservation"
EXIT_OK = 0
EXIT_LOST_LEADERSHIP = 1
# A shoot's Nodes as JSON: ~4,000 Gardener Nodes of 32 KiB (images, conditions, labels); a cached Node keeps ~2 KiB.
DEFAULT_NODE_BUDGET = 128 * 2**20


@dataclass(frozen=True)
class SeedOptions:
    namespace: str  # the extension namespace: Leases, the CA Secret
    webhook_url: str  # the base URL the shoots' API servers reach the webhook at
    ca_secret: tuple[str, str]  # namespace, name of the certs manager's state Secret
    identity: str
    kubeconfig: Path | None = None  # the seed (default: in-cluster)
    preservation: PreservationConfig = field(default_factory=PreservationConfig)
    native_preservation: NativePreservationMode = NativePreservationMode.AUTO
    workers: int = 4  # Machine reconciles per shoot
    extension_workers: int = 10  # Extension reconciles at once, over all shoots
    max_reconciles: int = 20  # Machine/MachineSet/MachineDeployment reconciles at once, over all shoots
    leader_elect: bool = True
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8080
    resync_period: float = 600.0
    # How many bytes of JSON one shoot's Nodes may come to; past it the shoot is reported not served.
    node_budget: int | None = DEFAULT_NODE_BUDGET
    max_drain_attempt: dt.timedelta = DEFAULT_DRAIN_ATTEMPT_TIMEOUT
    shutdown_grace: float = 30.0
    heartbeat_period: float = float(contract.HEARTBEAT_RENEW_SECONDS)
    shoot_probe: ApiServerProbe = field(default_factory=ApiServerProbe)  # tells a slow shoot API server
    mcm_recheck_period: float = 60.0


@dataclass
class SeedController:
    options: SeedOptions
    metrics: Metrics = field(default_factory=Metrics)
    metrics_port: int = 0
    leading: bool = False
    supervisor: ShootSupervisor | None = None
    # The seed-wide caches while leading, each run by `supervise` (restarted with backoff, until then not synced).
    informers: tuple[Informer[Any], ...] = ()
    # Restarts of an informer that ended, 0.5 s doubling to 30 s.
    informer_backoff: Backoff = field(default_factory=lambda: Backoff(base=0.5, cap=30.0))
    _synced: bool = False
    # In every client of the process, the shoots' too: no write is sent once leadership may be gone.
    fence: WriteFence = field(default_factory=WriteFence)

    def ready(self) -> bool:
        """A standby is ready; the leader once every seed-wide cache has synced, and again once one that ended (and
        was restarted) has listed anew."""
        if not self.leading:
            return self.options.leader_elect
        return self._synced and all(informer.synced for informer in self.informers)

    async def run(self, stop: asyncio.Event) -> int:
        options = self.options
        seed = await new_api_client(
            kubeconfig=options.kubeconfig,
            trace_configs=[self.fence.trace_config(), self.metrics.trace_config(cluster="seed")],
            identity=options.identity,
        )
        runner = None
        try:
            app = metrics_app(metrics=self.metrics, probes=Probes(ready=self.ready))
            runner = await start_metrics_server(app=app, host=options.metrics_host, port=options.metrics_port)
            self.metrics_port = runner.addresses[0][1] if runner.addresses else options.metrics_port
            if not options.leader_elect:
                return await self._lead(seed, stop=stop, lost=asyncio.Event())
            elector = LeaderElector(
                api_client=seed,
                namespace=options.namespace,
                name=LEASE_NAME,
                identity=options.identity,
                lease_duration=options.lease_duration,
                renew_deadline=options.renew_deadline,
                retry_period=options.retry_period,
            )
            self.fence.elector = elector
            return await run_elected(
                elector,
                stop=stop,
                lead=lambda lost: self._lead(seed, stop=stop, lost=lost),
                on_leading=lambda leading: self.metrics.leader.set(1 if leading else 0),
                lost_code=EXIT_LOST_LEADERSHIP,
                stopped_code=EXIT_OK,
            )
        finally:
            if runner is not None:
                await runner.cleanup()
            await seed.close()  # type: ignore[no-untyped-call]

    def _runtime_options(self, namespace: str) -> RuntimeOptions:
        options = self.options
        return RuntimeOptions(
            namespace=namespace,
            identity=options.identity,
            preservation=options.preservation,
            native_preservation=options.native_preservation,
            workers=options.workers,
            resync_period=options.resync_period,
            node_budget=options.node_budget,
            max_drain_attempt=options.max_drain_attempt,
            shutdown_grace=options.shutdown_grace,
        )

    async def _lead(self, seed: client.ApiClient, *, stop: asyncio.Event, lost: asyncio.Event) -> int:
        options = self.options
        self.leading = True
        custom, core = client.CustomObjectsApi(seed), client.CoreV1Api(seed)
        extensions: Informer[contract.Extension] = Informer(
            name="extensions",
            source=Source(
                custom.list_cluster_custom_object,
                (contract.API_GROUP, EXTENSION_VERSION, contract.PLURAL),
                {"field_selector": f"metadata.name={contract.EXTENSION_TYPE}"},
            ),
            parse=contract.Extension.model_validate,
            resync_period=options.resync_period,
        )
        clusters: Informer[ShootFacts] = Informer(
            name="clusters",
            source=Source(custom.list_cluster_custom_object, (CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL)),
            parse=read_shoot_facts,
            resync_period=options.resync_period,
        )
        managed_resources: Informer[shoot_resources.ObjectsApplied] = Informer(
            name="managedresources",
            source=Source(
                custom.list_cluster_custom_object,
                ("resources.gardener.cloud", "v1alpha1", "managedresources"),
                {"field_selector": f"metadata.name={shoot_resources.MANAGED_RESOURCE}"},
            ),
            parse=shoot_resources.objects_applied,
            resync_period=options.resync_period,
        )
        ca_namespace, ca_name = options.ca_secret
        # Only the trust bundle is kept from the certs manager's Secret (it also holds the CA's key).
        ca_secrets: Informer[bytes | None] = Informer(
            name="webhook-ca",
            source=Source(core.list_namespaced_secret, (ca_namespace,), {"field_selector": f"metadata.name={ca_name}"}),
            parse=lambda secret: decode_ca_bundle(secret, CA_BUNDLE_KEY),
            resync_period=options.resync_period,
        )
        queue: WorkQueue[str] = WorkQueue(name="extensions")
        # A shoot's state changes (served, or why not) only update its condition: they never start an operation.
        conditions: WorkQueue[str] = WorkQueue(name="extension-conditions")
        for watched in (queue, conditions):
            self.metrics.watch_queue(watched.name, watched.__len__)
        slots = ReconcileSlots(limit=options.max_reconciles)
        self.metrics.reconcile_slots.set_function(lambda: float(slots.in_use))
        # MCM's objects and the Clusters of every shoot, watched once; each shoot's runtime reads its part.
        seed_informers = new_seed_informers(seed, resync_period=options.resync_period)
        supervisor = self.supervisor = ShootSupervisor(
            seed=seed,
            informers=seed_informers,
            runtime_options=self._runtime_options,
            access_secret=shoot_resources.SHOOT_ACCESS_SECRET,
            metrics=self.metrics,
            recheck_period=options.mcm_recheck_period,
            probe=options.shoot_probe,
            notify=lambda namespace: conditions.add(namespace),
            slots=slots,
            lost=lost,
            fence=self.fence,
        )

        def ca_bundle() -> bytes | None:
            return ca_secrets.get(f"{ca_namespace}/{ca_name}")

        actuator = ExtensionActuator(
            seed=seed,
            clusters=clusters,
            managed_resources=managed_resources,
            supervisor=supervisor,
            webhook_url=options.webhook_url,
            ca_bundle=ca_bundle,
            clock=system_clock,
            admission=AdmissionSettings(max_preserve_timeout=options.preservation.max_preserve_timeout),
        )
        reconciler = ExtensionReconciler(
            seed=seed, extensions=extensions, clusters=clusters, clock=system_clock, actuator=actuator
        )

        def enqueue_extension(old: contract.Extension | None, new: contract.Extension | None) -> None:
            current = new or old
            assert current is not None
            if old is not None and new is not None and old is not new and not contract.asks_for_work(old, new):
                return  # our own status writes, and metadata nobody asked us to act on
            queue.add(current.metadata.namespace, background=old is not None and old is new)

        def enqueue_cluster(old: ShootFacts | None, new: ShootFacts | None) -> None:
            if old != new and new is not None and extensions.get(f"{new.namespace}/{contract.EXTENSION_TYPE}"):
                queue.add(new.namespace)

        def enqueue_all(old: bytes | None, new: bytes | None) -> None:
            if old != new:  # a new CA reaches every shoot
                for extension in extensions.values():
                    queue.add(extension.metadata.namespace)

        extensions.add_handler(enqueue_extension)
        clusters.add_handler(enqueue_cluster)
        ca_secrets.add_handler(enqueue_all)

        def report_objects(
            old: shoot_resources.ObjectsApplied | None, new: shoot_resources.ObjectsApplied | None
        ) -> None:
            current = new or old
            if current is not None and old != new:  # GRM applied (or failed to apply) the shoot's objects
                conditions.add(current.namespace)

        managed_resources.add_handler(report_objects)
        running: tuple[Informer[Any], ...] = (extensions, clusters, ca_secrets, managed_resources, *seed_informers.all)
        self.informers = running
        informers = [
            asyncio.create_task(supervise(i, self.informer_backoff), name=f"informer-{i.name}") for i in running
        ]
        heartbeat = asyncio.create_task(self._heartbeat(seed), name="heartbeat")
        workers: list[asyncio.Task[None]] = []
        synced = asyncio.Event()
        waiting = asyncio.create_task(_set_when_synced((extensions, clusters, ca_secrets, managed_resources), synced))
        try:
            await wait_any(stop, lost, synced)
            if synced.is_set() and not (stop.is_set() or lost.is_set()):
                self._synced = True
                logger.info("caches synced: %d Extensions, %d Clusters", len(extensions), len(clusters))
                workers = [
                    asyncio.create_task(
                        run_worker(queue, reconciler.reconcile, metrics=self.metrics), name=f"extension-worker-{n}"
                    )
                    for n in range(max(options.extension_workers, 1))
                ]
                workers.append(
                    asyncio.create_task(
                        run_worker(conditions, reconciler.refresh_health, metrics=self.metrics),
                        name="extension-conditions-worker",
                    )
                )
                await wait_any(stop, lost)
            return EXIT_LOST_LEADERSHIP if lost.is_set() else EXIT_OK
        finally:
            if lost.is_set():
                heartbeat.cancel()  # no write after the Lease is gone, not even our heartbeat
            queue.shutdown()
            conditions.shutdown()
            # On a lost Lease the shoots' runtimes saw `lost` as we did and cancel their reconciles in parallel.
            await asyncio.gather(
                stop_workers(workers, grace=0.0 if lost.is_set() else options.shutdown_grace), supervisor.stop_all()
            )
            self.leading = self._synced = False
            self.informers = ()
            for task in (waiting, heartbeat, *informers):
                task.cancel()
            await asyncio.gather(waiting, heartbeat, *informers, return_exceptions=True)

    async def _heartbeat(self, seed: client.ApiClient) -> None:
        """Renew `gardener-extension-heartbeat`: without it gardenlet reads our conditions as Unknown."""
        api = client.CoordinationV1Api(seed)
        namespace = self.options.namespace
        period = self.options.heartbeat_period
        while True:
            body = contract.heartbeat_lease(namespace=namespace, holder=self.options.identity, now=system_clock())
            try:
                try:
                    # A merge patch needs no resourceVersion; the client sends a plain JSON body as it is. No
                    # request may outlast the period: an unanswered one must not stop the renewals for good.
                    await call(
                        asyncio.wait_for(
                            api.patch_namespaced_lease(
                                contract.HEARTBEAT_LEASE_NAME, namespace, body, _content_type=MERGE_PATCH
                            ),
                            period,
                        )
                    )
                except NotFound:
                    await call(asyncio.wait_for(api.create_namespaced_lease(namespace, body), period))  # type: ignore[arg-type]
            except Failed as error:
                logger.warning("cannot renew the heartbeat Lease: %s %s", error.status, error.reason)
            except NoAnswer as error:
                logger.warning("cannot renew the heartbeat Lease: %r", error)
            await asyncio.sleep(period)


async def _set_when_synced(informers: tuple[Informer[Any], ...], synced: asyncio.Event) -> None:
    await asyncio.gather(*(informer.wait_synced() for informer in informers))
    synced.set()
