"""A shoot's view of the seed-wide caches: it sees, indexes, counts and is told about its own namespace's objects
only, also where two shoots use the same names; a runtime started after the seed-wide list is told about every
object already cached, once; a stopped runtime is told nothing more."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.controller.preservation.caches import Caches
from machine_preservation.controller.preservation.reader import MACHINE_NODE_INDEX, MACHINE_SET_INDEX
from machine_preservation.controller.preservation.views import SeedInformers
from machine_preservation.core.gardener.cluster import ClusterView, read_cluster
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node
from machine_preservation.kube.informer import Informer, Source


def _unused_list(*_: Any, **__: Any) -> None:
    raise AssertionError("these caches are filled by the test, never listed")


def _informer(name: str, parse: Any) -> Informer[Any]:
    return Informer(name=name, source=Source(_unused_list), parse=parse)


def seed_informers() -> SeedInformers:
    return SeedInformers(
        machines=_informer("machines", Machine.model_validate),
        machine_sets=_informer("machinesets", MachineSet.model_validate),
        machine_deployments=_informer("machinedeployments", MachineDeployment.model_validate),
        clusters=_informer("clusters", read_cluster),
    )


def machine(namespace: str, name: str, *, node: str, machine_set: str = "set", version: str = "1") -> Machine:
    owner = {"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet", "name": machine_set, "uid": "u"}
    return Machine.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": version,
                "labels": {"node": node},
                "ownerReferences": [{**owner, "controller": True}],
            }
        }
    )


def shoot_caches(informers: SeedInformers, namespace: str) -> Caches:
    views = informers.views(namespace)
    return Caches(
        machines=views.machines,
        machine_sets=views.machine_sets,
        machine_deployments=views.machine_deployments,
        nodes=_informer("nodes", Node.model_validate),
        clusters=views.clusters,
        close=views.close,
    )


def test_each_shoot_sees_and_indexes_its_own_objects_also_under_the_same_names() -> None:
    informers = seed_informers()
    a, b = shoot_caches(informers, "shoot--a"), shoot_caches(informers, "shoot--b")
    informers.machines._replace(
        {
            "shoot--a/m1": machine("shoot--a", "m1", node="node-1"),
            "shoot--b/m1": machine("shoot--b", "m1", node="node-1"),  # the same names in another shoot
            "shoot--b/m2": machine("shoot--b", "m2", node="node-2"),
        }
    )
    assert [m.metadata.namespace for m in a.machines.values()] == ["shoot--a"]
    assert len(b.machines) == 2
    assert a.machines.get("shoot--b/m1") is None, "another shoot's key is not in this view"
    assert a.machines.get("shoot--a/m1") is not None
    assert [m.metadata.namespace for m in a.machines.by_index(MACHINE_NODE_INDEX, "node-1")] == ["shoot--a"]
    assert [m.metadata.name for m in b.machines.by_index(MACHINE_SET_INDEX, "set")] == ["m1", "m2"]
    assert a.machines.by_index(MACHINE_NODE_INDEX, "node-2") == []


def test_a_cluster_belongs_to_the_shoot_namespace_of_its_name() -> None:
    informers = seed_informers()
    a = shoot_caches(informers, "shoot--a")
    informers.clusters._replace(
        {name: read_cluster({"metadata": {"name": name}, "spec": {}}) for name in ("shoot--a", "shoot--b")}
    )
    found = a.cluster("shoot--a")
    assert isinstance(found, ClusterView)
    assert found.name == "shoot--a"
    assert a.cluster("shoot--b") is None


def test_a_late_handler_is_told_of_every_cached_object_then_of_its_own_changes_only() -> None:
    informers = seed_informers()
    informers.machines._replace(
        {"shoot--a/m1": machine("shoot--a", "m1", node="n1"), "shoot--b/m1": machine("shoot--b", "m1", node="n1")}
    )
    calls: list[tuple[str | None, str | None]] = []

    def key(m: Machine | None) -> str | None:
        return f"{m.metadata.namespace}/{m.metadata.name}" if m is not None else None

    view = informers.views("shoot--a").machines
    view.add_handler(lambda old, new: calls.append((key(old), key(new))))
    assert calls == [(None, "shoot--a/m1")], "replayed as added, the other shoot's object not"

    informers.machines._apply("ADDED", {"metadata": {"name": "m2", "namespace": "shoot--b", "resourceVersion": "2"}})
    informers.machines._apply("ADDED", {"metadata": {"name": "m2", "namespace": "shoot--a", "resourceVersion": "3"}})
    assert calls[1:] == [(None, "shoot--a/m2")]

    view.close()
    informers.machines._apply("DELETED", {"metadata": {"name": "m2", "namespace": "shoot--a", "resourceVersion": "4"}})
    assert len(calls) == 2, "a closed view's handlers are not called"


def test_only_a_change_in_its_own_namespace_moves_a_shoots_generation() -> None:
    informers = seed_informers()
    a, b = informers.views("shoot--a").machines, informers.views("shoot--b").machines
    informers.machines._replace({"shoot--a/m1": machine("shoot--a", "m1", node="n1")})
    before_a, before_b = a.generation, b.generation
    assert before_a > 0
    informers.machines._apply("MODIFIED", {"metadata": {"name": "m1", "namespace": "shoot--b", "resourceVersion": "9"}})
    assert (a.generation, b.generation) == (before_a, before_b + 1)
    informers.machines._notify(a.get("shoot--a/m1"), a.get("shoot--a/m1"))  # a resync: no change
    assert a.generation == before_a


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["m1", "m2", "m3"]), st.sampled_from(["n1", "n2"])
        ),
        max_size=12,
    )
)
def test_the_views_partition_the_seed_wide_cache(entries: list[tuple[str, str, str]]) -> None:
    informers = seed_informers()
    views = {ns: informers.views(ns).machines for ns in ("s1", "s2", "s3")}
    for view in views.values():
        view.add_indexer(MACHINE_NODE_INDEX, lambda m: [m.node_name])
    informers.machines._replace({f"{ns}/{name}": machine(ns, name, node=node) for ns, name, node in entries})
    cached = {f"{ns}/{name}": node for ns, name, node in entries}
    for ns, view in views.items():
        assert sorted(f"{m.metadata.namespace}/{m.metadata.name}" for m in view.values()) == sorted(
            key for key in cached if key.startswith(f"{ns}/")
        )
        for node in ("n1", "n2"):
            assert sorted(m.metadata.name for m in view.by_index(MACHINE_NODE_INDEX, node)) == sorted(
                key.split("/")[1] for key, n in cached.items() if key.startswith(f"{ns}/") and n == node
            )
