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
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.controller.gardener.actuator import EXTENSION_VERSION, ExtensionActuator, decode_ca_bundle
from machine_preservation.controller.gardener.extensions import ExtensionReconciler
from machine_preservation.controller.gardener.shoots import ApiServerProbe, ShootSupervisor
from machine_preservation.controller.machinery.leader import (
    EXIT_LOST_LEADERSHIP,
    EXIT_OK,
    WriteFence,
    lead_when_elected,
)
from machine_preservation.controller.machinery.loop import Loop, Outcome
from machine_preservation.controller.machinery.metrics import Metrics, start_metrics_server
from machine_preservation.controller.machinery.queue import WorkQueue, run_worker
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.runtime import RuntimeOptions
from machine_preservation.controller.preservation.views import new_seed_informers
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.clock import system_clock
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener import shoot_resources
from machine_preservation.core.gardener.cluster import (
    ClusterView,
)
from machine_preservation.kube.api_errors import Failed, NoAnswer, NotFound, api_call
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.kube.informer import Informer, Source

logger = logging.getLogger(__name__)

LEASE_NAME = "gardener-extension-machine-preservation"
# How many bytes of JSON one shoot's Nodes may come to; past it the shoot is reported not served. ~4,000 Gardener
# Nodes of 32 KiB (images, conditions, labels); a cached Node keeps ~2 KiB.
DEFAULT_NODE_BUDGET = 128 * 2**20


