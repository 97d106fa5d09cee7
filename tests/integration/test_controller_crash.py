"""Crash safety: the controller dies right after its n-th API write of a preserve sequence, and of each way
a preservation ends (the node's value removed, the expiry reached, the auto value released); a fresh
controller started afterwards converges to the same final state, with nothing lost and nothing left behind.
The "crash" is raised inside the HTTP client's request-end hook, after the apiserver answered the write, and
takes the whole controller down with no clean-up of its own."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import types
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client

from machine_preservation.controller.machinery.metrics import WRITE_VERBS, Metrics, request_verb_and_resource
from machine_preservation.controller.preservation.runtime import RuntimeOptions
from machine_preservation.controller.standalone import Controller, ControllerOptions
from machine_preservation.core import vocabulary as v
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import chart_identity
from tests.controller.support import (
    GROUP,
    VERSION,
    create_machine,
    format_timestamp,
    get_machine,
    is_preserved,
    is_unpreserved,
    machine_model,
    machine_set_owner,
    new_node,
    read_node_model,
)
from tests.polling import eventually_async

# Writes of an uninterrupted run: preserve (the record with the machine's annotations, Events, the record's
# announcement done, the mirrored expiry, the node's annotations with its taint (one write), condition "being
# drained", eviction, condition, the node's drain fields, the drain record, Events) and stop (machine annotations,
# node annotations with the taint, condition, mirrored expiry, record, Events).
PRESERVE_WRITES = range(1, 14)
STOP_WRITES = range(1, 8)
# Expiry of a Failed machine: node annotations with the taint, condition, delete (with its record), Events (machine,
# node).
EXPIRY_WRITES = range(1, 6)
# Lowering the max to 0: the MachineSet releases (annotation, event, status), then the machine stops (as
# STOP_WRITES), then the MachineSet's status follows.
RELEASE_WRITES = range(1, 12)


class Crash(BaseException):
    """Not an Exception: nothing in the controller catches it, as nothing survives a SIGKILL."""


class CrashAfterWrites(Metrics):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.writes = 0
        self.crashed = asyncio.Event()

    def trace_config(self, *, cluster: str) -> aiohttp.TraceConfig:
        trace = super().trace_config(cluster=cluster)

        async def on_end(
            _session: aiohttp.ClientSession, _context: types.SimpleNamespace, params: aiohttp.TraceRequestEndParams
        ) -> None:
            verb, _ = request_verb_and_resource(params.method, params.url.path, params.url.query_string)
            if verb in WRITE_VERBS and params.response.status < 400 and not self.crashed.is_set():
                self.writes += 1
                if self.writes == self.after:
                    self.crashed.set()
                    raise Crash

        trace.on_request_end.append(on_end)
        return trace


async def failed_machine_with_workload(
    api: client.ApiClient, namespace: str, node_names: list[str], *, node_annotations: dict[str, str], **machine: Any
) -> str:
    """A Failed Machine "m" on a NotReady Node carrying a pod to evict; returns the Node's name."""
    name = await new_node(api, node_names, ready=False, annotations=node_annotations)
    await client.CoreV1Api(api).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "workload"},
            "spec": {
                "nodeName": name,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "registry.invalid/none"}],
            },
        },
    )
    await create_machine(client.CustomObjectsApi(api), namespace, "m", node=name, phase="Failed", **machine)
    return name


@pytest.fixture
async def node(api: client.ApiClient, namespace: str, node_names: list[str]) -> str:
    """Preserved by the node's `now`."""
    return await failed_machine_with_workload(
        api, namespace, node_names, node_annotations={v.PRESERVE_ANNOTATION: "now"}
    )


@pytest.fixture
async def auto_node(api: client.ApiClient, namespace: str, node_names: list[str]) -> str:
    """Auto-preserved by its MachineSet (autoPreserveFailedMachineMax 1)."""
    owner = await machine_set_owner(api, namespace, replicas=1, autoPreserveFailedMachineMax=1)
    return await failed_machine_with_workload(api, namespace, node_names, node_annotations={}, owner=owner)


