"""Which keys a cache change queues, and in which lane: a notification that carries no change (a periodic
resync, or a re-list that finds an object as the cache had it) goes to the background lane, whatever kind of
object it is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.controller.machinery.queue import WorkQueue
from machine_preservation.controller.preservation.caches import Caches
from machine_preservation.controller.preservation.handlers import Queues, is_resync, wire_handlers
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reader import PodsNotListed
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node, Pod
from machine_preservation.kube.informer import Informer, Source
from tests.controller.faketimer import FakeTimer

NODE = "n1"


def _unused_list(*_: Any, **__: Any) -> None:
    raise AssertionError("these caches are filled by the test, never listed")


def _informer(name: str, parse: Any) -> Informer[Any]:
    return Informer(name=name, source=Source(_unused_list), parse=parse)


def _machine(resource_version: str, *, label: str = "a") -> Machine:
    return Machine.model_validate(
        {"metadata": {"name": "m", "resourceVersion": resource_version, "labels": {"x": label}}}
    )


def _pod(*, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns", "resourceVersion": "7"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-21T12:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": NODE}}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (None, _machine("5"), False),  # added
        (_machine("5"), None, False),  # deleted
        (_machine("5"), _machine("6", label="b"), False),  # a watch event: always a new resourceVersion
        (_machine("5"), _machine("5"), True),  # a re-list found it unchanged
        (_machine(""), _machine(""), False),  # no version to compare: a change, to be safe
        (Pod.model_validate(_pod()), Pod.model_validate(_pod()), True),  # a pod keeps no version: equal is unchanged
        (Pod.model_validate(_pod()), Pod.model_validate(_pod(deleting=True)), False),
    ],
    ids=["added", "deleted", "modified", "relisted-unchanged", "unversioned", "pod-unchanged", "pod-changed"],
)
def test_which_notifications_go_to_the_background_lane(old: object, new: object, expected: bool) -> None:
    assert is_resync(old, new) is expected


def test_a_periodic_resync_hands_the_same_object_and_goes_to_the_background_lane() -> None:
    same = _machine("")
    assert is_resync(same, same)


@dataclass
class Wired:
    caches: Caches
    queues: Queues
    pods: Informer[Pod]  # the watch of NODE's pods; filled by the test


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    caches = Caches(
        machines=_informer("machines", Machine.model_validate),
        machine_sets=_informer("machinesets", MachineSet.model_validate),
        machine_deployments=_informer("machinedeployments", MachineDeployment.model_validate),
        nodes=_informer("nodes", Node.model_validate),
    )
    timer = FakeTimer()
    queues = Queues(
        machines=WorkQueue(name="m", timer=timer),
        machine_sets=WorkQueue(name="s", timer=timer),
        machine_deployments=WorkQueue(name="d", timer=timer),
    )
    # Nothing listens there: the node's pod watch never lists, the test fills its cache.
    configuration = client.Configuration(host="http://127.0.0.1:9")
    async with client.ApiClient(configuration) as nowhere:
        node_pods = NodePods(target=nowhere, list_limit=0.01)
        wire_handlers(caches=caches, node_pods=node_pods, queues=queues)
        preserved_taint = {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT}
        caches.nodes._replace(
            {NODE: Node.model_validate({"metadata": {"name": NODE}, "spec": {"taints": [preserved_taint]}})}
        )
        machine = {"metadata": {"name": "m", "namespace": "ns", "resourceVersion": "3", "labels": {"node": NODE}}}
        caches.machines._replace({"ns/m": Machine.model_validate(machine)})
        with contextlib.suppress(PodsNotListed):
            await node_pods.hold("ns/m", NODE)
        yield Wired(caches=caches, queues=queues, pods=node_pods._watches[NODE].informer)
        await node_pods.stop()


async def taken(queue: WorkQueue[str]) -> list[str]:
    """Every key waiting now, in the order workers get them."""
    keys = []
    while len(queue):
        key = await asyncio.wait_for(queue.get(), 1)
        assert key is not None
        keys.append(key)
        queue.done(key)
    return keys


async def test_a_re_listed_unchanged_pod_queues_its_machine_behind_changes(wired: Wired) -> None:
    queues = wired.queues
    await taken(queues.machines)
    wired.pods._replace({"ns/p": Pod.model_validate(_pod())})
    assert await taken(queues.machines) == ["ns/m"], "a new pod on a preserved node: its machine looks again"

    wired.pods._replace({"ns/p": Pod.model_validate(_pod())})  # a re-list (after a watch expired), unchanged
    queues.machines.add("ns/changed")
    assert await taken(queues.machines) == ["ns/changed", "ns/m"]


async def test_a_changed_pod_queues_its_machine_in_front(wired: Wired) -> None:
    queues = wired.queues
    wired.pods._replace({"ns/p": Pod.model_validate(_pod())})
    await taken(queues.machines)
    queues.machines.add("ns/resynced", background=True)

    wired.pods._replace({"ns/p": Pod.model_validate(_pod(deleting=True))})
    assert await taken(queues.machines) == ["ns/m", "ns/resynced"]