@dataclass(frozen=True)
class SeedOptions:
    namespace: str  # the extension namespace: Leases, the CA Secret
    webhook_url: str  # the base URL the shoots' API servers reach the webhook at
    ca_secret: tuple[str, str]  # namespace, name of the certs manager's state Secret
    kubeconfig: Path | None = None  # the seed (default: in-cluster)
    # Every shoot's lifecycle (its `workers`: Machine reconciles per shoot); the seed's own watches resync and stop
    # by its `resync_period` and `shutdown_grace` too.
    runtime: RuntimeOptions = field(default_factory=lambda: RuntimeOptions(node_budget=DEFAULT_NODE_BUDGET))
    extension_workers: int = 10  # Extension reconciles at once, over all shoots
    max_reconciles: int = 20  # Machine/MachineSet/MachineDeployment reconciles at once, over all shoots
    leader_elect: bool = True
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8080
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
    # While leading: the seed-wide watches and the Extension workers (an informer that ends is restarted).
    loop: Loop | None = None
    # Restarts of an informer that ended, 0.5 s doubling to 30 s.
    informer_backoff: Backoff = field(default_factory=lambda: Backoff(base=0.5, cap=30.0))
    # In every client of the process, the shoots' too: no write is sent once leadership may be gone.
    fence: WriteFence = field(default_factory=WriteFence)

    def ready(self) -> bool:
        """A standby is ready; the leader once every seed-wide cache has synced, and again once one that ended (and
        was restarted) has listed anew."""
        if not self.leading:
            return self.options.leader_elect
        return self.loop is not None and self.loop.synced and all(informer.synced for informer in self.informers)

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        """The seed-wide caches while leading."""
        return tuple(self.loop.informers) if self.loop is not None else ()

    async def run(self, stop: asyncio.Event) -> int:
        options = self.options
        seed = await new_api_client(
            kubeconfig=options.kubeconfig,
            trace_configs=[self.fence.trace_config(), self.metrics.trace_config(cluster="seed")],
            identity=options.runtime.identity,
        )
        runner = None
        try:
            runner, self.metrics_port = await start_metrics_server(
                self.metrics, ready=self.ready, host=options.metrics_host, port=options.metrics_port
            )
            return await lead_when_elected(
                options,
                lease=(seed, options.namespace, LEASE_NAME),
                identity=options.runtime.identity,
                fence=self.fence,
                stop=stop,
                lead=lambda lost: self._lead(seed, stop=stop, lost=lost),
                on_leading=lambda leading: self.metrics.leader.set(1 if leading else 0),
            )
        finally:
            if runner is not None:
                await runner.cleanup()
            await seed.close()  # type: ignore[no-untyped-call]

    async def _lead(self, seed: client.ApiClient, *, stop: asyncio.Event, lost: asyncio.Event) -> int:
        options = self.options
        # MCM's objects and the Clusters of every shoot, watched once; each shoot's runtime reads its part.
        seed_informers = new_seed_informers(seed, resync_period=options.runtime.resync_period)
        watches = _SeedWatches.of(
            seed,
            clusters=seed_informers.clusters,
            ca_secret=options.ca_secret,
            resync_period=options.runtime.resync_period,
        )
        queue: WorkQueue[str] = WorkQueue(name="extensions")
        # A shoot's state changes (served, or why not) only update its condition: they never start an operation.
        conditions: WorkQueue[str] = WorkQueue(name="extension-conditions")
        for watched in (queue, conditions):
            self.metrics.watch_queue(watched.name, watched.__len__)
        slots = ReconcileSlots(limit=options.max_reconciles)
        self.metrics.reconcile_slots.set_function(lambda: float(slots.in_use))
        supervisor = self.supervisor = ShootSupervisor(
            seed=seed,
            informers=seed_informers,
            runtime_options=options.runtime,
            access_secret=shoot_resources.SHOOT_ACCESS_SECRET,
            metrics=self.metrics,
            recheck_period=options.mcm_recheck_period,
            probe=options.shoot_probe,
            notify=lambda namespace: conditions.add(namespace),
            slots=slots,
            lost=lost,
            fence=self.fence,
        )
        reconciler = self._reconciler(seed, watches, supervisor)
        watches.wire(queue=queue, conditions=conditions)
        self.loop = Loop(
            name="seed",
            informers=(*watches.own, *seed_informers.all),
            wait_for=watches.all,  # each shoot's runtime waits for its views of MCM's objects
            queues=(queue, conditions),
            restart=self.informer_backoff,
            grace=options.runtime.shutdown_grace,
        )

        def start() -> list[asyncio.Task[None]]:
            logger.info("caches synced: %d Extensions, %d Clusters", len(watches.extensions), len(watches.clusters))
            return self._start_workers(reconciler, queue=queue, conditions=conditions)

        self.leading = True
        try:
            # On a lost Lease the shoots' runtimes saw `lost` as we did and cancel their reconciles in parallel.
            outcome = await self.loop.run(
                stop=stop,
                lost=lost,
                start=start,
                companions=[lambda: self._heartbeat(seed)],
                stopping=supervisor.stop_all,
            )
            return EXIT_LOST_LEADERSHIP if outcome is Outcome.LOST else EXIT_OK
        finally:
            self.leading = False
            self.loop = None

    def _start_workers(
        self, reconciler: ExtensionReconciler, *, queue: WorkQueue[str], conditions: WorkQueue[str]
    ) -> list[asyncio.Task[None]]:
        workers = [
            asyncio.create_task(
                run_worker(queue, reconciler.reconcile, metrics=self.metrics), name=f"extension-worker-{n}"
            )
            for n in range(max(self.options.extension_workers, 1))
        ]
        conditions_worker = run_worker(conditions, reconciler.refresh_health, metrics=self.metrics)
        return [*workers, asyncio.create_task(conditions_worker, name="extension-conditions-worker")]

    def _reconciler(
        self, seed: client.ApiClient, watches: _SeedWatches, supervisor: ShootSupervisor
    ) -> ExtensionReconciler:
        options = self.options
        return ExtensionReconciler(
            seed=seed,
            extensions=watches.extensions,
            clusters=watches.clusters,
            clock=system_clock,
            actuator=ExtensionActuator(
                seed=seed,
                clusters=watches.clusters,
                managed_resources=watches.managed_resources,
                supervisor=supervisor,
                webhook_url=options.webhook_url,
                ca_bundle=watches.ca_bundle,
                clock=system_clock,
                admission=AdmissionSettings(max_preserve_timeout=options.runtime.preservation.max_preserve_timeout),
            ),
        )

    async def _heartbeat(self, seed: client.ApiClient) -> None:
        """Renew `gardener-extension-heartbeat`: without it gardenlet reads our conditions as Unknown."""
        api = client.CoordinationV1Api(seed)
        namespace = self.options.namespace
        period = self.options.heartbeat_period
        while True:
            body = contract.heartbeat_lease(
                namespace=namespace, holder=self.options.runtime.identity, now=system_clock()
            )
            try:
                try:
                    # A merge patch needs no resourceVersion; the client sends a plain JSON body as it is. No
                    # request may outlast the period: an unanswered one must not stop the renewals for good.
                    with api_call():
                        async with asyncio.timeout(period):
                            await api.patch_namespaced_lease(
                                contract.HEARTBEAT_LEASE_NAME, namespace, body, _content_type=MERGE_PATCH
                            )
                except NotFound:
                    with api_call():
                        async with asyncio.timeout(period):
                            await api.create_namespaced_lease(namespace, body)  # type: ignore[arg-type]
            except Failed as error:
                logger.warning("cannot renew the heartbeat Lease: %s %s", error.status, error.reason)
            except NoAnswer as error:
                logger.warning("cannot renew the heartbeat Lease: %r", error)
            await asyncio.sleep(period)


