"""The reconcilers: from a key to a snapshot from the caches, to the core's plan, to API writes.

Level-based and idempotent: a reconcile reads only the caches and the clock, asks the core what the
objects should look like, writes the differences and says when to look again (the worker requeues the key
then). Which keys to look at comes from the event handlers (`handlers.wire_handlers`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.aio import client

from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.apply import (
    Snapshot,
    Writer,
    execute,
    execute_machine_plan,
    execute_machine_set_plan,
)
from machine_preservation.controller.preservation.drain import Drainer, DrainResult
from machine_preservation.controller.preservation.evidence import EVIDENCE_WAIT, EvidenceKeeper
from machine_preservation.controller.preservation.reader import (
    DEPLOYMENT_INDEX,
    MACHINE_SET_INDEX,
    POD_NODE_INDEX,
    CacheReader,
    NodePodReader,
    owner_name,
)
from machine_preservation.core import plan as p
from machine_preservation.core import vocabulary as v
from machine_preservation.core.auto_preservation import is_being_replaced, plan_machine_deployment, plan_machine_set
from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.evidence import natively_preserved_since
from machine_preservation.core.lifecycle import (
    MachineContext,
    health_to_confirm,
    labelled_node,
    not_deleted,
    plan_after_drain,
    plan_machine,
)
from machine_preservation.core.models import Machine, MachineSet, Node, cached_node
from machine_preservation.core.native import plan_native
from machine_preservation.kube.api_errors import read_json

logger = logging.getLogger(__name__)

# MCM's eviction retry interval: the default number of 429 retries is the drain timeout / 20s.
EVICTION_RETRY_INTERVAL = dt.timedelta(seconds=20)
# How soon a Failed machine's reconcile comes again while its Node is still to be pointed at its evidence.
POINTER_RETRY = dt.timedelta(seconds=5)

# The pool's machinePreserveTimeout for a machine, where one is known (None: the configured default).
PoolTimeout = Callable[[Machine], dt.timedelta | None]


def no_pool_timeout(_: Machine) -> dt.timedelta | None:
    return None


@dataclass
class LiveNodes:
    """Nodes read from the target's API server past the cache, for the one decision a late cache must not make
    (`lifecycle.health_to_confirm`)."""

    target: client.ApiClient

    async def get(self, name: str) -> Node | None:
        """The Node as the API server has it now, kept as the cache keeps it; None once it is gone."""
        raw = await read_json(await client.CoreV1Api(self.target).read_node_without_preload_content(name))
        return None if raw is None else cached_node(raw)


@dataclass
class MachineReconciler:
    caches: CacheReader
    writer: Writer
    drainer: Drainer
    live_nodes: LiveNodes
    # The pods of failed machines' nodes, the only ones a drain or its condition reads; the drainer's too.
    node_pods: NodePodReader
    # The evidence of each Failed machine's failure, captured when its preservation is planned with a drain.
    evidence: EvidenceKeeper
    config: PreservationConfig
    metrics: Metrics
    # MCM preserves machines itself: hand our preservations over and only observe (core.native).
    native: bool = False
    # The extension is being disabled for the shoot: every preservation stops, none starts (core.lifecycle).
    released: bool = False
    pool_timeout: PoolTimeout = no_pool_timeout
    # Upper bound of one drain attempt, so a PDB-blocked drain does not hold a worker for the whole
    # drain timeout; the core paces the next attempt (PreservationConfig.drain_retry_interval).
    max_drain_attempt: dt.timedelta = dt.timedelta(minutes=2)
    # Drains at once (each holds its worker while it runs): kept below the worker count so expiries,
    # starts and stops are never all queued behind PDB-blocked drains. A further drain waits: its reconcile
    # asks to be requeued after drain_deferral.
    max_concurrent_drains: int = 2
    drain_deferral: dt.timedelta = dt.timedelta(seconds=5)
    # The process's reconcile slots: a drain gives its slot back while it waits for pods to leave.
    slots: ReconcileSlots = field(default_factory=ReconcileSlots)
    clock: Clock = system_clock
    _draining: set[str] = field(default_factory=set)  # node names

    async def reconcile(self, key: str) -> dt.timedelta | None:
        """Plan once and execute the plan's steps; if it has a drain, drain (writing the drain's `alongside` steps
        meanwhile), ask the core what the outcome writes and execute that once. Returns when to look again: the
        plan's time, or sooner when the drain must wait for a free slot or the Node's pointer to its evidence is
        owed."""
        machine = self.caches.machines.get(key)
        if machine is None:
            self.node_pods.release(key)
            self.evidence.forget(key)
            return None
        now = self.clock()
        node = not_deleted(self.caches.nodes.get(machine.node_name) if machine.node_name else None)
        if not (self.native or self.released) and health_to_confirm(machine=machine, node=node, config=self.config):
            node = not_deleted(await self.live_nodes.get(machine.node_name))
        failed = machine.phase == v.MachinePhase.FAILED
        if failed and node is not None and not (self.native or self.released):
            async with self.slots.lent():  # a first list waits for the shoot's API server
                await self.node_pods.hold(key, node.metadata.name)
        else:
            self.node_pods.release(key)
        if not failed or node is None:
            self.evidence.forget(key)
        if self.native:
            plan = plan_native(machine=machine, node=node, config=self.config)
            if node is not None and (since := natively_preserved_since(machine, node, now=now)) is not None:
                # MCM drains at once: captured as soon as seen, racing its evictions (best effort).
                self.evidence.capture(key, machine=machine, node=node, since=since, pods=None)
        else:
            plan = plan_machine(
                MachineContext(
                    machine=machine,
                    node=labelled_node(machine=machine, found=node),
                    config=self.config,
                    now=now,
                    unpreserved_priority_ceiling=self.caches.priority_ceiling(
                        machine, now=now, max_timeout=self.config.max_preserve_timeout
                    ),
                    pool_timeout=self.pool_timeout(machine),
                    pods_to_evict=self.drainer.look(node).blocking if failed and node is not None else (),
                    released=self.released,
                )
            )
        if plan.steps or plan.drain:
            logger.info("machine %s: %s", key, _describe(plan))
        if plan.drain is not None and plan.drain.record is not None and node is not None:
            # The pods as the drain's watch has them now, before its first eviction; the rest after the drain.
            pods = self.node_pods.by_index(POD_NODE_INDEX, node.metadata.name)
            self.evidence.capture(key, machine=machine, node=node, since=plan.drain.record.since, pods=pods)
        return await self._execute(key, plan, machine, node, now=now)

    async def _execute(
        self, key: str, plan: p.MachinePlan, machine: Machine, node: Node | None, *, now: dt.datetime
    ) -> dt.timedelta | None:
        """The plan's steps, then its drain (or, with none, a pointer to the evidence still owed); when to look
        again."""
        snap = Snapshot(machine=machine, node=node)
        await execute_machine_plan(writer=self.writer, snap=snap, steps=plan.steps, now=now)
        drain = plan.drain
        if drain is None:
            if node is not None and not plan.steps and self._pointer_owed(key, machine):
                await self._point_at_evidence(key, snap, node, wait=0.0)
            return self._look_again(key, plan.requeue_after, owed=self._pointer_owed(key, machine))
        assert node is not None, "the core drains only a Node it was given"
        if not self._drain_slot_free(node):
            await execute_machine_plan(writer=self.writer, snap=snap, steps=drain.alongside, now=now)
            logger.info("machine %s: drain deferred (slots busy); again in %s", key, self.drain_deferral)
            return self.drain_deferral
        await self._drain_and_write_outcome(key, snap, node, drain, now=now)
        return self._look_again(key, plan.requeue_after, owed=self.evidence.unpointed(key))

    def _pointer_owed(self, key: str, machine: Machine) -> bool:
        """The machine is preserved, Failed, and its Node still to be pointed at the evidence captured: the drain's
        reconcile could not (the capture took longer, the Node changed meanwhile, no answer)."""
        return (
            not (self.native or self.released)
            and machine.phase == v.MachinePhase.FAILED
            and machine.preservation is not None
            and self.evidence.unpointed(key)
        )

    def _look_again(self, key: str, requeue: dt.timedelta | None, *, owed: bool) -> dt.timedelta | None:
        """The plan's time to look again, or sooner while the Node's pointer to its evidence is owed (a change of
        the Node brings the machine back as well, but a capture that ends does not)."""
        if not owed:
            return requeue
        logger.debug("machine %s: its node is not pointed at its evidence yet; again in %s", key, POINTER_RETRY)
        return POINTER_RETRY if requeue is None else min(requeue, POINTER_RETRY)

    async def _drain_and_write_outcome(
        self, key: str, snap: Snapshot, node: Node, drain: p.DrainNode, *, now: dt.datetime
    ) -> None:
        """One drain attempt with its `alongside` steps written meanwhile, then what the core says its outcome
        writes. The Node is pointed at the evidence once the outcome is written: no other write to the Node is in
        flight then, and a write before the drain would add a round trip to every preservation's way to drained."""
        # Their writes and the evictions wait on different requests: the drain does not wait for them. The task
        # holds no reconcile slot of its own, and lends none (the slot is the reconcile's task's).
        alongside = asyncio.create_task(
            execute_machine_plan(writer=self.writer, snap=snap, steps=drain.alongside, now=now)
        )
        try:
            result = await self._drain(node, drain, max_evict_retries=snap.machine.spec.max_evict_retries)
        finally:
            async with self.slots.lent():
                await asyncio.wait([alongside])
        alongside.result()  # a failed write fails the plan: no outcome is written, the next plan starts over
        # The outcome's writes (its Events too) carry the time the attempt ended, which may be minutes
        # after the plan; they start from the resourceVersions the plan's writes left in `snap`.
        ended = self.clock()
        after = plan_after_drain(
            machine=snap.machine,
            node=node,
            drain=drain,
            drained=result.drained,
            blocking_pods=result.blocking,
            now=ended,
            blocked_by=result.blocked_by,
        )
        await execute_machine_plan(writer=self.writer, snap=snap, steps=after.steps, now=ended)
        self.evidence.drain_over(key)
        await self._point_at_evidence(key, snap, node, wait=EVIDENCE_WAIT)

    async def _point_at_evidence(self, key: str, snap: Snapshot, node: Node, *, wait: float) -> None:
        """The Node's pointer to its evidence, once written (waited for up to `wait` seconds: the capture's reads of
        the Node and its Events wait for the drain's outcome), at the snapshot's resourceVersion (which it advances,
        so the plan's later writes still apply)."""
        if wait > 0:
            async with self.slots.lent():
                await self.evidence.settled(key, seconds=wait)
        version = await self.evidence.annotate(key, node, version=snap.node_version)
        if version is not None:
            snap.node_version = version

    def _drain_slot_free(self, node: Node) -> bool:
        """One drain per node (two machines may name the same node) and at most max_concurrent_drains."""
        return node.metadata.name not in self._draining and len(self._draining) < self.max_concurrent_drains

    async def _drain(self, node: Node, step: p.DrainNode, *, max_evict_retries: int | None) -> DrainResult:
        """One eviction attempt capped at max_drain_attempt, or, once evictions were given up, only a look."""
        if not step.evict:
            result = self.drainer.look(node)  # evictions given up: only notice the node becoming empty
            if result.drained:
                self.metrics.drains.labels(outcome="succeeded").inc()
            return result
        timeout = min(step.timeout or self.config.drain_timeout, self.max_drain_attempt)
        retries = max_evict_retries
        if retries is None or retries < 0:
            retries = max(int((step.timeout or self.config.drain_timeout) / EVICTION_RETRY_INTERVAL), 1)
        name = node.metadata.name
        self._draining.add(name)
        try:
            async with self.slots.lent():
                result = await self.drainer.drain(
                    node=node, time_limit=timeout.total_seconds(), max_evict_retries=retries
                )
        finally:
            self._draining.discard(name)
        self.metrics.drains.labels(outcome="succeeded" if result.drained else "failed").inc()
        if not result.drained:
            logger.warning("node %s not drained; blocking: %s", name, ", ".join(result.blocking))
        return result


