"""With an MCM that preserves machines itself (`--mcm-native-preservation=true`), on the real control plane:
the controller writes nothing on machines without its record, whatever their values and phases; it hands a
preservation it started (its record) over to MCM, in MCM's terms; it records what MCM does as Events, once."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes.aio import client

from machine_preservation.controller.standalone import Controller
from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import go_time_string
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.core.preservation_record import format_timestamp, start_record
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_machine,
    events_about,
    get_machine,
    machine_model,
    machine_set_owner,
    new_node,
    read_raw,
)
from tests.polling import eventually_async

MERGE = "application/merge-patch+json"
P = v.PRESERVE_ANNOTATION
NATIVE = NativePreservationMode.TRUE
AUTO = v.PreservedBy.AUTO


async def resyncs(controller: Controller, count: int = 3) -> None:
    """Every cached Machine was handed to the reconciler `count` more times."""
    caches = controller.caches
    assert caches is not None
    target = caches.machines.stats.resyncs + count
    await eventually_async(lambda: caches.machines.stats.resyncs >= target)


def versions(objects: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Each object's resourceVersion and managedFields (who wrote which fields)."""
    return {
        name: (body["metadata"]["resourceVersion"], body["metadata"].get("managedFields"))
        for name, body in objects.items()
    }


async def test_machines_without_our_record_get_no_write_at_all(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    owner = await machine_set_owner(api, namespace, "ms", replicas=4, autoPreserveFailedMachineMax=2)
    # Everything that would make the controller act without native MCM: values on machines and nodes, Failed
    # machines in a MachineSet with an auto-preservation budget, a priority, an invalid value.
    cases: dict[str, tuple[str, bool, dict[str, str], dict[str, str]]] = {
        "failed-now": ("Failed", False, {P: "now"}, {}),
        "failed-auto": ("Failed", False, {}, {}),
        "running-node-now": ("Running", True, {}, {P: "now"}),
        "running-invalid": ("Running", True, {P: "forever", v.MACHINE_PRIORITY_ANNOTATION: "2"}, {}),
    }
    nodes = {}
    for name, (phase, ready, values, node_annotations) in cases.items():
        nodes[name] = await new_node(api, node_names, ready=ready, annotations=node_annotations)
        await create_machine(custom, namespace, name, node=nodes[name], phase=phase, owner=owner, annotations=values)

    async def snapshot() -> dict[str, tuple[str, Any]]:
        objects = {f"machine/{n}": await get_machine(custom, namespace, n) for n in cases}
        for name, node in nodes.items():
            objects[f"node/{name}"] = await read_raw(core.read_node_without_preload_content(node))
        objects["machineset/ms"] = await custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "machinesets", "ms"
        )
        return versions(objects)

    before = await snapshot()
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, native_preservation=NATIVE, resync_period=0.5
    ) as running:
        assert running.controller.native
        await resyncs(running.controller)
        writes = running.controller.metrics.api_writes()
        registry = running.controller.metrics.registry
        labels = {"controller": "machines", "result": "success"}
        reconciled = registry.get_sample_value("machine_preservation_reconcile_duration_seconds_count", labels)
        assert reconciled is not None
        assert reconciled >= 2 * len(cases), "each machine was looked at, more than once"
    assert writes == 0, "not one write: MCM owns the lifecycle"
    assert await snapshot() == before
    assert (await core.list_namespaced_event(namespace)).items == [], "nothing happened worth an Event"


async def test_a_preservation_of_ours_is_handed_over_in_mcms_terms(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    node = await new_node(api, node_names, ready=False)
    max_timeout = dt.timedelta(hours=2)
    # Auto-preserved by us before MCM was upgraded; its `until` asks for more than the maximum allows.
    record = start_record(
        now=dt.datetime.now(dt.UTC), timeout=dt.timedelta(hours=10), max_timeout=dt.timedelta(hours=10), by=AUTO
    )
    annotations = {P: "auto-preserve", v.MACHINE_PRIORITY_ANNOTATION: "4", **record.annotations()}
    await create_machine(custom, namespace, "m", node=node, phase="Failed", annotations=annotations)
    capped = record.since + max_timeout
    async with running_controller(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        native_preservation=NATIVE,
        resync_period=0.5,
        preservation=PreservationConfig(max_preserve_timeout=max_timeout),
    ) as running:

        async def handed_over() -> bool:
            machine = await machine_model(api, namespace, "m")
            return machine is not None and machine.preservation is None

        await eventually_async(handed_over)
        machine = await machine_model(api, namespace, "m")
        assert machine is not None
        assert machine.mirrored_expiry == capped, "the expiry where MCM reads it, capped"
        assert machine.metadata.annotations.get(P) == "auto-preserved", "MCM's spelling of the auto value"
        assert not set(v.PRESERVATION_RECORD_ANNOTATIONS) & set(machine.metadata.annotations)
        assert machine.metadata.annotations.get(v.MACHINE_PRIORITY_ANNOTATION) == "4", "nothing else changes"
        await resyncs(running.controller)
        again = await machine_model(api, namespace, "m")
        assert again is not None
        assert again.metadata.resource_version == machine.metadata.resource_version, "handed over once"
    for kind, name in (("Machine", "m"), ("Node", node)):
        events = await events_about(api, namespace, kind, name)
        [handover] = [e for e in events if e.reason == "PreservationHandedOver"]
        assert handover.message == (
            f"Preservation until {go_time_string(capped)} handed over to machine-controller-manager, "
            "which preserves machines itself."
        )
        assert handover.count == 1


async def test_an_expiry_mcm_sets_is_recorded_once_as_a_started_preservation(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    node = await new_node(api, node_names, ready=False)
    await create_machine(custom, namespace, "m", node=node, phase="Failed", annotations={P: "now"})
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, native_preservation=NATIVE, resync_period=0.5
    ) as running:
        await resyncs(running.controller, 2)
        assert await events_about(api, namespace, "Machine", "m") == [], "nothing to observe yet"
        # MCM preserves the machine: its expiry appears in status.
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
        message = f"machine-controller-manager preserves the machine until {go_time_string(expiry)}."

        async def observed() -> list[Any]:
            events = await events_about(api, namespace, "Machine", "m")
            return [e for e in events if e.reason == "PreservationStarted" and e.message == message]

        await eventually_async(observed)
        version = (await get_machine(custom, namespace, "m"))["metadata"]["resourceVersion"]
        await resyncs(running.controller)
    assert (await get_machine(custom, namespace, "m"))["metadata"]["resourceVersion"] == version, "only observed"
    for kind, name in (("Machine", "m"), ("Node", node)):
        events = await events_about(api, namespace, kind, name)
        assert [(e.reason, e.message, e.count) for e in events] == [("PreservationStarted", message, 1)], kind
