"""Drain of a preserved Failed node through the Eviction API (policy/v1).

- Which pods: every pod bound to the node except mirror (static) pods and DaemonSet-owned pods,
  which stay (as `kubectl drain --ignore-daemonsets`, MCM and Cluster API do).
- PDBs are honoured: a 429 answer is retried with exponential backoff, at most `max_evict_retries`
  times per pod and never past the drain's deadline. `spec.unschedulable` is never touched (the
  preserved taint, written before the drain, keeps new pods away).
- Waiting: an evicted pod is gone when it has left the API. A pod on a node whose kubelet is not
  Ready can never finish graceful deletion (nobody confirms it), so there a pod counts as gone once
  its grace period has run out (`deletionTimestamp` in the past) — Cluster API's rule for unreachable
  nodes. On a Ready node the drain waits for the kubelet to delete the pod.

The result names the pods still blocking, for the Preserved condition's message, and the PodDisruptionBudgets
that refused their evictions, for the Node's fields: an attempt that ends with refused pods lists the budgets of
their namespaces (one list per namespace and attempt) and matches the budgets' selectors with the pods' labels
(core.disruption_budgets); the 429's message is never parsed. Once the drain has been
failing for the drain timeout the core stops asking for evictions and `look` only checks whether the node has
become empty: pods are never forced out past their PDB (upstream MCM force-deletes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.aio import client

from machine_preservation.controller.preservation.reader import POD_NODE_INDEX, NodePodReader
from machine_preservation.core import vocabulary as v
from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.core.disruption_budgets import PodDisruptionBudget, refusing_budgets
from machine_preservation.core.models import Node, Pod
from machine_preservation.kube.api_errors import (
    Failed,
    NoAnswer,
    NotFound,
    TooManyRequests,
    api_call,
    ensure_success,
    read_json,
)
from machine_preservation.kube.backoff import Backoff

logger = logging.getLogger(__name__)

# The PodDisruptionBudgets of one namespace read to name a refusal, at most (a page of the list, never continued):
# a refusing budget past them goes unnamed.
BUDGETS_LISTED_LIMIT = 500
# How long a list of budgets may take: naming them must not hold up the drain's outcome.
BUDGETS_LIST_TIMEOUT = 10.0


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    blocking: tuple[str, ...] = ()  # "namespace/name" of the pods still on the node
    # "namespace/name" of the PodDisruptionBudgets that refused evictions (at most DRAIN_BLOCKED_BY_LIMIT).
    blocked_by: tuple[str, ...] = ()


def stays_on_node(pod: Pod) -> bool:
    """Mirror pods and DaemonSet pods are not evicted."""
    return pod.mirror or pod.controller_kind == "DaemonSet"


def node_ready(node: Node) -> bool:
    ready = node.condition("Ready")
    return ready is not None and ready.status == "True"


def pod_gone(pod: Pod, *, kubelet_alive: bool, now: dt.datetime) -> bool:
    """A terminating pod whose grace period ran out on a node without a live kubelet counts as gone."""
    deleted_at = pod.deletion_timestamp
    return deleted_at is not None and not kubelet_alive and deleted_at <= now


def pod_name(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"


@dataclass
class Drainer:
    target: client.ApiClient
    pods: NodePodReader  # the node's pods are held (watched) by the reconcile that drains
    eviction_backoff: Backoff = field(default_factory=lambda: Backoff(base=1.0, cap=20.0))
    poll_interval: float = 0.5
    evictions_at_once: int = 10
    clock: Clock = system_clock

    def remaining_pods(self, node: Node) -> list[Pod]:
        """The node's pods a drain still waits for (from the cache)."""
        now, kubelet_alive = self.clock(), node_ready(node)
        return [
            pod
            for pod in self.pods.by_index(POD_NODE_INDEX, node.metadata.name)
            if not stays_on_node(pod) and not pod_gone(pod, kubelet_alive=kubelet_alive, now=now)
        ]

    def look(self, node: Node) -> DrainResult:
        """Whether the node is drained, evicting nothing (once evictions were given up)."""
        remaining = self.remaining_pods(node)
        return DrainResult(drained=not remaining, blocking=tuple(sorted(pod_name(pod) for pod in remaining)))

    async def drain(self, *, node: Node, time_limit: float, max_evict_retries: int) -> DrainResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        evictions = _Evictions(
            api=client.CoreV1Api(self.target),
            node=node.metadata.name,
            backoff=self.eviction_backoff,
            max_retries=max_evict_retries,
            at_once=asyncio.Semaphore(self.evictions_at_once),
            clock=loop.time,
        )
        while True:
            seen = self.pods.changes(node.metadata.name)
            remaining = self.remaining_pods(node)
            if not remaining:
                return DrainResult(drained=True)
            # A few at once: a node's 30 pods one after another took ~0.2 s of a preservation's time.
            await asyncio.gather(*(evictions.evict(pod) for pod in evictions.due(remaining)))
            if evictions.exhausted(remaining) or loop.time() >= deadline:
                return DrainResult(
                    drained=False,
                    blocking=tuple(sorted(pod_name(pod) for pod in remaining)),
                    blocked_by=await self._refusing_budgets(evictions.refused(remaining)),
                )
            # Woken by the next change to the node's pods (an evicted pod gone), else after the poll interval
            # (a grace period running out, a refused eviction's backoff).
            wait = min(self.poll_interval, max(deadline - loop.time(), 0.0))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.pods.wait_for_change(node.metadata.name, since=seen)

    async def _refusing_budgets(self, refused: list[Pod]) -> tuple[str, ...]:
        """The budgets that cover the refused pods, from one list per namespace, of at most DRAIN_BLOCKED_BY_LIMIT
        namespaces (each with a refused pod has a budget to name); none of a namespace whose list failed (naming
        them is for people: the drain's outcome does not wait for it)."""
        policy = client.PolicyV1Api(self.target)
        budgets: list[PodDisruptionBudget] = []
        for namespace in sorted({pod.namespace for pod in refused})[: v.DRAIN_BLOCKED_BY_LIMIT]:
            try:
                with api_call():
                    listed = await read_json(
                        await policy.list_namespaced_pod_disruption_budget_without_preload_content(
                            namespace, limit=BUDGETS_LISTED_LIMIT, _request_timeout=BUDGETS_LIST_TIMEOUT
                        ),
                        absent=frozenset(),
                    )
                items = listed.get("items") if isinstance(listed, dict) else None
                budgets += [PodDisruptionBudget.model_validate(i) for i in items or [] if isinstance(i, dict)]
            except (Failed, NoAnswer, ValueError) as error:  # ValueError: an answer that is no list of budgets
                logger.warning("PodDisruptionBudgets of %s not listed: %s", namespace, error)
        return refusing_budgets(refused, budgets, limit=v.DRAIN_BLOCKED_BY_LIMIT)


