"""MCM's objects of every shoot namespace, watched once for the whole seed, and each shoot's view of them.

Per shoot, the lifecycle reads Machines, MachineSets, MachineDeployments and the `Cluster` named after its
namespace. Watching them per shoot namespace costs 4 watches per shoot (800 for a seed of 200 shoots) on the
seed's API server; `SeedInformers` watches each resource once, seed-wide, and `ScopedView` gives a shoot's
runtime the part of a seed-wide cache that belongs to it, through the same reading interface as an `Informer`:
- keys are the informer's (`namespace/name`, a Cluster's name), so a view's `get` answers only for its scope;
- an index is the informer's, its values qualified with the scope (`<namespace>/<node>`): two shoots may well
  have a node of the same name;
- handlers added to a view are called only for its scope's objects, and first for every object already cached
  (as a shared informer replays its store to a late handler), so a runtime started after the seed-wide lists
  still queues every object once;
- `generation` counts the changes in the scope, so what a shoot derives from its cache (the priority summary)
  is not thrown away by another shoot's changes.
The seed runs the informers; a runtime only reads its views and removes its handlers when it stops (`close`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    ClusterView,
    read_cluster,
)
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.kube.informer import Handler, Indexer, Informer, Source

T = TypeVar("T")

SCOPE_INDEX = "scope"


@dataclass
class _Routes(Generic[T]):
    """One seed-wide informer's handlers by scope, and each scope's change count."""

    scope_of: Callable[[T], str]
    handlers: dict[str, list[Handler[T]]] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)

    def __call__(self, old: T | None, new: T | None) -> None:
        current = new if new is not None else old
        assert current is not None
        scope = self.scope_of(current)
        if old is not new:  # a resync hands the same object: no change
            self.generations[scope] = self.generations.get(scope, 0) + 1
        for handler in self.handlers.get(scope, ()):
            handler(old, new)


@dataclass
class ScopedView(Generic[T]):
    """The objects of one scope (a shoot namespace) of a seed-wide informer; read like an `Informer`."""

    informer: Informer[T]
    scope: str
    _routes: _Routes[T]
    _handlers: list[Handler[T]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.informer.name} of {self.scope}"

    @property
    def synced(self) -> bool:
        return self.informer.synced

    @property
    def failing(self) -> str | None:
        return self.informer.failing

    @property
    def generation(self) -> int:
        return self._routes.generations.get(self.scope, 0)

    async def wait_synced(self) -> None:
        await self.informer.wait_synced()

    def get(self, key: str) -> T | None:
        found = self.informer.get(key)
        return found if found is not None and self._routes.scope_of(found) == self.scope else None

    def values(self) -> list[T]:
        return self.informer.by_index(SCOPE_INDEX, self.scope)

    def __len__(self) -> int:
        return len(self.values())

    def by_index(self, index: str, value: str) -> list[T]:
        return self.informer.by_index(index, f"{self.scope}/{value}")

    def add_indexer(self, index: str, indexer: Indexer[T]) -> None:
        """Index the seed-wide cache by `indexer`'s values within each object's scope (once for all views)."""
        if self.informer.has_indexer(index):
            return
        scope_of = self._routes.scope_of
        self.informer.add_indexer(index, lambda obj: [f"{scope_of(obj)}/{value}" for value in indexer(obj)])

    def add_handler(self, handler: Handler[T]) -> None:
        """Called for the scope's changes from now on, and at once for each object cached now (as added)."""
        self._handlers.append(handler)
        self._routes.handlers.setdefault(self.scope, []).append(handler)
        for obj in self.values():
            handler(None, obj)

    def close(self) -> None:
        """Stop calling this view's handlers (its runtime stopped)."""
        handlers = self._routes.handlers.get(self.scope, [])
        for handler in self._handlers:
            if handler in handlers:
                handlers.remove(handler)
        if not handlers:
            self._routes.handlers.pop(self.scope, None)
        self._handlers.clear()


def _scoped(informer: Informer[T], scope_of: Callable[[T], str]) -> _Routes[T]:
    routes = _Routes(scope_of=scope_of)
    informer.add_indexer(SCOPE_INDEX, lambda obj: [scope_of(obj)])
    informer.add_handler(routes)
    return routes


def _namespace_of(obj: Machine | MachineSet | MachineDeployment) -> str:
    return obj.metadata.namespace


def _name_of(cluster: ClusterView) -> str:
    return cluster.name  # a Cluster is named after its shoot namespace


@dataclass
class ShootViews:
    """One shoot's views of the seed-wide caches."""

    machines: ScopedView[Machine]
    machine_sets: ScopedView[MachineSet]
    machine_deployments: ScopedView[MachineDeployment]
    clusters: ScopedView[ClusterView]

    def close(self) -> None:
        for view in (self.machines, self.machine_sets, self.machine_deployments, self.clusters):
            view.close()


@dataclass
class SeedInformers:
    """Machines, MachineSets and MachineDeployments of every namespace and every `Cluster`, watched once."""

    machines: Informer[Machine]
    machine_sets: Informer[MachineSet]
    machine_deployments: Informer[MachineDeployment]
    clusters: Informer[ClusterView]
    _routes: dict[str, _Routes[Any]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for informer, scope_of in (
            (self.machines, _namespace_of),
            (self.machine_sets, _namespace_of),
            (self.machine_deployments, _namespace_of),
            (self.clusters, _name_of),
        ):
            self._routes[informer.name] = _scoped(informer, scope_of)

    @property
    def all(self) -> tuple[Informer[Any], ...]:
        return (self.machines, self.machine_sets, self.machine_deployments, self.clusters)

    def views(self, namespace: str) -> ShootViews:
        def view(informer: Informer[T]) -> ScopedView[T]:
            return ScopedView(informer=informer, scope=namespace, _routes=self._routes[informer.name])

        return ShootViews(
            machines=view(self.machines),
            machine_sets=view(self.machine_sets),
            machine_deployments=view(self.machine_deployments),
            clusters=view(self.clusters),
        )


def new_seed_informers(seed: client.ApiClient, *, resync_period: float) -> SeedInformers:
    custom_objects = client.CustomObjectsApi(seed)

    def seed_wide(name: str, args: tuple[str, ...], parse: Callable[[Mapping[str, Any]], T]) -> Informer[T]:
        source = Source(custom_objects.list_cluster_custom_object, args)
        return Informer(name=name, source=source, parse=parse, resync_period=resync_period)

    def machine_api(plural: str) -> tuple[str, ...]:
        return (v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, plural)

    return SeedInformers(
        machines=seed_wide("machines", machine_api("machines"), Machine.model_validate),
        machine_sets=seed_wide("machinesets", machine_api("machinesets"), MachineSet.model_validate),
        machine_deployments=seed_wide(
            "machinedeployments", machine_api("machinedeployments"), MachineDeployment.model_validate
        ),
        clusters=seed_wide("clusters", (CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL), read_cluster),
    )