async def run_controller(
    control_plane: ControlPlane, namespace: str, metrics: Metrics, *, until: Any
) -> asyncio.Task[int]:
    identity = await chart_identity(control_plane.kubeconfig, namespace, leader_election=False)
    controller = Controller(
        options=ControllerOptions(
            namespace=namespace,
            control_kubeconfig=identity,
            target_kubeconfig=identity,
            leader_elect=False,
            metrics_port=0,
            runtime=RuntimeOptions(native_preservation=NativePreservationMode.FALSE),
        ),
        metrics=metrics,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        await eventually_async(until, limit=60)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return task


async def crash_then_converge(control_plane: ControlPlane, namespace: str, crash_after: int, *, until: Any) -> None:
    """A controller that crashes right after its `crash_after`-th write, then a fresh one until `until`."""
    crashing = CrashAfterWrites(crash_after)
    await run_controller(control_plane, namespace, crashing, until=lambda: crashing.crashed.is_set())
    await run_controller(control_plane, namespace, Metrics(), until=until)


async def state(api: client.ApiClient, namespace: str, node: str) -> tuple[Machine, Node]:
    machine = Machine.model_validate(await get_machine(client.CustomObjectsApi(api), namespace, "m"))
    return machine, await read_node_model(client.CoreV1Api(api), node)


async def fully_preserved(api: client.ApiClient, namespace: str, node: str, *, auto: bool = False) -> bool:
    machine, n = await state(api, namespace, node)
    condition = n.preserved_condition
    ca = {v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true", v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION: "true"}
    # Auto-preserved: ceiling 3 + 1, the value on the machine; by the node's `now`: 3 + 2, synced from the node.
    value = {v.PRESERVE_ANNOTATION: "auto-preserve"} if auto else {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now"}
    priority = {v.MACHINE_PRIORITY_ANNOTATION: "4" if auto else "5", v.LAST_MACHINE_PRIORITY_ANNOTATION: ""}
    annotations = machine.metadata.annotations
    record = machine.preservation
    return (
        is_preserved(machine)
        and record is not None
        and record.by == (v.PreservedBy.AUTO if auto else v.PreservedBy.USER)
        and record.added_ca_annotation
        and not record.announcement_pending
        and record.drain is not None
        and record.drain.outcome == v.DrainOutcome.DRAINED
        and {k: annotations[k] for k in annotations if k not in v.PRESERVATION_RECORD_ANNOTATIONS}
        == {**value, **priority}
        and {k: text for k, text in n.metadata.annotations.items() if k != v.PRESERVED_EVIDENCE_ANNOTATION}
        == {**(ca if auto else {v.PRESERVE_ANNOTATION: "now", **ca}), **node_fields(record)}
        and [t.key for t in n.spec.taints if t.key == v.PRESERVED_TAINT_KEY] == [v.PRESERVED_TAINT_KEY]
        and condition is not None
        and (condition.status, condition.reason) == ("True", "Preserved by MCM." if auto else "Preserved by user.")
        and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
    )


def node_fields(record: PreservationRecord) -> dict[str, str]:
    """The Node's fields of a drained preservation (the evidence's name aside: its writer's business)."""
    return {
        v.PRESERVED_SINCE_ANNOTATION: format_timestamp(record.since),
        v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(record.until),
        v.PRESERVED_BY_ANNOTATION: record.by.value,
        v.PRESERVED_DRAIN_ANNOTATION: "drained",
    }


def node_cleaned(n: Node, *, annotations: dict[str, str]) -> bool:
    """No taint, no CA annotation or marker, the condition says stopped."""
    condition = n.preserved_condition
    return (
        n.metadata.annotations == annotations
        and not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        and condition is not None
        and (condition.status, condition.reason, condition.message) == ("False", "Preservation stopped.", "")
    )


async def fully_stopped(api: client.ApiClient, namespace: str, node: str) -> bool:
    machine, n = await state(api, namespace, node)
    return (
        is_unpreserved(machine)
        and machine.phase == "Failed"
        and v.PRESERVE_ANNOTATION not in machine.metadata.annotations
        and v.MACHINE_PRIORITY_ANNOTATION not in machine.metadata.annotations
        and v.LAST_MACHINE_PRIORITY_ANNOTATION not in machine.metadata.annotations
        and machine.metadata.annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "") == ""
        and node_cleaned(n, annotations={})
    )


async def expired_and_deleted(api: client.ApiClient, namespace: str, node: str) -> bool:
    """The Failed machine is deleted at its expiry; its node is cleaned up first (the node's own `now` stays:
    the node goes with the machine)."""
    gone = await machine_model(api, namespace, "m") is None
    return gone and node_cleaned(
        await read_node_model(client.CoreV1Api(api), node), annotations={v.PRESERVE_ANNOTATION: "now"}
    )


async def released(api: client.ApiClient, namespace: str, node: str) -> bool:
    status = (
        await client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    ).get("status", {})
    counters = (status.get("autoPreserveFailedMachineCount"), status.get("preservedFailedReplicas"))
    return counters == (0, 0) and await fully_stopped(api, namespace, node)


async def started_events(api: client.ApiClient, namespace: str, node: str) -> list[tuple[str, int]]:
    """The PreservationStarted Events of the Machine (in its namespace) and of the Node (in `default`): kind and
    count of each."""
    core = client.CoreV1Api(api)
    events = [
        *(await core.list_namespaced_event(namespace)).items,
        *(await core.list_namespaced_event("default")).items,
    ]
    return sorted(
        (e.involved_object.kind, e.count)
        for e in events
        if e.reason == "PreservationStarted" and e.involved_object.name in ("m", node)
    )


@pytest.mark.parametrize("crash_after", PRESERVE_WRITES)
async def test_preserve_converges_after_a_crash_after_any_write(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node: str, crash_after: int
) -> None:
    await crash_then_converge(
        control_plane, namespace, crash_after, until=lambda: fully_preserved(api, namespace, node)
    )
    # Exactly once per object: a crash between the record and its Events leaves the announcement pending in
    # the record, so the restart announces it; one after the Events finds them named after the same start.
    assert await started_events(api, namespace, node) == [("Machine", 1), ("Node", 1)]
    pod = await client.CoreV1Api(api).read_namespaced_pod("workload", namespace)
    assert pod.metadata is not None
    assert pod.metadata.deletion_timestamp is not None


@pytest.mark.parametrize("crash_after", STOP_WRITES)
async def test_stop_converges_after_a_crash_after_any_write(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node: str, crash_after: int
) -> None:
    await run_controller(control_plane, namespace, Metrics(), until=lambda: fully_preserved(api, namespace, node))
    await client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: None}}})
    await crash_then_converge(control_plane, namespace, crash_after, until=lambda: fully_stopped(api, namespace, node))


