"""The event handlers: every cache change, mapped to the keys of the objects it can affect, queued.

Each kind of object has a mapping function, `(old, new, *, caches) -> Keys`; one wrapper (`_enqueue`) queues the
keys. A notification that carries no change (`is_resync`: the periodic resync, or a re-list after a watch
expired that finds an object as the cache had it) queues its keys in the background lane, so real changes and
due timers are served first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from machine_preservation.controller.machinery.queue import WorkQueue
from machine_preservation.controller.preservation.caches import Caches
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reader import DEPLOYMENT_INDEX, MACHINE_NODE_INDEX, key_of, owner_name
from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import ClusterView
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node, NodeMeta, ObjectMeta, Pod
from machine_preservation.kube.informer import Handler

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


@dataclass
class Queues:
    machines: WorkQueue[str]
    machine_sets: WorkQueue[str]
    machine_deployments: WorkQueue[str]

    @property
    def all(self) -> tuple[WorkQueue[str], WorkQueue[str], WorkQueue[str]]:
        return (self.machines, self.machine_sets, self.machine_deployments)


@dataclass
class Keys:
    """The keys a change affects, per queue, in the order they are queued."""

    machines: list[str] = field(default_factory=list)
    machine_sets: list[str] = field(default_factory=list)
    machine_deployments: list[str] = field(default_factory=list)


class KeyMapping(Protocol[T_contra]):
    """Maps one cache notification, (old, new) as an `informer.Handler` receives it, to the keys it affects."""

    def __call__(self, old: T_contra | None, new: T_contra | None, *, caches: Caches) -> Keys: ...


def is_resync(old: object, new: object) -> bool:
    """Whether a cache notification carries no change: the resync's `(obj, obj)`, a re-list returning an object
    at the resourceVersion the cache already had or, for what is cached without a resourceVersion (pods, the
    Cluster's view), an equal object."""
    if old is None or new is None:
        return False
    if old is new:
        return True
    version = _resource_version(old)
    if version is None:
        return old == new
    return version != "" and version == _resource_version(new)


def _resource_version(obj: object) -> str | None:
    metadata = getattr(obj, "metadata", None)
    return metadata.resource_version if isinstance(metadata, NodeMeta | ObjectMeta) else None


def _machine_key(machine: Machine) -> str:
    return key_of(machine.metadata.namespace, machine.metadata.name)


def _machine_set_keys(machine: Machine) -> list[str]:
    return [key_of(machine.metadata.namespace, name) for name in owner_name("MachineSet")(machine)]


def _priority_relevant(machine: Machine) -> tuple[str | None, str | None, bool]:
    annotations = machine.metadata.annotations
    return (
        annotations.get(v.MACHINE_PRIORITY_ANNOTATION),
        annotations.get(v.LAST_MACHINE_PRIORITY_ANNOTATION),
        machine.preservation is not None,
    )


def machine_keys(old: Machine | None, new: Machine | None, *, caches: Caches) -> Keys:
    """The machine and its MachineSet; on a priority or preservation change also the preserved siblings, whose
    priority ceiling it moves."""
    current = new or old
    assert current is not None
    keys = Keys(machines=[_machine_key(current)], machine_sets=_machine_set_keys(current))
    if old is None or new is None or _priority_relevant(old) != _priority_relevant(new):
        keys.machines += [
            _machine_key(sibling)
            for sibling in caches.machine_set_of(current)
            if sibling.preservation is not None and sibling.metadata.name != current.metadata.name
        ]
    return keys


def node_keys(old: Node | None, new: Node | None, *, caches: Caches) -> Keys:
    """The machines naming the node, and their MachineSets."""
    current = new or old
    assert current is not None
    keys = Keys()
    for machine in caches.machines.by_index(MACHINE_NODE_INDEX, current.metadata.name):
        keys.machines.append(_machine_key(machine))
        keys.machine_sets += _machine_set_keys(machine)
    return keys


def pod_keys(old: Pod | None, new: Pod | None, *, caches: Caches) -> Keys:
    """The machines of the pod's node while it is being drained (carries the preserved taint); else none."""
    current = new or old
    assert current is not None
    node = caches.nodes.get(current.node_name) if current.node_name else None
    if node is None or not node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT):
        return Keys()
    return Keys(machines=[_machine_key(m) for m in caches.machines.by_index(MACHINE_NODE_INDEX, node.metadata.name)])


def machine_set_keys(old: MachineSet | None, new: MachineSet | None, *, caches: Caches) -> Keys:
    """The MachineSet and its MachineDeployment; when a rollout adds or removes a MachineSet, also its siblings."""
    current = new or old
    assert current is not None
    namespace = current.metadata.namespace
    keys = Keys(machine_sets=[key_of(namespace, current.metadata.name)])
    for deployment in owner_name("MachineDeployment")(current):
        keys.machine_deployments.append(key_of(namespace, deployment))
        if old is None or new is None:
            keys.machine_sets += [
                key_of(namespace, sibling.metadata.name)
                for sibling in caches.machine_sets.by_index(DEPLOYMENT_INDEX, deployment)
            ]
    return keys


def machine_deployment_keys(old: MachineDeployment | None, new: MachineDeployment | None, *, caches: Caches) -> Keys:
    current = new or old
    assert current is not None
    return Keys(machine_deployments=[key_of(current.metadata.namespace, current.metadata.name)])


def cluster_keys(old: ClusterView | None, new: ClusterView | None, *, caches: Caches) -> Keys:
    """Every MachineSet: the Shoot's pool settings may have changed their auto-preservation max."""
    return Keys(machine_sets=[key_of(s.metadata.namespace, s.metadata.name) for s in caches.machine_sets.values()])


def _enqueue(mapping: KeyMapping[T], *, caches: Caches, queues: Queues) -> Handler[T]:
    """A cache handler that queues the keys `mapping` finds, in the background lane when nothing changed."""

    def handle(old: T | None, new: T | None) -> None:
        keys, background = mapping(old, new, caches=caches), is_resync(old, new)
        for queue, queued in (
            (queues.machines, keys.machines),
            (queues.machine_sets, keys.machine_sets),
            (queues.machine_deployments, keys.machine_deployments),
        ):
            for key in queued:
                queue.add(key, background=background)

    return handle


def wire_handlers(*, caches: Caches, node_pods: NodePods, queues: Queues) -> None:
    """Queue the keys every cache change affects."""
    caches.machines.add_handler(_enqueue(machine_keys, caches=caches, queues=queues))
    if caches.clusters is not None:
        caches.clusters.add_handler(_enqueue(cluster_keys, caches=caches, queues=queues))
    caches.nodes.add_handler(_enqueue(node_keys, caches=caches, queues=queues))
    node_pods.add_handler(_enqueue(pod_keys, caches=caches, queues=queues))
    caches.machine_sets.add_handler(_enqueue(machine_set_keys, caches=caches, queues=queues))
    caches.machine_deployments.add_handler(_enqueue(machine_deployment_keys, caches=caches, queues=queues))
