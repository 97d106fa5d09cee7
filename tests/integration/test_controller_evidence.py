"""The evidence of a failure (issue #31 ask 3) through the whole controller on the real API server, as the chart's
controller identity: a Failed machine's preservation records its node's conditions, Events, pods and MCM's last
operation in kube-system, owned by the Node and pointed at from it (by a later reconcile when the Node changed
under the first pointer); bounded whatever the pods hold; given an expiry once the preservation ended and deleted
after the grace period; and a capture the controller may not write is told by a Warning Event while the
preservation goes on."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.events import NODE_EVENT_NAMESPACE, EventRecorder
from machine_preservation.controller.preservation.caches import new_caches
from machine_preservation.controller.preservation.evidence import EvidenceKeeper
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reconcile import POINTER_RETRY
from machine_preservation.core import evidence as e
from machine_preservation.core import vocabulary as v
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.core.models import Node
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import chart_identity, running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_machine,
    events_about,
    is_preserved,
    machine_model,
    machine_reconciler,
    new_node,
    read_node_model,
    running_pod,
)
from tests.polling import eventually_async

MERGE = "application/merge-patch+json"
LAST_OPERATION = {
    "description": "Machine m failed health check: the node is not Ready",
    "state": "Failed",
    "type": "HealthCheck",
    "lastUpdateTime": "2026-11-29T09:51:00Z",
}


async def failed_machine(api: client.ApiClient, namespace: str, node: str, name: str = "m") -> None:
    """A Failed machine of `node`, to be preserved when failed, with MCM's last operation."""
    custom = client.CustomObjectsApi(api)
    await create_machine(
        custom, namespace, name, node=node, phase="Failed", annotations={v.PRESERVE_ANNOTATION: "when-failed"}
    )
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "machines", name, {"status": {"lastOperation": LAST_OPERATION}}, _content_type=MERGE
    )


async def node_event(api: client.ApiClient, node: str, reason: str, message: str) -> None:
    now = format_timestamp(dt.datetime.now(dt.UTC))
    await client.CoreV1Api(
        api
    ).create_namespaced_event(
        NODE_EVENT_NAMESPACE,
        {  # type: ignore[arg-type]
            "metadata": {"name": f"{node}.{uuid.uuid4().hex[:12]}"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "type": "Warning",
            "reason": reason,
            "message": message,
            "count": 3,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "kubelet", "host": node},
        },
    )


async def stored(api: client.ApiClient, node: str) -> dict[str, Any] | None:
    try:
        response = await client.CoreV1Api(api).read_namespaced_config_map_without_preload_content(
            e.evidence_name(node), v.EVIDENCE_NAMESPACE
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    if response.status == 404:
        return None
    found: dict[str, Any] = json.loads(await response.read())
    return found


async def delete_evidence(api: client.ApiClient, node: str) -> None:
    try:
        await client.CoreV1Api(api).delete_namespaced_config_map(e.evidence_name(node), v.EVIDENCE_NAMESPACE)
    except ApiException as error:
        if error.status != 404:
            raise


async def test_a_failed_machines_evidence_is_recorded_pointed_at_and_removed_after_the_grace(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node = await new_node(api, node_names, ready=False)
    await running_pod(core, namespace, "web-1", node=node)
    await node_event(api, node, "NodeNotReady", f"Node {node} status is now: NodeNotReady")
    # A ConfigMap labelled as evidence but not the controller's (not named after a node it is owned by): untouched.
    foreign = f"not-ours-{uuid.uuid4().hex[:8]}"
    await core.create_namespaced_config_map(
        v.EVIDENCE_NAMESPACE,
        {
            "metadata": {
                "name": foreign,
                "labels": {v.EVIDENCE_LABEL: "true"},
                "annotations": {v.EVIDENCE_NODE_KEY: node},
            }
        },  # type: ignore[arg-type]
    )
    await failed_machine(api, namespace, node)
    try:
        async with running_controller(
            kubeconfig=control_plane.kubeconfig, namespace=namespace, evidence_grace=dt.timedelta(seconds=3)
        ):
            await eventually_async(lambda: stored(api, node), limit=30)
            config_map = await stored(api, node)
            assert config_map is not None
            metadata = config_map["metadata"]
            node_uid = (await read_node_model(core, node)).metadata.uid
            assert metadata["labels"] == {v.EVIDENCE_LABEL: "true"}
            assert metadata["annotations"] == {v.EVIDENCE_NODE_KEY: node}
            assert metadata["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
            evidence = e.Evidence.model_validate_json(config_map["data"][v.EVIDENCE_DATA_KEY])
            assert evidence.node == node
            assert [(c.type, c.status, c.reason) for c in evidence.conditions] == [
                ("Ready", "Unknown", "NodeStatusUnknown")
            ]
            (event,) = evidence.events
            assert (event.type, event.reason, event.count, event.source) == ("Warning", "NodeNotReady", 3, "kubelet")
            (pod,) = evidence.pods
            assert (pod.namespace, pod.name, pod.phase) == (namespace, "web-1", "Running")
            assert evidence.machine == e.MachineEvidence(
                name="m",
                phase="Failed",
                last_operation=e.LastOperation(
                    description=LAST_OPERATION["description"],
                    state="Failed",
                    type="HealthCheck",
                    last_update_time=dt.datetime(2026, 11, 29, 9, 51, tzinfo=dt.UTC),
                ),
            )
            assert evidence.unavailable == ()

            async def pointed() -> bool:
                found = await read_node_model(core, node)
                return found.metadata.annotations.get(v.PRESERVED_EVIDENCE_ANNOTATION) == e.evidence_reference(node)

            await eventually_async(pointed, limit=30)

            # The preservation ends: the evidence gets its expiry, then goes.
            await client.CustomObjectsApi(api).patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                "machines",
                "m",
                {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "false"}}},
                _content_type=MERGE,
            )

            async def expiring() -> bool:
                found = await stored(api, node)
                return found is None or v.EVIDENCE_EXPIRES_KEY in found["metadata"].get("annotations", {})

            await eventually_async(expiring, limit=30)
            ended = dt.datetime.now(dt.UTC)

            async def gone() -> bool:
                return await stored(api, node) is None

            await eventually_async(gone, limit=30)
            assert dt.datetime.now(dt.UTC) - ended >= dt.timedelta(seconds=1), "kept for (most of) the grace"
            assert (await core.read_namespaced_config_map(foreign, v.EVIDENCE_NAMESPACE)).metadata.name == foreign
    finally:
        await core.delete_namespaced_config_map(foreign, v.EVIDENCE_NAMESPACE)
        await delete_evidence(api, node)


