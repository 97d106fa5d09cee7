"""What the reconcilers read from the caches, independent of how the caches are filled: a read-only `Store`
per resource and the `CacheReader` over them (the informer-backed `caches.Caches` is one), the index names,
and the owner lookups that the indices and the event handlers share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from machine_preservation.controller.machinery.queue import RetryWithBackoff
from machine_preservation.core.gardener.cluster import ClusterView
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node, Pod

T_co = TypeVar("T_co", covariant=True)

MACHINE_NODE_INDEX = "node"
MACHINE_SET_INDEX = "machineset"
DEPLOYMENT_INDEX = "machinedeployment"
POD_NODE_INDEX = "node"


class Store(Protocol[T_co]):
    """One resource's cache, keyed `namespace/name` (or `name` when cluster-scoped)."""

    def get(self, key: str) -> T_co | None: ...

    def by_index(self, index: str, value: str) -> Sequence[T_co]: ...


class NodePodReader(Store[Pod], Protocol):
    """The pods of the nodes being held (`node_pods.NodePods`): `by_index(POD_NODE_INDEX, node)`."""

    async def hold(self, owner: str, node: str) -> None:
        """Watch the node's pods for `owner` and return once they are listed (else raise PodsNotListed)."""
        ...

    def release(self, owner: str) -> None:
        """`owner` no longer needs its node's pods."""
        ...

    def changes(self, node: str) -> int:
        """A count of the changes seen to the node's pods so far."""
        ...

    async def wait_for_change(self, node: str, *, since: int) -> None:
        """Until the node's pods changed after `changes(node)` was `since` (the caller bounds the wait)."""
        ...


class PodsNotListed(RetryWithBackoff):
    """A node's pods could not be listed in time (its cluster's API server is unreachable or slow)."""

    def __init__(self, node: str, cause: str | None) -> None:
        super().__init__(f"the pods on node {node} are not listed yet ({cause or 'waiting for the list'})")
        self.node = node


class CacheReader(Protocol):
    @property
    def machines(self) -> Store[Machine]: ...

    @property
    def machine_sets(self) -> Store[MachineSet]: ...

    @property
    def machine_deployments(self) -> Store[MachineDeployment]: ...

    @property
    def nodes(self) -> Store[Node]: ...

    def cluster(self, name: str) -> ClusterView | None:
        """Gardener's Cluster resource of that name, if there is one."""
        ...

    def priority_ceiling(self, machine: Machine, *, now: dt.datetime, max_timeout: dt.timedelta) -> int:
        """`core.priority.unpreserved_priority_ceiling` over the machine's MachineSet."""
        ...


def owner_name(metadata_owner_kind: str) -> Callable[[Machine | MachineSet], list[str]]:
    def index(obj: Machine | MachineSet) -> list[str]:
        owner = obj.metadata.controller_owner()
        return [owner.name] if owner is not None and owner.kind == metadata_owner_kind else []

    return index


def key_of(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name