@dataclass(frozen=True)
class _SeedWatches:
    """What the Extension controller reads in the seed: our Extensions, the Clusters (the seed-wide watch the shoots'
    runtimes read too), our ManagedResources (GRM's verdict on the shoot's objects) and the certs manager's CA
    bundle."""

    extensions: Informer[contract.Extension]
    clusters: Informer[ClusterView]
    managed_resources: Informer[shoot_resources.ObjectsApplied]
    ca_secrets: Informer[bytes | None]
    ca_key: str  # namespace/name of the certs manager's Secret

    @property
    def own(self) -> tuple[Informer[Any], ...]:
        """The watches only the Extension controller reads."""
        return (self.extensions, self.ca_secrets, self.managed_resources)

    @property
    def all(self) -> tuple[Informer[Any], ...]:
        return (*self.own, self.clusters)

    def ca_bundle(self) -> bytes | None:
        return self.ca_secrets.get(self.ca_key)

    @classmethod
    def of(
        cls,
        seed: client.ApiClient,
        *,
        clusters: Informer[ClusterView],
        ca_secret: tuple[str, str],
        resync_period: float,
    ) -> _SeedWatches:
        custom, core = client.CustomObjectsApi(seed), client.CoreV1Api(seed)
        listed = custom.list_cluster_custom_object
        ca_namespace, ca_name = ca_secret
        return cls(
            extensions=Informer(
                name="extensions",
                source=Source(
                    listed,
                    (contract.API_GROUP, EXTENSION_VERSION, contract.PLURAL),
                    {"field_selector": f"metadata.name={contract.EXTENSION_TYPE}"},
                ),
                parse=contract.Extension.model_validate,
                resync_period=resync_period,
            ),
            clusters=clusters,
            managed_resources=Informer(
                name="managedresources",
                source=Source(
                    listed,
                    ("resources.gardener.cloud", "v1alpha1", "managedresources"),
                    {"field_selector": f"metadata.name={shoot_resources.MANAGED_RESOURCE}"},
                ),
                parse=shoot_resources.objects_applied,
                resync_period=resync_period,
            ),
            # Only the trust bundle is kept from the certs manager's Secret (it also holds the CA's key).
            ca_secrets=Informer(
                name="webhook-ca",
                source=Source(
                    core.list_namespaced_secret, (ca_namespace,), {"field_selector": f"metadata.name={ca_name}"}
                ),
                parse=lambda secret: decode_ca_bundle(secret, CA_BUNDLE_KEY),
                resync_period=resync_period,
            ),
            ca_key=f"{ca_namespace}/{ca_name}",
        )

    def wire(self, *, queue: WorkQueue[str], conditions: WorkQueue[str]) -> None:
        """Which changes queue a shoot namespace: for an operation (`queue`), or only for its condition."""
        extensions = self.extensions

        def enqueue_extension(old: contract.Extension | None, new: contract.Extension | None) -> None:
            current = new or old
            assert current is not None
            if old is not None and new is not None and old is not new and not contract.asks_for_work(old, new):
                return  # our own status writes, and metadata nobody asked us to act on
            queue.add(current.metadata.namespace, background=old is not None and old is new)

        def enqueue_cluster(old: ClusterView | None, new: ClusterView | None) -> None:
            if old != new and new is not None and extensions.get(f"{new.name}/{contract.EXTENSION_TYPE}"):
                queue.add(new.name)

        def enqueue_all(old: bytes | None, new: bytes | None) -> None:
            if old != new:  # a new CA reaches every shoot
                for extension in extensions.values():
                    queue.add(extension.metadata.namespace)

        def report_objects(
            old: shoot_resources.ObjectsApplied | None, new: shoot_resources.ObjectsApplied | None
        ) -> None:
            current = new or old
            if current is not None and old != new:  # GRM applied (or failed to apply) the shoot's objects
                conditions.add(current.namespace)

        extensions.add_handler(enqueue_extension)
        self.clusters.add_handler(enqueue_cluster)
        self.ca_secrets.add_handler(enqueue_all)
        self.managed_resources.add_handler(report_objects)
