"""The preservation lifecycle of one shoot: its control namespace (MCM's objects) and its target cluster (Nodes,
Pods), given API clients for both.

The standalone controller runs one of these for its one namespace; the Gardener extension runs one per enabled
shoot in the same process. A runtime:
1. `prepare`: inspects MCM's CRDs and Deployment, decides whether MCM preserves natively (then it hands over and
   only observes) and builds its caches;
2. `run`: wires the handlers, starts the informers, waits until they synced, starts the workers, and runs until
   `stop` or `lost` is set or an informer ends for good (`informer_failed`);
3. on the way out stops taking work, lets in-flight reconciles finish (bounded; not at all when `lost`: another
   leader may already write) and stops the informers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.aio import client

from machine_preservation.controller.machinery.events import EventRecorder
from machine_preservation.controller.machinery.leader import default_identity
from machine_preservation.controller.machinery.loop import Loop, Outcome
from machine_preservation.controller.machinery.metrics import Metrics, Unwatch, preserved_counts, preserved_nodes_gone
from machine_preservation.controller.machinery.queue import WorkQueue, run_worker
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.apply import Writer
from machine_preservation.controller.preservation.caches import Caches, new_caches, shoot_caches
from machine_preservation.controller.preservation.crd_check import ControlFacts, CrdFacts
from machine_preservation.controller.preservation.drain import Drainer
from machine_preservation.controller.preservation.evidence import EvidenceKeeper, EvidenceSweeper
from machine_preservation.controller.preservation.handlers import Queues, wire_handlers
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.pools import PoolSettingsReader
from machine_preservation.controller.preservation.reconcile import (
    LiveNodes,
    MachineDeploymentReconciler,
    MachineReconciler,
    MachineSetReconciler,
)
from machine_preservation.controller.preservation.views import ShootViews
from machine_preservation.core import conditions
from machine_preservation.core import vocabulary as v
from machine_preservation.core.clock import system_clock
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.evidence import preserved_nodes
from machine_preservation.core.mcm_evidence import MCM_DEPLOYMENT, mcm_image
from machine_preservation.core.mcm_generation import (
    ClusterEvidence,
    NativeDecision,
    NativePreservationMode,
    decide_native_preservation,
)
from machine_preservation.core.models import Machine
from machine_preservation.core.pool_settings import PoolDefaults
from machine_preservation.kube.api_errors import ApiError, read_json

logger = logging.getLogger(__name__)

DEFAULT_DRAIN_ATTEMPT_TIMEOUT = dt.timedelta(minutes=2)
# How long the evidence of a failure is kept after its preservation ended: a day, for the SRE to look the next morning.
DEFAULT_EVIDENCE_GRACE = dt.timedelta(hours=24)


@dataclass(frozen=True)
class RuntimeOptions:
    """What every runtime of a process is run with; built once, from the command line."""

    identity: str = field(
        default_factory=default_identity
    )  # names the Events' reporting instance and the Leases' holder
    preservation: PreservationConfig = field(default_factory=PreservationConfig)
    native_preservation: NativePreservationMode = NativePreservationMode.AUTO
    workers: int = 4
    resync_period: float = 600.0
    # How many bytes of JSON the shoot's Nodes may come to (None: no budget); see `caches.shoot_caches`.
    node_budget: int | None = None
    max_drain_attempt: dt.timedelta = DEFAULT_DRAIN_ATTEMPT_TIMEOUT
    # How long the evidence of a failure is kept once its preservation ended (0: deleted then).
    evidence_grace: dt.timedelta = DEFAULT_EVIDENCE_GRACE
    shutdown_grace: float = 30.0


@dataclass
class ShootRuntime:
    namespace: str  # the control namespace: MCM's objects, Gardener's Cluster of the same name
    options: RuntimeOptions
    control: client.ApiClient
    target: client.ApiClient
    metrics: Metrics
    caches: Caches | None = None
    native: bool = False  # MCM preserves natively (decided by `prepare`)
    preservation: PreservationConfig = field(default_factory=PreservationConfig)  # options' + what the CRDs keep
    informer_failed: asyncio.Event = field(default_factory=asyncio.Event)
    # Reconciles at once, shared with the other shoots of the process (none: no cap).
    slots: ReconcileSlots = field(default_factory=ReconcileSlots)
    # In the seed: the shoot's views of the seed-wide caches of MCM's objects and Clusters (None: its own).
    views: ShootViews | None = None
    # The extension is being disabled for this shoot: stop every preservation, start none (no auto-preservation).
    releasing: bool = False
    # Told whenever one of the runtime's own caches syncs, fails or recovers (`failing`, `synced` may have changed).
    on_state: Callable[[], None] | None = None

    def synced(self) -> bool:
        return self.caches is not None and self.caches.synced()

    def failing(self) -> str | None:
        """Why a cache does not follow its cluster right now (e.g. the shoot's API server is unreachable)."""
        if self.caches is None:
            return None
        if self.nodes_over_budget():
            return f"the shoot's Nodes are over their budget: {self.caches.nodes.failing}"
        for informer in self.caches.all:
            if informer.failing:
                return f"cannot watch {informer.name}: {informer.failing}"
        return None

    def nodes_over_budget(self) -> bool:
        return self.caches is not None and self.caches.nodes.over_budget

    def preservations_left(self) -> int:
        """Machines still carrying our record or whose node is still tainted or shows a preservation."""
        if self.caches is None:
            return 0
        nodes = self.caches.nodes

        def preserved(machine: Machine) -> bool:
            if machine.preservation is not None:
                return True
            node = nodes.get(machine.node_name) if machine.node_name else None
            return node is not None and (
                node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
                or conditions.shows_preservation(node.preserved_condition)
            )

        return sum(1 for machine in self.caches.machines.values() if preserved(machine))

    async def prepare(self, facts: ControlFacts) -> None:
        """Decide native preservation and what MCM's CRDs keep (`facts`: the control cluster's CRDs); build the
        caches (not started yet)."""
        decision = await inspect_mcm(
            self.control, namespace=self.namespace, mode=self.options.native_preservation, crds=facts.crds
        )
        self.native = decision.native
        logger.info(
            "%s: MCM native preservation: %s (%s)%s",
            self.namespace,
            "on" if decision.native else "off",
            decision.because,
            "; the controller hands over and only observes" if decision.native else "",
        )
        self.preservation = dataclasses.replace(
            self.options.preservation, mirror_status=facts.crds.machine_keeps_expiry
        )
        if self.views is not None:
            self.caches = shoot_caches(
                views=self.views,
                target=self.target,
                resync_period=self.options.resync_period,
                node_budget=self.options.node_budget,
            )
        else:
            self.caches = new_caches(
                control=self.control,
                target=self.target,
                namespace=self.namespace,
                resync_period=self.options.resync_period,
                with_cluster=facts.has_cluster,
            )
        if self.on_state is not None:
            for informer in self.caches.owned:
                informer.add_state_listener(self.on_state)

    async def run(self, *, stop: asyncio.Event, lost: asyncio.Event) -> Outcome:
        assert self.caches is not None, "prepare() first"
        caches, options = self.caches, self.options
        queues = Queues(
            machines=WorkQueue(name="machines"),
            machine_sets=WorkQueue(name="machinesets"),
            machine_deployments=WorkQueue(name="machinedeployments"),
        )
        unwatch = [self.metrics.watch_queue(q.name, q.__len__, scope=self.namespace) for q in queues.all]
        # A queue no worker serves takes no keys (they would wait there for good, shown as its depth).
        for serves, queue in (
            (self._serves_machine_sets(), queues.machine_sets),
            (self._serves_machine_deployments(), queues.machine_deployments),
        ):
            if not serves:
                queue.shutdown()
        node_pods = NodePods(target=self.target, resync_period=options.resync_period)
        recorder = EventRecorder(
            control=self.control, target=self.target, machine_namespace=self.namespace, instance=options.identity
        )
        evidence = EvidenceKeeper(target=self.target, recorder=recorder)
        # Handlers first: the initial lists enqueue every object; workers start once all caches synced.
        wire_handlers(caches=caches, node_pods=node_pods, queues=queues)
        loop = Loop(
            name=self.namespace,
            informers=caches.owned,
            wait_for=caches.all,
            queues=queues.all,
            grace=options.shutdown_grace,
            failed=self.informer_failed,
        )

        def start() -> list[asyncio.Task[None]]:
            logger.info(
                "%s: caches synced: %d machines, %d machinesets, %d nodes",
                self.namespace,
                len(caches.machines),
                len(caches.machine_sets),
                len(caches.nodes),
            )
            unwatch.append(self._watch_preserved())
            return self._start_workers(queues, node_pods, recorder, evidence)

        try:
            return await loop.run(
                stop=stop, lost=lost, start=start, companions=[lambda: self._sweep_evidence(evidence)]
            )
        finally:
            await evidence.stop()
            await node_pods.stop()
            caches.close()
            for forget in unwatch:
                forget()

    def _serves_machine_sets(self) -> bool:
        """MachineSets are reconciled unless MCM runs auto-preservation and its counters itself, or the shoot's
        preservations are being released."""
        return not self.native and not self.releasing

    def _serves_machine_deployments(self) -> bool:
        # The counters are all a MachineDeployment plan writes, and only CRDs that keep them can hold them.
        return self._serves_machine_sets() and self.preservation.mirror_status

    def _watch_preserved(self) -> Unwatch:
        assert self.caches is not None
        caches, config, native = self.caches, self.preservation, self.native
        return self.metrics.watch_preserved(
            self.namespace,
            lambda: preserved_counts(caches.machines.values(), now=system_clock(), config=config, native=native),
            lambda: preserved_nodes_gone(caches.machines.values(), now=system_clock(), config=config),
        )

    async def _sweep_evidence(self, evidence: EvidenceKeeper) -> None:
        """Once the caches synced (the Machines tell which nodes are preserved), remove the evidence of ended
        preservations after the grace period."""
        assert self.caches is not None
        caches, native = self.caches, self.native
        await asyncio.gather(*(cache.wait_synced() for cache in caches.all))

        def preserved() -> set[str]:
            return preserved_nodes(caches.machines.values(), now=system_clock(), native=native)

        await EvidenceSweeper(
            target=self.target,
            grace=self.options.evidence_grace,
            preserved=preserved,
            captures_ended=lambda: evidence.ended,
        ).run()

    def _start_workers(
        self, queues: Queues, node_pods: NodePods, recorder: EventRecorder, evidence: EvidenceKeeper
    ) -> list[asyncio.Task[None]]:
        assert self.caches is not None
        options, caches = self.options, self.caches
        writer = Writer(
            control=self.control, target=self.target, namespace=self.namespace, recorder=recorder, slots=self.slots
        )
        machines = MachineReconciler(
            caches=caches,
            writer=writer,
            drainer=Drainer(target=self.target, pods=node_pods),
            live_nodes=LiveNodes(target=self.target),
            node_pods=node_pods,
            evidence=evidence,
            config=self.preservation,
            metrics=self.metrics,
            native=self.native,
            released=self.releasing,
            max_drain_attempt=options.max_drain_attempt,
            max_concurrent_drains=max(options.workers // 2, 1),
            slots=self.slots,
        )
        pools = PoolSettingsReader(
            caches=caches,
            namespace=self.namespace,
            defaults=PoolDefaults(preserve_timeout=self.preservation.default_preserve_timeout),
        )
        machines.pool_timeout = pools.preserve_timeout
        machine_sets = MachineSetReconciler(
            caches=caches, writer=writer, config=self.preservation, pool_limit=pools.auto_preserve_max
        )
        deployments = MachineDeploymentReconciler(caches=caches, writer=writer)
        workers = [(queues.machines, machines.reconcile, max(options.workers, 1))]
        if self._serves_machine_sets():
            workers.append((queues.machine_sets, machine_sets.reconcile, 1))
        if self._serves_machine_deployments():
            workers.append((queues.machine_deployments, deployments.reconcile, 1))
        return [
            asyncio.create_task(
                run_worker(queue, reconcile, metrics=self.metrics, slots=self.slots), name=f"{queue.name}-worker-{n}"
            )
            for queue, reconcile, count in workers
            for n in range(count)
        ]


async def inspect_mcm(
    control: client.ApiClient, *, namespace: str, mode: NativePreservationMode, crds: CrdFacts
) -> NativeDecision:
    """Whether MCM preserves natively in `namespace`: its Deployment's image, else what its CRDs keep."""
    evidence = ClusterEvidence(
        mcm_image=await read_mcm_image(control, namespace=namespace),
        machine_crd_has_expiry=crds.machine_keeps_expiry,
        machine_set_crd_has_auto_max=crds.machine_set_keeps_auto_max,
    )
    return decide_native_preservation(mode=mode, evidence=evidence)


async def read_mcm_image(api_client: client.ApiClient, *, namespace: str) -> str | None:
    """The image of MCM's Deployment in the control namespace (as Gardener runs it), if it can be read."""
    response = await client.AppsV1Api(api_client).read_namespaced_deployment_without_preload_content(
        MCM_DEPLOYMENT, namespace
    )
    # Absent or forbidden: not a Gardener-style install, or no right to look; the CRDs decide.
    deployment = await read_json(response, absent=frozenset({ApiError.FORBIDDEN, ApiError.NOT_FOUND}))
    return None if deployment is None else mcm_image(deployment)