@dataclass
class MeddledKeeper(EvidenceKeeper):
    """An evidence keeper before whose first pointer write someone else writes the Node (a kubelet, MCM)."""

    meddle: Callable[[], Awaitable[None]] | None = None

    async def annotate(self, key: str, node: Node, *, version: str) -> str | None:
        if self.meddle is not None:
            meddle, self.meddle = self.meddle, None
            await meddle()
        return await super().annotate(key, node, version=version)


async def test_a_node_changed_under_the_first_pointer_is_pointed_at_by_a_later_reconcile(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    """The drain's reconcile points the Node at its evidence at the version it last wrote; when the Node changed
    meanwhile that write is refused, and the reconcile comes back soon and points it then (it did not, before: the
    walkthrough's Node stayed without its pointer under a busy machine)."""
    core = client.CoreV1Api(api)
    node = await new_node(api, node_names, ready=False)
    await failed_machine(api, namespace, node)
    key = f"{namespace}/m"

    async def meddle() -> None:
        await core.patch_node(node, {"metadata": {"annotations": {"meddled": "yes"}}})

    product = await new_api_client(
        kubeconfig=await chart_identity(control_plane.kubeconfig, namespace, leader_election=False)
    )
    caches = new_caches(control=product, target=product, namespace=namespace, resync_period=600)
    tasks = [asyncio.create_task(informer.run()) for informer in caches.owned]
    node_pods = NodePods(target=product)
    recorder = EventRecorder(control=product, target=product, machine_namespace=namespace, instance="test")
    keeper = MeddledKeeper(target=product, recorder=recorder, meddle=meddle)
    reconciler = machine_reconciler(product, namespace, caches=caches, node_pods=node_pods, evidence=keeper)
    try:
        async with asyncio.timeout(30):
            await asyncio.gather(*(informer.wait_synced() for informer in caches.all))
        requeues = []
        for _ in range(10):  # the preservation's writes, its drain and outcome, a few reconciles apart
            requeues.append(await reconciler.reconcile(key))
            if keeper.meddle is None:
                break
            await asyncio.sleep(0.2)
        assert keeper.meddle is None, "the drain's reconcile wrote the pointer"
        assert requeues[-1] is not None
        assert requeues[-1] <= POINTER_RETRY, "back soon: the pointer is owed"
        found = await read_node_model(core, node)
        assert v.PRESERVED_EVIDENCE_ANNOTATION not in found.metadata.annotations, "refused: the Node changed"
        assert found.metadata.annotations.get("meddled") == "yes"

        async def pointed() -> bool:  # once the cache has the Node as it is now, a reconcile points it
            await reconciler.reconcile(key)
            found = await read_node_model(core, node)
            return found.metadata.annotations.get(v.PRESERVED_EVIDENCE_ANNOTATION) == e.evidence_reference(node)

        await eventually_async(pointed, limit=30)
        assert not keeper.unpointed(key)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await node_pods.stop()
        await product.close()
        await delete_evidence(api, node)


async def test_the_evidence_stays_bounded_whatever_the_pods_hold(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node = await new_node(api, node_names, ready=False)
    containers = [{"name": f"c{i:02d}-{'x' * 50}", "image": "registry.invalid/none"} for i in range(20)]
    reason = "R" * 300  # cut at 128 characters
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 7,
            "state": {"waiting": {"reason": reason}},
            "lastState": {"terminated": {"reason": reason, "exitCode": 137}},
        }
        for c in containers
    ]
    pods = 60
    for index in range(pods):
        name = f"big-{index:03d}"
        await core.create_namespaced_pod(
            namespace,
            {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": containers}},  # type: ignore[arg-type]
        )
        await core.patch_namespaced_pod_status(
            name, namespace, {"status": {"phase": "Running", "containerStatuses": statuses}}
        )
    await failed_machine(api, namespace, node)
    try:
        async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
            await eventually_async(lambda: stored(api, node), limit=30)
            config_map = await stored(api, node)
            assert config_map is not None
            data = config_map["data"][v.EVIDENCE_DATA_KEY]
            assert len(data.encode()) <= v.EVIDENCE_MAX_BYTES
            evidence = e.Evidence.model_validate_json(data)
            assert evidence.truncated.to_fit_size
            assert len(evidence.pods) + evidence.truncated.pods == pods
            assert evidence.truncated.strings >= len(evidence.pods) * 20 * 2
            kept = evidence.pods[0].containers[0]
            assert (kept.restart_count, kept.state, kept.last_termination_exit_code) == (7, "waiting", 137)
            assert kept.state_reason == "R" * e.WORD_LIMIT
    finally:
        await delete_evidence(api, node)


async def test_evidence_the_controller_may_not_write_is_told_and_the_preservation_goes_on(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    # The chart's identity without its right to the evidence ConfigMaps (running_controller keeps the RBAC there).
    await chart_identity(control_plane.kubeconfig, namespace, leader_election=False)
    rbac = client.RbacAuthorizationV1Api(api)
    listed = await rbac.list_namespaced_role_binding(v.EVIDENCE_NAMESPACE)
    evidence_bindings = [b.metadata.name for b in listed.items if b.metadata.name.endswith(f"-evidence.{namespace}")]
    assert evidence_bindings
    for name in evidence_bindings:
        await rbac.delete_namespaced_role_binding(name, v.EVIDENCE_NAMESPACE)
    node = await new_node(api, node_names, ready=False)
    await failed_machine(api, namespace, node)

    async def told() -> bool:
        return any(
            event.reason == v.EventReason.EVIDENCE_NOT_RECORDED and event.type == "Warning"
            for event in await events_about(api, namespace, "Node", node)
        )

    async def preserved() -> bool:
        found = await read_node_model(client.CoreV1Api(api), node)
        condition = found.preserved_condition
        return (
            is_preserved(await machine_model(api, namespace, "m"))
            and condition is not None
            and condition.status == "True"
            and found.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        )

    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
        await eventually_async(told, limit=30)
        await eventually_async(preserved, limit=30)
    assert await stored(api, node) is None
    assert (
        v.PRESERVED_EVIDENCE_ANNOTATION not in (await read_node_model(client.CoreV1Api(api), node)).metadata.annotations
    )


async def test_mcms_own_preservation_of_a_failed_machine_is_captured_as_soon_as_seen(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    node = await new_node(api, node_names, ready=False)
    await failed_machine(api, namespace, node)
    try:
        async with running_controller(
            kubeconfig=control_plane.kubeconfig,
            namespace=namespace,
            native_preservation=NativePreservationMode.TRUE,
            resync_period=0.5,
        ):
            assert await stored(api, node) is None, "not preserved by MCM yet"
            expiry = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)).replace(microsecond=0)
            await custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                "machines",
                "m",
                {"status": {"currentStatus": {"preserveExpiryTime": format_timestamp(expiry)}}},
                _content_type=MERGE,
            )
            await eventually_async(lambda: stored(api, node), limit=30)
            config_map = await stored(api, node)
            assert config_map is not None
            evidence = e.Evidence.model_validate_json(config_map["data"][v.EVIDENCE_DATA_KEY])
            assert (evidence.node, evidence.machine.phase) == (node, "Failed")
            assert evidence.machine.last_operation.type == "HealthCheck"
    finally:
        await delete_evidence(api, node)
