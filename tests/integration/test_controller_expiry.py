"""The end of a preservation, on the real control plane, where it used to go wrong.

- The stop's delete of an expired Failed machine gets 409 (a second writer changed the machine between the
  plan and the delete): the next reconcile finishes the stop; it never starts a new preservation (the bug this
  state model fixes: with the expiry in status, pruned or dropped under MCM v0.61, the next look found no
  expiry and preserved the machine again).
- An expiry written far in the future by someone else, in the record or in status, does not extend the
  preservation: it ends at its start + the maximum timeout."""

from __future__ import annotations

import datetime as dt
import types
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from kubernetes.aio import client

from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import go_time_string
from machine_preservation.core.config import PreservationConfig
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    aio_client,
    create_machine,
    events_about,
    is_preserved,
    machine_model,
    new_node,
    read_node_model,
)
from tests.polling import eventually_async

MERGE = "application/merge-patch+json"
P = v.PRESERVE_ANNOTATION
FAR_FUTURE = "2099-01-01T00:00:00Z"


class SecondWriterBeforeDelete(Metrics):
    """Right before the controller's first DELETE of Machine `name` goes out, another writer changes that
    Machine (a label), so the delete's resourceVersion precondition fails with 409. Records the status of
    every DELETE of it."""

    def __init__(self, *, namespace: str, name: str, writer: client.ApiClient) -> None:
        super().__init__()
        self.path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/machines/{name}"
        self.namespace, self.name, self.writer = namespace, name, writer
        self.delete_statuses: list[int] = []

    def trace_config(self, *, cluster: str) -> aiohttp.TraceConfig:
        trace = super().trace_config(cluster=cluster)

        async def on_start(
            _session: aiohttp.ClientSession, _context: types.SimpleNamespace, params: aiohttp.TraceRequestStartParams
        ) -> None:
            if params.method == "DELETE" and params.url.path == self.path and not self.delete_statuses:
                await client.CustomObjectsApi(self.writer).patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    "machines",
                    self.name,
                    {"metadata": {"labels": {"second-writer": "was-here"}}},
                    _content_type=MERGE,
                )

        async def on_end(
            _session: aiohttp.ClientSession, _context: types.SimpleNamespace, params: aiohttp.TraceRequestEndParams
        ) -> None:
            if params.method == "DELETE" and params.url.path == self.path:
                self.delete_statuses.append(params.response.status)

        trace.on_request_start.append(on_start)
        trace.on_request_end.append(on_end)
        return trace


async def preservation_events(api: client.ApiClient, namespace: str, kind: str, name: str) -> list[tuple[str, int]]:
    """(reason, count) of the Preservation* Events about one Machine or Node, sorted."""
    events = await events_about(api, namespace, kind, name)
    return sorted((e.reason or "", e.count or 1) for e in events if (e.reason or "").startswith("Preservation"))


async def test_a_conflict_on_the_stops_delete_is_finished_by_the_next_reconcile_never_preserved_again(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    node_names: list[str],
    kubeconfig_for: Callable[..., Path],
) -> None:
    node_name = await new_node(api, node_names, ready=False)
    await create_machine(
        client.CustomObjectsApi(api),
        namespace,
        "m",
        node=node_name,
        phase="Failed",
        annotations={P: "now"},
        spec={"machinePreserveTimeout": "6s"},
    )
    writer = await aio_client(kubeconfig_for("second-writer", ("system:masters",)))
    metrics = SecondWriterBeforeDelete(namespace=namespace, name="m", writer=writer)
    try:
        async with running_controller(
            kubeconfig=control_plane.kubeconfig, namespace=namespace, metrics=metrics, resync_period=0.5
        ):

            async def drained() -> bool:
                machine = await machine_model(api, namespace, "m")
                record = machine.preservation if machine is not None else None
                return record is not None and record.drain is not None and record.drain.outcome == "drained"

            await eventually_async(drained)
            machine = await machine_model(api, namespace, "m")
            assert machine is not None
            record = machine.preservation
            assert record is not None

            await eventually_async(lambda: _gone(api, namespace), limit=60)
            # The API server may have answered the last DELETE before its answer reached the trace.
            await eventually_async(lambda: len(metrics.delete_statuses) > 1, limit=10)
            assert metrics.delete_statuses[0] == 409, "the second writer made the first delete conflict"
            assert metrics.delete_statuses[-1] in (200, 202), metrics.delete_statuses

            expired = (
                f"Preservation expired at {go_time_string(record.until)}; the preserve annotation is removed so "
                "the machine is not preserved again. The Failed machine is deleted."
            )

            async def stop_reported() -> bool:
                events = await events_about(api, namespace, "Machine", "m")
                return any(e.message == expired for e in events)

            await eventually_async(stop_reported)
    finally:
        await writer.close()
    for kind, name in (("Machine", "m"), ("Node", node_name)):
        assert await preservation_events(api, namespace, kind, name) == [
            ("PreservationExpired", 1),
            ("PreservationStarted", 1),
        ], kind
    node = await read_node_model(client.CoreV1Api(api), node_name)
    condition = node.preserved_condition
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "Preservation stopped.")
    assert not node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
    assert v.CA_SCALE_DOWN_DISABLED_ANNOTATION not in node.metadata.annotations


