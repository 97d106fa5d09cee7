"""The pods of the nodes whose machines have failed, each node watched on its own (`fieldSelector:
spec.nodeName=<node>`), and no other pods.

Only a failed machine's node may be drained, and its pods are all a drain and its condition message read. A cache
of every pod of a shoot would cost ~30 pods per node (≈ 120,000 pods for 200 shoots of 20 nodes) to serve the
few nodes that fail; a watch per failed node costs what those nodes hold. The Machine reconciler `hold`s the
node of a failed machine (the watch starts, the reconcile waits until it listed) and `release`s it once the
machine no longer needs it (not failed, gone, or another node); a node held by nobody is no longer watched.

Reads go through the `reader.NodePodReader` protocol, the shape the drain reads pods in
(`by_index(POD_NODE_INDEX, node)`).

A shoot owner can bind any number of pods of any size to a node (`spec.nodeName` needs no kubelet) and let the
node fail. Each node's watch therefore reads its list in pages of about POD_PAGE_BYTES and stops following the node
while its pods come to more than `byte_budget` bytes of JSON as read (the reconcile's `hold` then fails with
PodsNotListed and is retried with backoff): one node's pods never take the memory every shoot is served from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubernetes.aio import client

from machine_preservation.controller.preservation.reader import POD_NODE_INDEX, PodsNotListed
from machine_preservation.core.models import Pod
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.informer import Handler, Informer, Source

logger = logging.getLogger(__name__)

# A list page of a node's pods is read and parsed whole: about this many bytes (a pod is 2-20 KiB of JSON; a
# hostile one up to etcd's 1.5 MiB). The first page asks for POD_FIRST_PAGE pods at once: a node's usual pods come
# in one round trip (the reconcile waits for them), and a page of more than twice POD_PAGE_BYTES is dropped
# unread past that and asked for again one pod at a time.
POD_PAGE_BYTES = 4 * 2**20
POD_FIRST_PAGE = 500
# What one node's pods may come to, as read: ~1,000 pods of 16 KiB (a kubelet runs at most a few hundred), each
# counted as at least POD_MIN_BYTES, so at most 16,384 pods (825 bytes each cached) however small they are made.
POD_BYTES_PER_NODE = 16 * 2**20
POD_MIN_BYTES = 2**10
# A node whose pods stay over the budget is listed again after 30 s, then twice as long each time, at most every
# 5 minutes: each attempt reads up to the budget.
POD_BUDGET_BACKOFF = Backoff(base=30.0, cap=300.0)


@dataclass
class _Watch:
    informer: Informer[Pod]
    task: asyncio.Task[None]
    owners: set[str] = field(default_factory=set)
    changes: int = 0  # pod changes seen (a drain waits for the next one instead of polling)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def saw(self, _old: Pod | None, _new: Pod | None) -> None:
        self.changes += 1
        self.changed.set()


@dataclass
class NodePods:
    target: client.ApiClient
    resync_period: float = 600.0
    # How long a reconcile waits for a new watch's first list before it is retried (PodsNotListed).
    list_limit: float = 10.0
    byte_budget: int = POD_BYTES_PER_NODE
    _handlers: list[Handler[Pod]] = field(default_factory=list)
    _watches: dict[str, _Watch] = field(default_factory=dict)  # node name -> its watch
    _held: dict[str, str] = field(default_factory=dict)  # owner (a machine key) -> the node it holds

    def add_handler(self, handler: Handler[Pod]) -> None:
        """Called for every pod change of every watched node (and of nodes watched later)."""
        self._handlers.append(handler)
        for watch in self._watches.values():
            watch.informer.add_handler(handler)

    @property
    def nodes(self) -> list[str]:
        return sorted(self._watches)

    def __len__(self) -> int:
        """The pods cached, over all watched nodes."""
        return sum(len(watch.informer) for watch in self._watches.values())

    async def hold(self, owner: str, node: str) -> None:
        """Watch the node's pods for `owner` (until it releases them or holds another node); return once they are
        listed. Raises PodsNotListed if the first list does not come within `list_limit`."""
        if self._held.get(owner) != node:
            self.release(owner)
            self._held[owner] = node
            watch = self._watches.get(node) or self._start(node)
            watch.owners.add(owner)
        informer = self._watches[node].informer
        if informer.synced:
            return
        try:
            async with asyncio.timeout(self.list_limit):
                await informer.wait_synced()
        except TimeoutError:
            raise PodsNotListed(node, informer.failing) from None

    def release(self, owner: str) -> None:
        """`owner` no longer needs its node's pods; the watch ends when no one holds the node."""
        node = self._held.pop(owner, None)
        if node is None or (watch := self._watches.get(node)) is None:
            return
        watch.owners.discard(owner)
        if not watch.owners:
            del self._watches[node]
            watch.task.cancel()
            logger.debug("pods on node %s: no longer watched", node)

    def changes(self, node: str) -> int:
        watch = self._watches.get(node)
        return watch.changes if watch is not None else 0

    async def wait_for_change(self, node: str, *, since: int) -> None:
        watch = self._watches.get(node)
        if watch is None:  # not watched: nothing will change; the caller's bound ends the wait
            await asyncio.Event().wait()
            return
        while watch.changes == since:
            watch.changed.clear()
            await watch.changed.wait()

    def get(self, key: str) -> Pod | None:
        for watch in self._watches.values():
            if (pod := watch.informer.get(key)) is not None:
                return pod
        return None

    def by_index(self, index: str, value: str) -> Sequence[Pod]:
        """The pods of node `value` (index POD_NODE_INDEX); none when the node is not watched."""
        if index != POD_NODE_INDEX:
            raise KeyError(index)
        watch = self._watches.get(value)
        return watch.informer.values() if watch is not None else []

    async def stop(self) -> None:
        watches, self._watches = list(self._watches.values()), {}
        self._held.clear()
        for watch in watches:
            watch.task.cancel()
        for watch in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await watch.task

    def _start(self, node: str) -> _Watch:
        informer: Informer[Pod] = Informer(
            name=f"pods on node {node}",
            source=Source(
                client.CoreV1Api(self.target).list_pod_for_all_namespaces,
                kwargs={"field_selector": f"spec.nodeName={node}"},
            ),
            parse=Pod.model_validate,
            resync_period=self.resync_period,
            page_size=POD_FIRST_PAGE,
            page_bytes=POD_PAGE_BYTES,
            first_page_size=POD_FIRST_PAGE,
            byte_budget=self.byte_budget,
            min_object_bytes=POD_MIN_BYTES,
            budget_backoff=POD_BUDGET_BACKOFF,
        )
        for handler in self._handlers:
            informer.add_handler(handler)
        watch = self._watches[node] = _Watch(
            informer=informer, task=asyncio.create_task(informer.run(), name=f"informer-pods-{node}")
        )
        informer.add_handler(watch.saw)
        logger.debug("pods on node %s: watched", node)
        return watch
