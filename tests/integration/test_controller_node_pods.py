"""Pods are watched per held node on the real apiserver: only that node's pods are cached, a watch follows new
pods, a node stays watched while anyone holds it, and a hold on a node the apiserver cannot list in time fails
with PodsNotListed instead of planning on pods it has not seen."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes.aio import client

from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reader import POD_NODE_INDEX, PodsNotListed
from tests.controller.support import new_node, running_pod
from tests.polling import eventually_async


def names(node_pods: NodePods, node: str) -> list[str]:
    return sorted(pod.name for pod in node_pods.by_index(POD_NODE_INDEX, node))


async def test_a_held_node_caches_its_own_pods_only_and_follows_new_ones(
    api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    failed, other = await new_node(api, node_names, ready=False), await new_node(api, node_names, ready=True)
    await running_pod(core, namespace, "on-failed", node=failed)
    await running_pod(core, namespace, "on-other", node=other)
    node_pods = NodePods(target=api)
    changes: list[str] = []
    node_pods.add_handler(lambda old, new: changes.append((new or old).name if (new or old) else ""))
    try:
        await node_pods.hold(f"{namespace}/m", failed)
        assert names(node_pods, failed) == ["on-failed"], "listed before hold returns"
        assert names(node_pods, other) == [], "a node nobody holds is not watched"
        assert len(node_pods) == 1

        since = node_pods.changes(failed)
        with pytest.raises(TimeoutError):  # nothing changes: the caller's bound ends the wait
            async with asyncio.timeout(0.3):
                await node_pods.wait_for_change(failed, since=since)
        waiting = asyncio.create_task(node_pods.wait_for_change(failed, since=since))
        await running_pod(core, namespace, "later", node=failed)
        await asyncio.wait_for(waiting, 10)  # woken by the new pod, which a drain waits for instead of polling
        assert node_pods.changes(failed) > since
        await eventually_async(lambda: names(node_pods, failed) == ["later", "on-failed"])
        assert "later" in changes, "a pod change on a held node reaches the handlers"
        assert node_pods.get(f"{namespace}/later") is not None
    finally:
        await node_pods.stop()
    assert node_pods.nodes == []


async def test_a_node_is_watched_while_anyone_holds_it(
    api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    first, second = await new_node(api, node_names, ready=False), await new_node(api, node_names, ready=False)
    node_pods = NodePods(target=api)
    try:
        await node_pods.hold("ns/a", first)
        await node_pods.hold("ns/b", first)  # two machines naming the same node
        node_pods.release("ns/a")
        assert node_pods.nodes == [first], "still held by ns/b"

        await node_pods.hold("ns/b", second)  # its node label changed: the first node is let go
        assert node_pods.nodes == [second]
        node_pods.release("ns/b")
        node_pods.release("ns/unknown")  # releasing what is not held is harmless
        assert node_pods.nodes == []
    finally:
        await node_pods.stop()


async def test_a_hold_the_apiserver_cannot_answer_in_time_fails_and_says_why() -> None:
    # Nothing listens on port 9 of the loopback: the list is refused, over and over.
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as nowhere:
        node_pods = NodePods(target=nowhere, list_limit=0.5)
        try:
            with pytest.raises(PodsNotListed, match="node n1"):
                await node_pods.hold("ns/m", "n1")
            assert node_pods.by_index(POD_NODE_INDEX, "n1") == []
        finally:
            await node_pods.stop()
