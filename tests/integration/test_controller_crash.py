"""Crash safety: the controller dies right after its n-th API write of a preserve (and of a stop)
sequence; a fresh controller started afterwards converges to the same final state, with nothing lost
and nothing left behind. The "crash" is raised inside the HTTP client's request-end hook, after the
apiserver answered the write, and takes the whole controller down with no clean-up of its own."""

from __future__ import annotations

import asyncio
import contextlib
import types
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.cluster.controlplane import ControlPlane
from machine_preservation.controller.manager import Controller, ControllerOptions
from machine_preservation.controller.metrics import WRITE_VERBS, Metrics, request_verb_and_resource
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node
from tests.controller.support import aio_client, create_machine, create_node, eventually, get_machine, read_node_model

# Writes of an uninterrupted run: preserve (expiry, events, machine and node annotations, taint, eviction,
# condition, events) and stop (machine and node annotations, condition, taint, expiry, events).
PRESERVE_WRITES = range(1, 11)
STOP_WRITES = range(1, 8)


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


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api_client = await aio_client(control_plane.kubeconfig)
    yield api_client
    await api_client.close()


@pytest.fixture
async def node(api: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    name = f"n-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await create_node(core, name, ready=False, annotations={v.PRESERVE_ANNOTATION: "now"})
    await core.create_namespaced_pod(
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
    await create_machine(client.CustomObjectsApi(api), namespace, "m", node=name, phase="Failed")
    yield name
    with contextlib.suppress(ApiException):
        await core.delete_node(name)


async def run_controller(
    control_plane: ControlPlane, namespace: str, metrics: Metrics, *, until: Any
) -> asyncio.Task[int]:
    controller = Controller(
        options=ControllerOptions(
            namespace=namespace,
            control_kubeconfig=control_plane.kubeconfig,
            target_kubeconfig=control_plane.kubeconfig,
            leader_elect=False,
            metrics_port=0,
        ),
        metrics=metrics,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        await eventually(until, limit=60)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return task


async def state(api: client.ApiClient, namespace: str, node: str) -> tuple[Machine, Node]:
    machine = Machine.model_validate(await get_machine(client.CustomObjectsApi(api), namespace, "m"))
    return machine, await read_node_model(client.CoreV1Api(api), node)


async def fully_preserved(api: client.ApiClient, namespace: str, node: str) -> bool:
    machine, n = await state(api, namespace, node)
    condition = n.preserved_condition
    return (
        machine.preserve_expiry_time is not None
        and machine.metadata.annotations
        == {
            v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now",
            v.MACHINE_PRIORITY_ANNOTATION: "5",
            v.LAST_MACHINE_PRIORITY_ANNOTATION: "",
        }
        and n.metadata.annotations
        == {
            v.PRESERVE_ANNOTATION: "now",
            v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true",
            v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true",
        }
        and [t.key for t in n.spec.taints if t.key == v.PRESERVED_TAINT_KEY] == [v.PRESERVED_TAINT_KEY]
        and condition is not None
        and (condition.status, condition.reason) == ("True", "Preserved by user.")
        and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
    )


async def fully_stopped(api: client.ApiClient, namespace: str, node: str) -> bool:
    machine, n = await state(api, namespace, node)
    condition = n.preserved_condition
    return (
        machine.preserve_expiry_time is None
        and machine.phase == "Failed"
        and v.MACHINE_PRIORITY_ANNOTATION not in machine.metadata.annotations
        and v.LAST_MACHINE_PRIORITY_ANNOTATION not in machine.metadata.annotations
        and machine.metadata.annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION, "") == ""
        and n.metadata.annotations == {}
        and not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        and condition is not None
        and (condition.status, condition.reason, condition.message) == ("False", "Preservation stopped.", "")
    )


async def started_events(api: client.ApiClient, namespace: str) -> list[Any]:
    events = (await client.CoreV1Api(api).list_namespaced_event(namespace)).items
    return [e for e in events if e.reason == "PreservationStarted"]


@pytest.mark.parametrize("crash_after", PRESERVE_WRITES)
async def test_preserve_converges_after_a_crash_after_any_write(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node: str, crash_after: int
) -> None:
    crashing = CrashAfterWrites(crash_after)
    await run_controller(control_plane, namespace, crashing, until=lambda: crashing.crashed.is_set())
    await run_controller(control_plane, namespace, Metrics(), until=lambda: fully_preserved(api, namespace, node))
    started = await started_events(api, namespace)
    # At most once: the restart never starts a second preservation. (The core orders the start Event
    # after the expiry write, so a crash right after the expiry loses that Event - reported to the core.)
    assert len(started) <= 1
    assert started or crash_after == 1
    pod = await client.CoreV1Api(api).read_namespaced_pod("workload", namespace)
    assert pod.metadata is not None
    assert pod.metadata.deletion_timestamp is not None


@pytest.mark.parametrize("crash_after", STOP_WRITES)
async def test_stop_converges_after_a_crash_after_any_write(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node: str, crash_after: int
) -> None:
    await run_controller(control_plane, namespace, Metrics(), until=lambda: fully_preserved(api, namespace, node))
    await client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: None}}})
    crashing = CrashAfterWrites(crash_after)
    await run_controller(control_plane, namespace, crashing, until=lambda: crashing.crashed.is_set())
    await run_controller(control_plane, namespace, Metrics(), until=lambda: fully_stopped(api, namespace, node))