async def _gone(api: client.ApiClient, namespace: str) -> bool:
    return await machine_model(api, namespace, "m") is None


@pytest.mark.parametrize("where", ["record", "status"])
async def test_an_expiry_written_far_in_the_future_by_someone_else_ends_at_the_cap(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    node_names: list[str],
    kubeconfig_for: Callable[..., Path],
    where: str,
) -> None:
    max_timeout = dt.timedelta(seconds=10)
    node_name = await new_node(api, node_names, ready=True)
    # The machine asks for a day; the maximum grants 10 s.
    await create_machine(
        client.CustomObjectsApi(api),
        namespace,
        "m",
        node=node_name,
        annotations={P: "now"},
        spec={"machinePreserveTimeout": "24h"},
    )
    someone = await aio_client(kubeconfig_for("someone-else", ("system:masters",)))
    try:
        async with running_controller(
            kubeconfig=control_plane.kubeconfig,
            namespace=namespace,
            resync_period=0.5,
            preservation=PreservationConfig(max_preserve_timeout=max_timeout),
        ):
            await eventually_async(lambda: _preserved(api, namespace, max_timeout))
            machine = await machine_model(api, namespace, "m")
            assert machine is not None
            record = machine.preservation
            assert record is not None
            cap = record.since + max_timeout
            assert record.until == cap

            custom = client.CustomObjectsApi(someone)
            if where == "record":
                body = {"metadata": {"annotations": {v.PRESERVED_UNTIL_ANNOTATION: FAR_FUTURE}}}
                await custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "machines", "m", body, _content_type=MERGE
                )
            else:
                body = {"status": {"currentStatus": {"preserveExpiryTime": FAR_FUTURE}}}
                await custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, "machines", "m", body, _content_type=MERGE
                )

                async def mirror_restored() -> bool:
                    machine = await machine_model(api, namespace, "m")
                    return machine is not None and machine.mirrored_expiry == cap

                # Status is only a mirror: never read back, and written again from the record.
                await eventually_async(mirror_restored)

            async def stopped() -> bool:
                machine = await machine_model(api, namespace, "m")
                return machine is not None and machine.preservation is None and machine.mirrored_expiry is None

            await eventually_async(stopped, limit=60)
            machine = await machine_model(api, namespace, "m")
            assert machine is not None
            assert P not in machine.metadata.annotations, "ended as an expiry: the preserve annotation goes"
    finally:
        await someone.close()
    expired = f"Preservation expired at {go_time_string(cap)}; "
    for kind, name in (("Machine", "m"), ("Node", node_name)):
        events = await events_about(api, namespace, kind, name)
        [message] = [e.message or "" for e in events if e.reason == "PreservationExpired"]
        assert message.startswith(expired), message
        assert await preservation_events(api, namespace, kind, name) == [
            ("PreservationExpired", 1),
            ("PreservationStarted", 1),
        ], kind


async def _preserved(api: client.ApiClient, namespace: str, max_timeout: dt.timedelta) -> bool:
    return is_preserved(await machine_model(api, namespace, "m"), max_timeout=max_timeout)