@pytest.mark.parametrize("crash_after", EXPIRY_WRITES)
async def test_expiry_converges_after_a_crash_after_any_write(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node: str, crash_after: int
) -> None:
    await run_controller(control_plane, namespace, Metrics(), until=lambda: fully_preserved(api, namespace, node))
    # Time passes: the expiry is now behind us (as if the controller had been down over it).
    # The record's `until` is moved into the past, the one change the controller reads (the status only mirrors it).
    past = format_timestamp(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machines",
        "m",
        {"metadata": {"annotations": {v.PRESERVED_UNTIL_ANNOTATION: past}}},
        _content_type="application/merge-patch+json",
    )
    await crash_then_converge(
        control_plane, namespace, crash_after, until=lambda: expired_and_deleted(api, namespace, node)
    )


@pytest.mark.parametrize("crash_after", RELEASE_WRITES)
async def test_auto_release_converges_after_a_crash_after_any_write(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, auto_node: str, crash_after: int
) -> None:
    await run_controller(
        control_plane, namespace, Metrics(), until=lambda: fully_preserved(api, namespace, auto_node, auto=True)
    )
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machinesets",
        "ms",
        {"spec": {"autoPreserveFailedMachineMax": 0}},
        _content_type="application/merge-patch+json",
    )
    await crash_then_converge(control_plane, namespace, crash_after, until=lambda: released(api, namespace, auto_node))
