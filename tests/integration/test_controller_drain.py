"""The drain executor against the real Eviction API and a PDB whose status the real
kube-controller-manager disruption controller computes. There is no kubelet: the tests write pod
readiness through pods/status, and where a test needs a kubelet finishing graceful deletion it plays
that part by deleting terminating pods with grace period 0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest
from kubernetes.aio import client

from machine_preservation.controller.preservation.drain import POD_NODE_INDEX, Drainer
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reader import PodsNotListed
from machine_preservation.core.models import Pod
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import chart_identity
from tests.controller.support import guarded_pods, new_node, pdb_settled, read_node_model, read_raw, running_pod
from tests.polling import eventually_async


@pytest.fixture
async def pods(api: client.ApiClient) -> AsyncIterator[NodePods]:
    """The pods of the nodes a test holds, as the Machine reconciler holds a failed machine's node."""
    node_pods = NodePods(target=api)
    yield node_pods
    await node_pods.stop()


async def pod_state(core: client.CoreV1Api, namespace: str, name: str) -> str:
    try:
        pod = await read_raw(core.read_namespaced_pod_without_preload_content(name, namespace))
    except AssertionError:
        return "gone"
    return "terminating" if pod["metadata"].get("deletionTimestamp") else "running"


async def test_evicts_every_pod_but_daemonset_and_mirror_pods_on_an_unreachable_node(
    api: client.ApiClient, namespace: str, pods: NodePods, node_names: list[str]
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    node, elsewhere = await new_node(api, node_names, ready=False), await new_node(api, node_names, ready=False)
    daemonset = await apps.create_namespaced_daemon_set(
        namespace,
        {
            "metadata": {"name": "ds"},
            "spec": {
                "selector": {"matchLabels": {"app": "ds"}},
                "template": {
                    "metadata": {"labels": {"app": "ds"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
                },
            },
        },
    )
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "ds",
        "uid": daemonset.metadata.uid,
        "controller": True,
    }
    await running_pod(core, namespace, "plain", node=node)
    await running_pod(core, namespace, "completed", node=node)
    await core.patch_namespaced_pod_status("completed", namespace, {"status": {"phase": "Succeeded"}})
    await running_pod(core, namespace, "ds-pod", node=node, labels={"app": "ds"}, ownerReferences=[owner])
    await running_pod(core, namespace, "static", node=node, annotations={"kubernetes.io/config.mirror": "x"})
    await running_pod(core, namespace, "other-node", node=elsewhere)
    await pods.hold("test", node)
    await eventually_async(lambda: len(pods.by_index(POD_NODE_INDEX, node)) == 4)

    drainer = Drainer(target=api, pods=pods)
    result = await drainer.drain(node=await read_node_model(core, node), time_limit=60, max_evict_retries=3)

    assert result.drained
    assert result.blocking == ()
    assert await pod_state(core, namespace, "plain") in ("terminating", "gone")
    assert await pod_state(core, namespace, "completed") == "gone", "a finished pod is deleted at once"
    assert await pod_state(core, namespace, "ds-pod") == "running"
    assert await pod_state(core, namespace, "static") == "running"
    assert await pod_state(core, namespace, "other-node") == "running"
    assert (await read_node_model(core, node)).spec.unschedulable is False


async def test_a_pdb_allowing_no_disruption_blocks_and_the_blocking_pods_are_named(
    api: client.ApiClient, namespace: str, pods: NodePods, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node = await new_node(api, node_names, ready=False)
    await guarded_pods(api, namespace, node, "guarded-b", "guarded-a")
    await pods.hold("test", node)
    await eventually_async(lambda: len(pods.by_index(POD_NODE_INDEX, node)) == 2)

    drainer = Drainer(target=api, pods=pods)
    result = await drainer.drain(node=await read_node_model(core, node), time_limit=3, max_evict_retries=50)

    assert not result.drained
    assert result.blocking == (f"{namespace}/guarded-a", f"{namespace}/guarded-b")
    assert result.blocked_by == (f"{namespace}/guard",), "the budget that refused, from its selector"
    assert await pod_state(core, namespace, "guarded-a") == "running"
    assert await pod_state(core, namespace, "guarded-b") == "running"


async def test_eviction_retries_are_bounded_by_max_evict_retries(
    api: client.ApiClient, namespace: str, pods: NodePods, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node = await new_node(api, node_names, ready=False)
    await guarded_pods(api, namespace, node, "guarded")
    await pods.hold("test", node)
    await eventually_async(lambda: len(pods.by_index(POD_NODE_INDEX, node)) == 1)

    drainer = Drainer(target=api, pods=pods)
    # A generous deadline: the drain gives up after the retries, long before the deadline.
    task = asyncio.create_task(
        drainer.drain(node=await read_node_model(core, node), time_limit=600, max_evict_retries=2)
    )
    result = await asyncio.wait_for(task, 60)
    assert not result.drained
    assert result.blocking == (f"{namespace}/guarded",)


async def test_on_a_live_node_the_drain_waits_for_pods_to_be_gone_and_follows_the_pdb(
    api: client.ApiClient, namespace: str, pods: NodePods, node_names: list[str]
) -> None:
    core, policy, apps = client.CoreV1Api(api), client.PolicyV1Api(api), client.AppsV1Api(api)
    node, spare = await new_node(api, node_names, ready=True), await new_node(api, node_names, ready=True)
    # A ReplicaSet gives the PDB its expected count; no ReplicaSet controller runs, the test plays it.
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "none"}]}}
    replica_set = await apps.create_namespaced_replica_set(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template},
        },
    )
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "web",
        "uid": replica_set.metadata.uid,
        "controller": True,
    }
    for name in ("web-1", "web-2"):
        await running_pod(core, namespace, name, node=node, labels={"app": "web"}, ownerReferences=[owner])
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {"metadata": {"name": "web"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}},
    )
    await eventually_async(lambda: pdb_settled(policy, namespace, "web", allowed=1))
    await pods.hold("test", node)
    await eventually_async(lambda: len(pods.by_index(POD_NODE_INDEX, node)) == 2)

    drainer = Drainer(target=api, pods=pods)
    drain = asyncio.create_task(
        drainer.drain(node=await read_node_model(core, node), time_limit=120, max_evict_retries=100)
    )
    # Play the kubelet (finish the deletion of a terminating pod) and the ReplicaSet controller (start a
    # ready replacement on the spare node). The drain must wait for each evicted pod to be gone.
    finished: list[str] = []

    async def kubelet_and_replicaset_step() -> bool:
        states = {name: await pod_state(core, namespace, name) for name in ("web-1", "web-2")}
        terminating = [name for name, state in states.items() if state == "terminating"]
        assert len(terminating) <= 1, f"the PDB allows one disruption at a time: {states}"
        for name in terminating:
            assert not drain.done(), "the drain must wait while an evicted pod still exists"
            await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            await running_pod(
                core, namespace, f"{name}-new", node=spare, labels={"app": "web"}, ownerReferences=[owner]
            )
            finished.append(name)
        return sorted(finished) == ["web-1", "web-2"]

    await eventually_async(kubelet_and_replicaset_step, limit=90, interval=0.5)
    result = await asyncio.wait_for(drain, 60)
    assert result.drained
    assert {await pod_state(core, namespace, n) for n in ("web-1", "web-2")} == {"gone"}
    assert {await pod_state(core, namespace, n) for n in ("web-1-new", "web-2-new")} == {"running"}


