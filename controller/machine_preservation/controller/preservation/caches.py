"""The controller's caches: one informer per resource it reads, the indices it looks objects up by, and the
per-MachineSet priority summary derived from them. The reconcilers read them as a `reader.CacheReader`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kubernetes.aio import client

from machine_preservation.controller.preservation.reader import (
    DEPLOYMENT_INDEX,
    MACHINE_NODE_INDEX,
    MACHINE_SET_INDEX,
    owner_name,
)
from machine_preservation.controller.preservation.views import ShootViews
from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    ClusterView,
    read_cluster,
)
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node, cached_node
from machine_preservation.core.priority import (
    UnpreservedPriorities,
    unpreserved_priorities,
    unpreserved_priority_ceiling,
)
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.informer import Handler, Indexer, Informer, Source

T = TypeVar("T")


class Cache(Protocol[T]):
    """What the runtime reads a cache through: an `Informer`, or a shoot's `views.ScopedView` of a seed-wide one."""

    @property
    def name(self) -> str: ...

    @property
    def synced(self) -> bool: ...

    @property
    def failing(self) -> str | None: ...

    @property
    def generation(self) -> int: ...

    async def wait_synced(self) -> None: ...

    def get(self, key: str) -> T | None: ...

    def values(self) -> list[T]: ...

    def __len__(self) -> int: ...

    def by_index(self, index: str, value: str) -> list[T]: ...

    def add_indexer(self, index: str, indexer: Indexer[T]) -> None: ...

    def add_handler(self, handler: Handler[T]) -> None: ...


@dataclass
class Caches:
    machines: Cache[Machine]
    machine_sets: Cache[MachineSet]
    machine_deployments: Cache[MachineDeployment]
    nodes: Informer[Node]
    # Gardener's Cluster resource of the control namespace (None: not a Gardener seed, no such CRD).
    clusters: Cache[ClusterView] | None = None
    # The informers the runtime runs; the others are views of the seed's, which the seed runs for every shoot.
    owned: tuple[Informer[Any], ...] = ()
    # Detaches the views from the seed's informers once the runtime stops.
    close: Callable[[], None] = lambda: None
    # MachineSet name -> summary, valid for the machines cache's generation; see priority_ceiling.
    _priorities: dict[str, UnpreservedPriorities] = field(default_factory=dict)
    _priorities_generation: int = -1

    def __post_init__(self) -> None:
        self.machines.add_indexer(MACHINE_NODE_INDEX, lambda m: [m.node_name])
        self.machines.add_indexer(MACHINE_SET_INDEX, owner_name("MachineSet"))
        self.machine_sets.add_indexer(DEPLOYMENT_INDEX, owner_name("MachineDeployment"))

    @property
    def all(self) -> tuple[Cache[Any], ...]:
        informers: tuple[Cache[Any], ...] = (
            self.machines,
            self.machine_sets,
            self.machine_deployments,
            self.nodes,
        )
        return (*informers, self.clusters) if self.clusters is not None else informers

    def cluster(self, name: str) -> ClusterView | None:
        return self.clusters.get(name) if self.clusters is not None else None

    def synced(self) -> bool:
        return all(informer.synced for informer in self.all)

    def machine_set_of(self, machine: Machine) -> list[Machine]:
        owner = owner_name("MachineSet")(machine)
        return self.machines.by_index(MACHINE_SET_INDEX, owner[0]) if owner else [machine]

    def priority_ceiling(self, machine: Machine, *, now: dt.datetime, max_timeout: dt.timedelta) -> int:
        """`unpreserved_priority_ceiling` over the machine's MachineSet, summarised once per MachineSet and
        reused until the machines change or a preservation in it runs out: a resync reconciles every machine
        of a set, and a scan of the set for each of them would make it quadratic."""
        owner = owner_name("MachineSet")(machine)
        if not owner:
            return unpreserved_priority_ceiling(
                machine=machine, machine_set_machines=[machine], now=now, max_timeout=max_timeout
            )
        if self._priorities_generation != self.machines.generation:
            self._priorities.clear()  # any machine change may move any set's ceiling (and sets come and go)
            self._priorities_generation = self.machines.generation
        summary = self._priorities.get(owner[0])
        if summary is None or not summary.holds_at(now):
            summary = self._priorities[owner[0]] = unpreserved_priorities(
                machine_set_machines=self.machines.by_index(MACHINE_SET_INDEX, owner[0]),
                now=now,
                max_timeout=max_timeout,
            )
        return summary.ceiling_for(machine.metadata.name)