def _describe(plan: p.MachinePlan) -> str:
    """The plan's steps by kind, for the log: "PatchMachineAnnotations, ..., DrainNode (alongside: ...)"."""
    kinds = [type(step).__name__ for step in plan.steps]
    if plan.drain is not None:
        alongside = ", ".join(type(step).__name__ for step in plan.drain.alongside)
        kinds.append(f"DrainNode (alongside: {alongside})" if alongside else "DrainNode")
    return ", ".join(kinds)


# The pool's autoPreserveFailedMachineMax for a MachineSet where its spec does not carry it (None: the spec's).
PoolLimit = Callable[[MachineSet], int | None]


def no_pool_limit(_: MachineSet) -> int | None:
    return None


@dataclass
class MachineSetReconciler:
    caches: CacheReader
    writer: Writer
    config: PreservationConfig
    pool_limit: PoolLimit = no_pool_limit
    clock: Clock = system_clock

    async def reconcile(self, key: str) -> dt.timedelta | None:
        machine_set = self.caches.machine_sets.get(key)
        if machine_set is None:
            return None
        now = self.clock()
        namespace = machine_set.metadata.namespace
        machines = self.caches.machines.by_index(MACHINE_SET_INDEX, machine_set.metadata.name)
        nodes = {m.node_name: n for m in machines if m.node_name and (n := self.caches.nodes.get(m.node_name))}
        owner = owner_name("MachineDeployment")(machine_set)
        siblings = self.caches.machine_sets.by_index(DEPLOYMENT_INDEX, owner[0]) if owner else [machine_set]
        plan = plan_machine_set(
            machine_set=machine_set,
            machines=machines,
            nodes=nodes,
            being_replaced=is_being_replaced(machine_set, siblings),
            config=self.config,
            now=now,
            limit=self.pool_limit(machine_set),
        )
        for name, patch in plan.machine_annotations.items():
            logger.info("machineset %s: machine %s %s", key, name, patch)
        await execute_machine_set_plan(
            writer=self.writer, machine_set=machine_set, machines=machines, plan=plan, now=now
        )
        logger.debug("machineset %s/%s reconciled", namespace, machine_set.metadata.name)
        return None


@dataclass
class MachineDeploymentReconciler:
    caches: CacheReader
    writer: Writer
    clock: Clock = system_clock

    async def reconcile(self, key: str) -> dt.timedelta | None:
        deployment = self.caches.machine_deployments.get(key)
        if deployment is None:
            return None
        machine_sets = self.caches.machine_sets.by_index(DEPLOYMENT_INDEX, deployment.metadata.name)
        status = plan_machine_deployment(machine_deployment=deployment, machine_sets=machine_sets)
        if status is not None:
            await execute(writer=self.writer, writes=[(deployment, status)], now=self.clock())
        return None