class LaggingPods:
    """A node's pods as first listed, never seeing them go: a cache far behind the evictions."""

    def __init__(self, listed: Sequence[Pod]) -> None:
        self.listed = list(listed)

    def by_index(self, _index: str, _node: str) -> Sequence[Pod]:
        return self.listed

    def changes(self, _node: str) -> int:
        return 0

    async def wait_for_change(self, _node: str, *, since: int) -> None:
        await asyncio.Event().wait()


async def test_a_pod_whose_eviction_was_accepted_is_not_evicted_again_while_the_cache_still_shows_it(
    api: client.ApiClient, control_plane: ControlPlane, namespace: str, pods: NodePods, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node = await new_node(api, node_names, ready=False)
    for index in range(5):
        await running_pod(core, namespace, f"web-{index}", node=node)
    await pods.hold("test", node)
    await eventually_async(lambda: len(pods.by_index(POD_NODE_INDEX, node)) == 5)
    evictions: list[str] = []

    async def on_request_end(_session: object, _context: object, params: aiohttp.TraceRequestEndParams) -> None:
        if params.url.path.endswith("/eviction"):
            evictions.append(params.url.path)

    tracing = aiohttp.TraceConfig()
    tracing.on_request_end.append(on_request_end)
    identity = await chart_identity(control_plane.kubeconfig, namespace, leader_election=False)
    target = await new_api_client(kubeconfig=identity, trace_configs=[tracing])  # as the chart's controller
    lagging = LaggingPods(pods.by_index(POD_NODE_INDEX, node))
    try:
        drainer = Drainer(target=target, pods=lagging, poll_interval=0.05)  # type: ignore[arg-type]
        result = await drainer.drain(node=await read_node_model(core, node), time_limit=1.0, max_evict_retries=3)
    finally:
        await target.close()
    assert not result.drained, "the lagging cache never shows them gone"
    assert sorted(evictions) == sorted(f"/api/v1/namespaces/{namespace}/pods/web-{i}/eviction" for i in range(5))
    assert {await pod_state(core, namespace, f"web-{i}") for i in range(5)} <= {"terminating", "gone"}


async def test_a_nodes_pods_over_the_budget_are_not_cached_and_the_hold_says_why(
    api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    """A shoot owner can bind any number of pods to a node and let it fail: past the budget the node's watch keeps
    nothing, and the reconcile's hold fails (retried with backoff) instead."""
    core = client.CoreV1Api(api)
    crowded, usual = await new_node(api, node_names, ready=False), await new_node(api, node_names, ready=False)
    for index in range(12):
        await running_pod(core, namespace, f"crowd-{index}", node=crowded)
    await running_pod(core, namespace, "web", node=usual)
    # Each pod counts as at least POD_MIN_BYTES (1 KiB): twelve cannot fit in 8 KiB, one does.
    node_pods = NodePods(target=api, byte_budget=8 * 1024, list_limit=2.0)
    try:
        with pytest.raises(PodsNotListed, match="over the budget"):
            await node_pods.hold("crowded", crowded)
        assert node_pods.by_index(POD_NODE_INDEX, crowded) == []
        await node_pods.hold("usual", usual)
        assert [pod.name for pod in node_pods.by_index(POD_NODE_INDEX, usual)] == ["web"]
    finally:
        await node_pods.stop()


async def test_the_refusing_budget_is_named_from_one_list_of_its_namespace_as_the_charts_controller(
    api: client.ApiClient, control_plane: ControlPlane, namespace: str, pods: NodePods, node_names: list[str]
) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    node = await new_node(api, node_names, ready=False)
    await guarded_pods(api, namespace, node, "guarded-a", "guarded-b")
    # A budget of the same namespace that covers other pods: not named.
    others = {"metadata": {"name": "others"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}}
    await policy.create_namespaced_pod_disruption_budget(namespace, others)
    await pods.hold("test", node)
    await eventually_async(lambda: len(pods.by_index(POD_NODE_INDEX, node)) == 2)
    listings: list[str] = []

    async def on_request_end(_session: object, _context: object, params: aiohttp.TraceRequestEndParams) -> None:
        if params.url.path.endswith("/poddisruptionbudgets"):
            listings.append(params.url.path)

    tracing = aiohttp.TraceConfig()
    tracing.on_request_end.append(on_request_end)
    identity = await chart_identity(control_plane.kubeconfig, namespace, leader_election=False)
    target = await new_api_client(kubeconfig=identity, trace_configs=[tracing])  # the chart's RBAC lets it list
    try:
        drainer = Drainer(target=target, pods=pods, poll_interval=0.05)
        result = await drainer.drain(node=await read_node_model(core, node), time_limit=2, max_evict_retries=50)
    finally:
        await target.close()
    assert not result.drained
    assert result.blocked_by == (f"{namespace}/guard",)
    assert listings == [f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"], "once per attempt"