def new_caches(
    *,
    control: client.ApiClient,
    target: client.ApiClient,
    namespace: str,
    resync_period: float,
    with_cluster: bool = False,
) -> Caches:
    """The informers the controller reconciles from: MCM's objects in `namespace` of the control cluster (and
    Gardener's `Cluster` resource named after it, `with_cluster`) and the Nodes of the target cluster. Pods are
    watched only on the nodes of failed machines (`node_pods`)."""
    custom_objects = client.CustomObjectsApi(control)
    group, version = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION

    def control_informer(plural: str, parse: Callable[[Mapping[str, Any]], T]) -> Informer[T]:
        source = Source(custom_objects.list_namespaced_custom_object, (group, version, namespace, plural))
        return Informer(name=plural, source=source, parse=parse, resync_period=resync_period)

    machines = control_informer("machines", Machine.model_validate)
    machine_sets = control_informer("machinesets", MachineSet.model_validate)
    machine_deployments = control_informer("machinedeployments", MachineDeployment.model_validate)
    nodes = _nodes(target, resync_period=resync_period)
    clusters = (
        Informer(
            name="clusters",
            source=Source(
                custom_objects.list_cluster_custom_object,
                (CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL),
                {"field_selector": f"metadata.name={namespace}"},
            ),
            parse=read_cluster,
            resync_period=resync_period,
        )
        if with_cluster
        else None
    )
    return Caches(
        machines=machines,
        machine_sets=machine_sets,
        machine_deployments=machine_deployments,
        nodes=nodes,
        clusters=clusters,
        owned=(machines, machine_sets, machine_deployments, nodes, *([clusters] if clusters is not None else [])),
    )


def shoot_caches(
    *, views: ShootViews, target: client.ApiClient, resync_period: float, node_budget: int | None = None
) -> Caches:
    """A shoot's caches in the seed: its views of the seed-wide informers, and its own Nodes informer, which stops
    following the shoot while its Nodes come to more than `node_budget` bytes of JSON (one shoot's Nodes must not
    take the memory every shoot of the seed is served from)."""
    nodes = _nodes(target, resync_period=resync_period, byte_budget=node_budget)
    return Caches(
        machines=views.machines,
        machine_sets=views.machine_sets,
        machine_deployments=views.machine_deployments,
        nodes=nodes,
        clusters=views.clusters,
        owned=(nodes,),
        close=views.close,
    )


# Node list pages: about 2 MiB of JSON each (one page is read and parsed whole), at most 50 Nodes.
NODE_PAGE_SIZE = 50
NODE_PAGE_BYTES = 2 * 2**20
# What a Node counts against its shoot's budget at least (a Gardener Node is 8-32 KiB of JSON): 8,192 Nodes of
# ~2 KiB cached each in 128 MiB, however small a shoot owner makes them.
NODE_MIN_BYTES = 16 * 2**10
# A shoot whose Nodes stay over the budget is listed again 30 s after, then after twice as long each time, at most
# every 5 minutes: each attempt reads up to the budget (128 MiB, ~1 s of CPU) in the process every shoot shares.
NODE_BUDGET_BACKOFF = Backoff(base=30.0, cap=300.0)


def _nodes(target: client.ApiClient, *, resync_period: float, byte_budget: int | None = None) -> Informer[Node]:
    source = Source(client.CoreV1Api(target).list_node)
    return Informer(
        name="nodes",
        source=source,
        parse=cached_node,
        resync_period=resync_period,
        page_size=NODE_PAGE_SIZE,
        page_bytes=NODE_PAGE_BYTES,
        byte_budget=byte_budget,
        min_object_bytes=NODE_MIN_BYTES,
        budget_backoff=NODE_BUDGET_BACKOFF,
    )