@dataclass
class _Evictions:
    """One drain attempt's evictions: the pods whose eviction was answered, how often each was refused, and when
    a refused one may be asked again."""

    api: client.CoreV1Api
    node: str
    backoff: Backoff
    max_retries: int
    at_once: asyncio.Semaphore
    clock: Callable[[], float]
    refusals: dict[str, int] = field(default_factory=dict)
    waiting_until: dict[str, float] = field(default_factory=dict)
    # Pods whose eviction was accepted (or found them gone): the cache may show them a moment longer, until
    # their deletion is seen; evicting them again would only cost the API server another request.
    answered: set[tuple[str, str]] = field(default_factory=set)
    budget_refused: set[str] = field(default_factory=set)  # pods a 429 answered

    def due(self, remaining: list[Pod]) -> list[Pod]:
        now = self.clock()
        return [
            pod
            for pod in remaining
            if pod.deletion_timestamp is None
            and (pod_name(pod), pod.uid) not in self.answered
            and now >= self.waiting_until.get(pod_name(pod), 0.0)
            and self.refusals.get(pod_name(pod), 0) <= self.max_retries
        ]

    def refused(self, remaining: list[Pod]) -> list[Pod]:
        """The pods left whose eviction a PodDisruptionBudget refused (429) in this attempt."""
        return [pod for pod in remaining if pod_name(pod) in self.budget_refused]

    def exhausted(self, remaining: list[Pod]) -> bool:
        """Every pod left was refused more often than allowed."""
        return all(
            self.refusals.get(pod_name(pod), 0) > self.max_retries and pod.deletion_timestamp is None
            for pod in remaining
        )

    async def evict(self, pod: Pod) -> None:
        key = pod_name(pod)
        async with self.at_once:
            try:
                metadata = client.V1ObjectMeta(name=pod.name, namespace=pod.namespace)
                with api_call():  # read raw: only the answer's status matters
                    await ensure_success(
                        await self.api.create_namespaced_pod_eviction_without_preload_content(
                            pod.name, pod.namespace, client.V1Eviction(metadata=metadata)
                        )
                    )
                self.answered.add((key, pod.uid))
                logger.info("evicted %s from node %s", key, self.node)
            except NotFound:
                self.answered.add((key, pod.uid))
            except TooManyRequests:
                self.budget_refused.add(key)
                self.refusals[key] = self.refusals.get(key, 0) + 1
                self.waiting_until[key] = self.clock() + self.backoff.delay(self.refusals[key])
                logger.info("eviction of %s refused by a PodDisruptionBudget (%d)", key, self.refusals[key])
            except Failed as error:
                # e.g. 500 "more than one PodDisruptionBudget": retrying does not help.
                logger.warning("eviction of %s failed: %s %s", key, error.status, error.reason)
                self.refusals[key] = self.max_retries + 1
