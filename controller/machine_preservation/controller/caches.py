"""The controller's caches: one informer per resource it reads, the indices it looks objects up by, and the
per-MachineSet priority summary derived from them. The reconcilers read them as a `reader.CacheReader`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes.aio import client

from machine_preservation.controller.informer import Informer, Source
from machine_preservation.controller.reader import (
    DEPLOYMENT_INDEX,
    MACHINE_NODE_INDEX,
    MACHINE_SET_INDEX,
    POD_NODE_INDEX,
    owner_name,
)
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node, Pod
from machine_preservation.core.pool_settings import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    ClusterView,
    read_cluster,
)
from machine_preservation.core.priority import (
    UnpreservedPriorities,
    unpreserved_priorities,
    unpreserved_priority_ceiling,
)

T = TypeVar("T")


@dataclass
class Caches:
    machines: Informer[Machine]
    machine_sets: Informer[MachineSet]
    machine_deployments: Informer[MachineDeployment]
    nodes: Informer[Node]
    pods: Informer[Pod]
    # Gardener's Cluster resource of the control namespace (None: not a Gardener seed, no such CRD).
    clusters: Informer[ClusterView] | None = None
    # MachineSet name -> summary, valid for the machines cache's generation; see priority_ceiling.
    _priorities: dict[str, UnpreservedPriorities] = field(default_factory=dict)
    _priorities_generation: int = -1

    def __post_init__(self) -> None:
        self.machines.add_indexer(MACHINE_NODE_INDEX, lambda m: [m.node_name])
        self.machines.add_indexer(MACHINE_SET_INDEX, owner_name("MachineSet"))
        self.machine_sets.add_indexer(DEPLOYMENT_INDEX, owner_name("MachineDeployment"))
        self.pods.add_indexer(POD_NODE_INDEX, lambda pod: [pod.node_name])

    @property
    def all(self) -> tuple[Informer[Any], ...]:
        informers: tuple[Informer[Any], ...] = (
            self.machines,
            self.machine_sets,
            self.machine_deployments,
            self.nodes,
            self.pods,
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
    Gardener's `Cluster` resource named after it, `with_cluster`), Nodes and Pods of the target cluster."""
    custom_objects, core = client.CustomObjectsApi(control), client.CoreV1Api(target)
    group, version = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION

    def control_informer(plural: str, parse: Callable[[Mapping[str, Any]], T]) -> Informer[T]:
        source = Source(custom_objects.list_namespaced_custom_object, (group, version, namespace, plural))
        return Informer(name=plural, source=source, parse=parse, resync_period=resync_period)

    def target_informer(name: str, *, source: Source, parse: Callable[[Mapping[str, Any]], T]) -> Informer[T]:
        return Informer(name=name, source=source, parse=parse, resync_period=resync_period)

    return Caches(
        machines=control_informer("machines", Machine.model_validate),
        machine_sets=control_informer("machinesets", MachineSet.model_validate),
        machine_deployments=control_informer("machinedeployments", MachineDeployment.model_validate),
        nodes=target_informer("nodes", source=Source(core.list_node), parse=Node.model_validate),
        pods=target_informer("pods", source=Source(core.list_pod_for_all_namespaces), parse=Pod.model_validate),
        clusters=Informer(
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
        else None,
    )
