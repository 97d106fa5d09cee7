"""Lifecycle behaviours of issue 4 through the whole controller on the real control plane: recovery of
a preserved Failed machine (per value), lowering a MachineSet's auto-preservation max, and the Warning
Event for an invalid value."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.mcm_pool import set_node_condition
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_custom,
    create_machine,
    get_machine,
    is_preserved,
    is_unpreserved,
    new_node,
    owner_reference,
    read_node_model,
)
from tests.polling import eventually_async

MERGE = "application/merge-patch+json"


async def snapshot(api: client.ApiClient, namespace: str, machine: str, node: str) -> tuple[Machine, Node]:
    return (
        Machine.model_validate(await get_machine(client.CustomObjectsApi(api), namespace, machine)),
        await read_node_model(client.CoreV1Api(api), node),
    )


async def drained(api: client.ApiClient, namespace: str, node: str) -> bool:
    machine, n = await snapshot(api, namespace, "m", node)
    condition = n.preserved_condition
    record = machine.preservation
    return (
        is_preserved(machine)
        and record is not None
        and record.drain is not None
        and record.drain.outcome == v.DrainOutcome.DRAINED
        and condition is not None
        and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
        and n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
    )


@pytest.mark.parametrize(("value", "still_preserved"), [("now", True), ("when-failed", False)])
async def test_recovery_of_a_preserved_failed_machine(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    node_names: list[str],
    value: str,
    still_preserved: bool,
) -> None:
    node = await new_node(api, node_names, ready=False)
    await create_machine(
        client.CustomObjectsApi(api),
        namespace,
        "m",
        node=node,
        phase="Failed",
        annotations={v.PRESERVE_ANNOTATION: value},
    )
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
        await eventually_async(lambda: drained(api, namespace, node))
        # The node is healthy again and no MCM moves the phase back to Running: the controller does.
        await set_node_condition(api, node, "True")

        async def recovered() -> bool:
            machine, n = await snapshot(api, namespace, "m", node)
            return machine.phase == "Running" and not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)

        await eventually_async(recovered)

        async def settled() -> bool:
            machine, n = await snapshot(api, namespace, "m", node)
            condition = n.preserved_condition
            assert condition is not None
            if still_preserved:
                record = machine.preservation
                return (
                    is_preserved(machine)
                    and record is not None
                    and record.drain is None  # the drain record belongs to the failure that is over
                    and condition.message.startswith(v.PRESERVED_UNTIL_MESSAGE_PREFIX)
                )
            return is_unpreserved(machine) and condition.reason == "Preservation stopped."

        await eventually_async(settled)
        machine, n = await snapshot(api, namespace, "m", node)
        assert machine.metadata.annotations.get(v.PRESERVE_ANNOTATION) == value, "recovery keeps the user's value"
        assert (v.CA_SCALE_DOWN_DISABLED_ANNOTATION in n.metadata.annotations) is still_preserved
        assert n.spec.unschedulable is False
        reasons = {e.reason for e in (await client.CoreV1Api(api).list_namespaced_event(namespace)).items}
        assert "PreservedMachineRecovered" in reasons


async def test_lowering_the_max_releases_auto_preserved_machines(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    deployment = await create_custom(api, namespace, "MachineDeployment", "md")
    machine_set = await create_custom(
        api,
        namespace,
        "MachineSet",
        "ms",
        spec={"replicas": 3, "autoPreserveFailedMachineMax": 2},
        owner=owner_reference("MachineDeployment", deployment),
    )
    for name in ("a", "b", "c"):
        node = await new_node(api, node_names, ready=False)
        await create_machine(
            custom, namespace, name, node=node, phase="Failed", owner=owner_reference("MachineSet", machine_set)
        )
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
        await eventually_async(lambda: _auto_preserved(custom, namespace, count=2))
        await eventually_async(lambda: _deployment_counter(custom, namespace, 2))
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "machinesets",
            "ms",
            {"spec": {"autoPreserveFailedMachineMax": 1}},
            _content_type=MERGE,
        )
        await eventually_async(lambda: _auto_preserved(custom, namespace, count=1))
        await eventually_async(lambda: _deployment_counter(custom, namespace, 1))
        current = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
        assert isinstance(current, dict)
        assert current["status"]["autoPreserveFailedMachineCount"] == 1


async def test_an_invalid_value_is_reported_once_with_a_warning(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    await create_machine(client.CustomObjectsApi(api), namespace, "m", annotations={v.PRESERVE_ANNOTATION: "forever"})
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:

        async def warned() -> list[Any]:
            events = (await client.CoreV1Api(api).list_namespaced_event(namespace)).items
            return [e for e in events if e.reason == "InvalidPreserveValue"]

        found = await eventually_async(warned)
        assert found[0].type == "Warning"
        assert "forever" in (found[0].message or "")
        machine = Machine.model_validate(await get_machine(client.CustomObjectsApi(api), namespace, "m"))
        assert is_unpreserved(machine), "an invalid value is treated as absent"
        assert machine.metadata.annotations[v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION] == '[["Machine","forever"]]'
        caches = running.controller.caches
        assert caches is not None
        resyncs = caches.machines.stats.resyncs
        await eventually_async(lambda: caches.machines.stats.resyncs >= resyncs + 3)
        again = await warned()
        assert [(e.count or 1) for e in again] == [1], "resyncs do not report it again"


async def _auto_preserved(custom: client.CustomObjectsApi, namespace: str, *, count: int) -> bool:
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "machines")
    assert isinstance(listed, dict)
    machines = [Machine.model_validate(m) for m in listed["items"]]
    auto = [m for m in machines if m.metadata.annotations.get(v.PRESERVE_ANNOTATION) == "auto-preserve"]
    preserved = [m for m in machines if is_preserved(m)]
    by_auto = [m for m in preserved if m.preservation is not None and m.preservation.by == v.PreservedBy.AUTO]
    return len(auto) == count and len(preserved) == count and len(by_auto) == count


async def _deployment_counter(custom: client.CustomObjectsApi, namespace: str, expected: int) -> bool:
    current = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinedeployments", "md")
    assert isinstance(current, dict)
    return (current.get("status") or {}).get("preservedFailedReplicas") == expected
