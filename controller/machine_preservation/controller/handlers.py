"""The event handlers: every cache change, mapped to the keys of the objects it can affect, queued.

A periodic resync (and a re-list that finds an object unchanged) hands it to the handlers without a change
(`is_resync`); its keys go to the queues' background lane, so real changes and due timers are served first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from machine_preservation.controller.caches import Caches
from machine_preservation.controller.queue import WorkQueue
from machine_preservation.controller.reader import DEPLOYMENT_INDEX, MACHINE_NODE_INDEX, key_of, owner_name
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node, ObjectMeta, Pod
from machine_preservation.core.pool_settings import ClusterView


@dataclass
class Queues:
    machines: WorkQueue[str]
    machine_sets: WorkQueue[str]
    machine_deployments: WorkQueue[str]

    @property
    def all(self) -> tuple[WorkQueue[str], WorkQueue[str], WorkQueue[str]]:
        return (self.machines, self.machine_sets, self.machine_deployments)


def _machine_key(machine: Machine) -> str:
    return key_of(machine.metadata.namespace, machine.metadata.name)


def _priority_relevant(machine: Machine) -> tuple[str | None, str | None, bool]:
    annotations = machine.metadata.annotations
    return (
        annotations.get(v.MACHINE_PRIORITY_ANNOTATION),
        annotations.get(v.LAST_MACHINE_PRIORITY_ANNOTATION),
        machine.preservation is not None,
    )


class _Versioned(Protocol):
    @property
    def metadata(self) -> ObjectMeta: ...


def is_resync(old: _Versioned | None, new: _Versioned | None) -> bool:
    """Whether a cache notification carries no change: the resync's `(obj, obj)`, or a re-list (after a watch
    expired) returning an object at the resourceVersion the cache already had."""
    if old is None or new is None:
        return False
    version = old.metadata.resource_version
    return old is new or (version != "" and version == new.metadata.resource_version)


def wire_handlers(*, caches: Caches, queues: Queues) -> None:
    """Map every cache change to the keys it can affect.

    A periodic resync (and a re-list that finds an object unchanged) hands it to the handlers without a change
    (`is_resync`); its keys go to the queues' background lane, so real changes and due timers are served first.
    """

    def machine_set_keys_of(machine: Machine) -> list[str]:
        return [key_of(machine.metadata.namespace, name) for name in owner_name("MachineSet")(machine)]

    def on_machine(old: Machine | None, new: Machine | None) -> None:
        current = new or old
        assert current is not None
        resync = is_resync(old, new)
        queues.machines.add(_machine_key(current), background=resync)
        for key in machine_set_keys_of(current):
            queues.machine_sets.add(key, background=resync)
        # A priority or preservation change moves the ceiling of the preserved siblings' priorities.
        if old is None or new is None or _priority_relevant(old) != _priority_relevant(new):
            for sibling in caches.machine_set_of(current):
                if sibling.preservation is not None and sibling.metadata.name != current.metadata.name:
                    queues.machines.add(_machine_key(sibling))

    def on_node(old: Node | None, new: Node | None) -> None:
        current = new or old
        assert current is not None
        resync = is_resync(old, new)
        for machine in caches.machines.by_index(MACHINE_NODE_INDEX, current.metadata.name):
            queues.machines.add(_machine_key(machine), background=resync)
            for key in machine_set_keys_of(machine):
                queues.machine_sets.add(key, background=resync)

    def on_pod(old: Pod | None, new: Pod | None) -> None:
        current = new or old
        assert current is not None
        node = caches.nodes.get(current.node_name) if current.node_name else None
        if node is None or not node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
            return  # pods matter only on a node being drained
        for machine in caches.machines.by_index(MACHINE_NODE_INDEX, node.metadata.name):
            queues.machines.add(_machine_key(machine), background=old is new)

    def on_machine_set(old: MachineSet | None, new: MachineSet | None) -> None:
        current = new or old
        assert current is not None
        namespace, resync = current.metadata.namespace, is_resync(old, new)
        queues.machine_sets.add(key_of(namespace, current.metadata.name), background=resync)
        for deployment in owner_name("MachineDeployment")(current):
            queues.machine_deployments.add(key_of(namespace, deployment), background=resync)
            if old is None or new is None:  # a rollout's new or removed MachineSet changes its siblings
                for sibling in caches.machine_sets.by_index(DEPLOYMENT_INDEX, deployment):
                    queues.machine_sets.add(key_of(namespace, sibling.metadata.name))

    def on_machine_deployment(old: MachineDeployment | None, new: MachineDeployment | None) -> None:
        current = new or old
        assert current is not None
        queues.machine_deployments.add(
            key_of(current.metadata.namespace, current.metadata.name), background=is_resync(old, new)
        )

    def on_cluster(old: ClusterView | None, new: ClusterView | None) -> None:
        # The Shoot's pool settings may have changed: every MachineSet's auto-preservation max with them.
        for machine_set in caches.machine_sets.values():
            queues.machine_sets.add(
                key_of(machine_set.metadata.namespace, machine_set.metadata.name), background=old is new
            )

    caches.machines.add_handler(on_machine)
    if caches.clusters is not None:
        caches.clusters.add_handler(on_cluster)
    caches.nodes.add_handler(on_node)
    caches.pods.add_handler(on_pod)
    caches.machine_sets.add_handler(on_machine_set)
    caches.machine_deployments.add_handler(on_machine_deployment)
