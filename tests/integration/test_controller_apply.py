"""Each plan step executor against real objects: Machines (our CRDs), Nodes, Events."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.events import EventRecorder, Regarding
from machine_preservation.controller.preservation.apply import (
    ObjectGone,
    Snapshot,
    StepFailed,
    Writer,
    execute_machine_plan,
    execute_machine_set_plan,
)
from machine_preservation.core import plan as p
from machine_preservation.core import vocabulary as v
from machine_preservation.core.lifecycle import plan_after_drain
from machine_preservation.core.models import Machine, MachineSet, Node, cached_node
from machine_preservation.core.preservation_record import start_record
from tests.controller.support import (
    GROUP,
    VERSION,
    create_machine,
    create_node,
    get_machine,
    machine_set_owner,
    read_node_model,
    read_raw,
)

NOW = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.UTC)
PRESERVED = {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT}
USER = v.PreservedBy.USER


@pytest.fixture
def writer(api: client.ApiClient, namespace: str) -> Writer:
    recorder = EventRecorder(control=api, target=api, machine_namespace=namespace, instance="test")
    return Writer(control=api, target=api, namespace=namespace, recorder=recorder)


@pytest.fixture
async def node_name(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"n-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(ApiException):
        await client.CoreV1Api(api).delete_node(name)


async def machine_snapshot(api: client.ApiClient, namespace: str, name: str, node: str = "") -> Snapshot:
    machine = Machine.model_validate(await get_machine(client.CustomObjectsApi(api), namespace, name))
    node_model = None
    if node:
        node_model = await read_node_model(client.CoreV1Api(api), node)
    return Snapshot(machine=machine, node=node_model)


async def read_node(api: client.ApiClient, name: str) -> Node:
    return await read_node_model(client.CoreV1Api(api), name)


async def test_machine_annotations_are_set_and_removed_and_a_stale_snapshot_conflicts(
    api: client.ApiClient, writer: Writer, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m", annotations={"keep": "1", "drop": "x"})
    snap = await machine_snapshot(api, namespace, "m")
    await execute_machine_plan(
        writer=writer,
        snap=snap,
        steps=[p.PatchMachineAnnotations(set={v.PRESERVE_ANNOTATION: "now"}, remove=("drop",))],
        now=NOW,
    )
    annotations = (await get_machine(custom, namespace, "m"))["metadata"]["annotations"]
    assert annotations == {"keep": "1", v.PRESERVE_ANNOTATION: "now"}

    stale = Snapshot(machine=snap.machine, node=None)  # the resourceVersion before our write
    with pytest.raises(StepFailed) as failed:
        await execute_machine_plan(
            writer=writer,
            snap=stale,
            steps=[p.PatchMachineAnnotations(remove=(v.PRESERVE_ANNOTATION,))],
            now=NOW,
        )
    assert failed.value.conflict
    assert (await get_machine(custom, namespace, "m"))["metadata"]["annotations"][v.PRESERVE_ANNOTATION] == "now"


async def test_a_status_written_meanwhile_does_not_hold_up_the_annotations_decided_from(
    api: client.ApiClient, writer: Writer, namespace: str
) -> None:
    # MCM rewrites a Failed machine's status on each refused delete: the plan's annotations still go in, while a
    # change to what the plan decided from (annotations, phase) is a conflict.
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m", phase="Failed", annotations={"keep": "1"})
    snap = await machine_snapshot(api, namespace, "m")
    status = {"status": {"lastOperation": {"description": "delete refused", "state": "Failed", "type": "Delete"}}}
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "machines", "m", status, _content_type="application/merge-patch+json"
    )
    step = p.PatchMachineAnnotations(set={v.PRESERVED_DRAIN_ANNOTATION: v.DrainOutcome.DRAINED.value})
    await execute_machine_plan(writer=writer, snap=snap, steps=[step], now=NOW)
    written = await get_machine(custom, namespace, "m")
    assert written["metadata"]["annotations"] == {"keep": "1", v.PRESERVED_DRAIN_ANNOTATION: "drained"}
    assert written["status"]["lastOperation"]["description"] == "delete refused"
    assert snap.machine_version == written["metadata"]["resourceVersion"]

    for change in (
        {"metadata": {"annotations": {"keep": "2"}}},
        {"status": {"currentStatus": {"phase": "Running"}}},
    ):
        stale = await machine_snapshot(api, namespace, "m")
        patch = (
            custom.patch_namespaced_custom_object_status
            if "status" in change
            else custom.patch_namespaced_custom_object
        )
        await patch(GROUP, VERSION, namespace, "machines", "m", change, _content_type="application/merge-patch+json")
        with pytest.raises(StepFailed) as failed:
            await execute_machine_plan(
                writer=writer, snap=stale, steps=[p.PatchMachineAnnotations(set={"late": "x"})], now=NOW
            )
        assert failed.value.conflict
        assert "late" not in (await get_machine(custom, namespace, "m"))["metadata"]["annotations"]


async def test_expiry_and_phase_are_written_through_the_status_subresource(
    api: client.ApiClient, writer: Writer, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m", phase="Failed")
    snap = await machine_snapshot(api, namespace, "m")
    expiry = NOW + dt.timedelta(hours=72, microseconds=123)
    drain = await execute_machine_plan(
        writer=writer,
        snap=snap,
        steps=[p.SetPreserveExpiry(expiry=expiry), p.SetMachinePhase(phase="Running")],
        now=NOW,
    )
    assert drain is None
    # Both landed: the second status write used the resourceVersion returned by the first (else 409).
    status = (await get_machine(custom, namespace, "m"))["status"]["currentStatus"]
    assert status == {
        "phase": "Running",
        "preserveExpiryTime": "2026-11-24T12:00:00Z",
        "lastUpdateTime": "2026-11-21T12:00:00Z",
    }

    await execute_machine_plan(writer=writer, snap=snap, steps=[p.SetPreserveExpiry(expiry=None)], now=NOW)
    status = (await get_machine(custom, namespace, "m"))["status"]["currentStatus"]
    assert "preserveExpiryTime" not in status
    assert status["phase"] == "Running"


async def test_delete_machine_is_idempotent_and_checks_the_uid(
    api: client.ApiClient, writer: Writer, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m")
    snap = await machine_snapshot(api, namespace, "m")
    await execute_machine_plan(writer=writer, snap=snap, steps=[p.DeleteMachine()], now=NOW)
    await execute_machine_plan(writer=writer, snap=snap, steps=[p.DeleteMachine()], now=NOW)
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "machines")
    assert listed["items"] == []

    # A machine changed since the snapshot is not deleted (the plan is made again from its new state).
    await create_machine(custom, namespace, "changed")
    changed = await machine_snapshot(api, namespace, "changed")
    await custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machines",
        "changed",
        {"metadata": {"labels": {"x": "y"}}},
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(StepFailed) as stale:
        await execute_machine_plan(writer=writer, snap=changed, steps=[p.DeleteMachine()], now=NOW)
    assert stale.value.conflict
    await get_machine(custom, namespace, "changed")

    # A new machine with the same name is not deleted through the old snapshot.
    await create_machine(custom, namespace, "m")
    with pytest.raises(StepFailed) as failed:
        await execute_machine_plan(writer=writer, snap=snap, steps=[p.DeleteMachine()], now=NOW)
    assert failed.value.conflict
    assert (await get_machine(custom, namespace, "m"))["metadata"]["uid"] != snap.machine.metadata.uid


async def test_a_machine_someone_else_deleted_first_counts_as_deleted(
    api: client.ApiClient, writer: Writer, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    finalizer = {"metadata": {"finalizers": ["test/keep"]}}
    await create_machine(custom, namespace, "m")
    await custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "machines", "m", finalizer, _content_type="application/merge-patch+json"
    )
    snap = await machine_snapshot(api, namespace, "m")
    # MCM's delete comes first (its finalizer keeps the machine while it terminates it): ours then meets a
    # changed resourceVersion, and the Events after the delete are still recorded.
    await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "m")
    event = p.RecordEvent(kind="Machine", name="m", type="Normal", reason="PreservationExpired", message="gone")
    await execute_machine_plan(writer=writer, snap=snap, steps=[p.DeleteMachine(), event], now=NOW)
    events = await client.CoreV1Api(api).list_namespaced_event(namespace, field_selector="involvedObject.name=m")
    assert [e.reason for e in events.items] == ["PreservationExpired"]
    await custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "machines", "m", {"metadata": {"finalizers": None}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip


async def test_node_annotations_keep_unrelated_keys(api: client.ApiClient, writer: Writer, node_name: str) -> None:
    await create_node(client.CoreV1Api(api), node_name, annotations={"user": "x", "old": "y"})
    machine = Machine.model_validate({"metadata": {"name": "m", "labels": {"node": node_name}}})
    snap = Snapshot(machine=machine, node=await read_node(api, node_name))
    step = p.PatchNodeAnnotations(
        set={v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true", v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true"},
        remove=("old",),
    )
    await writer.patch_node_annotations(snap, step)
    node = await read_node(api, node_name)
    assert node.metadata.annotations == {
        "user": "x",
        v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true",
        v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true",
    }


async def test_taint_add_and_remove_never_clobber_other_taints_or_unschedulable(
    api: client.ApiClient, writer: Writer, node_name: str
) -> None:
    core = client.CoreV1Api(api)
    await create_node(core, node_name)
    # Drop the not-ready taint admission adds on create: the node starts without any taint.
    await core.patch_node(node_name, {"spec": {"unschedulable": True, "taints": None}})
    machine = Machine.model_validate({"metadata": {"name": "m", "labels": {"node": node_name}}})

    # Add to a node without taints (guarded by resourceVersion), then once more: no duplicate.
    snap = Snapshot(machine=machine, node=await read_node(api, node_name))
    await writer.set_preserved_taint(snap, p.SetPreservedTaint(present=True), now=NOW)
    snap = Snapshot(machine=machine, node=await read_node(api, node_name))
    await writer.set_preserved_taint(snap, p.SetPreservedTaint(present=True), now=NOW)
    node = await read_node(api, node_name)
    assert [(t.key, t.effect) for t in node.spec.taints] == [(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)]
    assert node.spec.taints[0].time_added == NOW

    # Someone puts a taint in front of ours after our snapshot: our removal must not hit it.
    stale = Snapshot(machine=machine, node=node)
    user_taint = {"key": "user/maintenance", "effect": "NoExecute"}
    await core.patch_node(node_name, [{"op": "add", "path": "/spec/taints/0", "value": user_taint}])
    with pytest.raises(StepFailed) as failed:
        await execute_machine_plan(writer=writer, snap=stale, steps=[p.SetPreservedTaint(present=False)], now=NOW)
    assert failed.value.conflict
    node = await read_node(api, node_name)
    assert [t.key for t in node.spec.taints] == ["user/maintenance", v.PRESERVED_TAINT_KEY]

    # From a fresh snapshot the removal succeeds and leaves the user's taint alone; the cache's copy keeps only our
    # taint, with its position in the list.
    snap = Snapshot(machine=machine, node=await cached(core, node_name))
    assert snap.node is not None
    assert [(t.key, t.index) for t in snap.node.spec.taints] == [(v.PRESERVED_TAINT_KEY, 1)]
    await writer.set_preserved_taint(snap, p.SetPreservedTaint(present=False), now=NOW)
    node = await read_node(api, node_name)
    assert [t.key for t in node.spec.taints] == ["user/maintenance"]
    assert node.spec.unschedulable is True


async def node_changes_since(api: client.ApiClient, name: str, version: str) -> int:
    """How many times the Node changed after `version`: its watch from there, read until the server ends it."""
    response = await client.CoreV1Api(api).list_node_without_preload_content(
        field_selector=f"metadata.name={name}", watch=True, resource_version=version, timeout_seconds=1
    )
    body = await response.read()
    return sum(json.loads(line)["type"] == "MODIFIED" for line in body.splitlines() if line.strip())


async def cached(core: client.CoreV1Api, name: str) -> Node:
    """The Node as the controller's cache keeps it."""
    return cached_node(await read_raw(core.read_node_without_preload_content(name)))


CA_OURS = {v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true", v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION: "true"}


async def test_a_nodes_annotations_then_its_taint_are_one_write_at_the_snapshots_version(
    api: client.ApiClient, writer: Writer, node_name: str
) -> None:
    core = client.CoreV1Api(api)
    user_taint = {"key": "user/maintenance", "effect": "NoExecute"}
    await create_node(core, node_name, annotations={"user": "x", v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: "true"})
    await core.patch_node(node_name, {"spec": {"taints": [user_taint]}})
    machine = Machine.model_validate({"metadata": {"name": "m", "labels": {"node": node_name}}})
    start = [
        p.PatchNodeAnnotations(set=CA_OURS, remove=(v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,)),
        p.SetPreservedTaint(present=True),
    ]

    # Someone writes the node after our snapshot: nothing of the pair is written, and the reconcile is retried.
    stale = Snapshot(machine=machine, node=await read_node(api, node_name))
    await core.patch_node(node_name, {"metadata": {"annotations": {"other": "y"}}})
    with pytest.raises(StepFailed) as failed:
        await execute_machine_plan(writer=writer, snap=stale, steps=start, now=NOW)
    assert failed.value.conflict
    node = await read_node(api, node_name)
    assert v.CA_SCALE_DOWN_DISABLED_ANNOTATION not in node.metadata.annotations
    assert [t.key for t in node.spec.taints] == ["user/maintenance"]

    # From the cache's copy (which keeps only our annotations): both in one change, the others' keys and taint kept.
    snap = Snapshot(machine=machine, node=await cached(core, node_name))
    assert snap.node is not None
    assert "user" not in snap.node.metadata.annotations
    before = snap.node_version
    await execute_machine_plan(writer=writer, snap=snap, steps=start, now=NOW)
    assert await node_changes_since(api, node_name, before) == 1
    node = await read_node(api, node_name)
    assert node.metadata.annotations == {"user": "x", "other": "y", **CA_OURS}
    assert [(t.key, t.time_added) for t in node.spec.taints] == [("user/maintenance", None), (PRESERVED["key"], NOW)]
    assert snap.node_version == node.metadata.resource_version

    # The stop: our keys and our taint go together, the rest stays.
    snap = Snapshot(machine=machine, node=node)
    stop = [p.PatchNodeAnnotations(remove=tuple(CA_OURS)), p.SetPreservedTaint(present=False)]
    await execute_machine_plan(writer=writer, snap=snap, steps=stop, now=NOW)
    assert await node_changes_since(api, node_name, node.metadata.resource_version) == 1
    node = await read_node(api, node_name)
    assert node.metadata.annotations == {"user": "x", "other": "y"}
    assert [t.key for t in node.spec.taints] == ["user/maintenance"]


async def test_a_node_without_annotations_gets_them_and_the_taint_in_two_writes(
    api: client.ApiClient, writer: Writer, node_name: str
) -> None:
    core = client.CoreV1Api(api)
    await create_node(core, node_name)
    await core.patch_node(node_name, {"spec": {"taints": None}})
    machine = Machine.model_validate({"metadata": {"name": "m", "labels": {"node": node_name}}})
    snap = Snapshot(machine=machine, node=await cached(core, node_name))
    assert snap.node is not None
    assert not snap.node.metadata.has_annotations
    before = snap.node_version
    steps = [p.PatchNodeAnnotations(set=CA_OURS), p.SetPreservedTaint(present=True)]
    await execute_machine_plan(writer=writer, snap=snap, steps=steps, now=NOW)
    assert await node_changes_since(api, node_name, before) == 2
    node = await read_node(api, node_name)
    assert node.metadata.annotations == CA_OURS
    assert [t.key for t in node.spec.taints] == [PRESERVED["key"]]


async def test_preserved_condition_is_merged_by_type(api: client.ApiClient, writer: Writer, node_name: str) -> None:
    core = client.CoreV1Api(api)
    await create_node(core, node_name)
    machine = Machine.model_validate({"metadata": {"name": "m", "labels": {"node": node_name}}})
    snap = Snapshot(machine=machine, node=await read_node(api, node_name))
    for status, message in (("True", "Machine preserved until x."), ("False", "")):
        reason = v.ConditionReason.PRESERVED_BY_USER if status == "True" else v.ConditionReason.PRESERVATION_STOPPED
        step = p.SetPreservedCondition(status=status, reason=reason, message=message, last_transition_time=NOW)
        await writer.set_preserved_condition(snap, step)
    node = await read_node(api, node_name)
    assert sorted(c.type for c in node.status.conditions) == [v.PRESERVED_CONDITION_TYPE, "Ready"]
    preserved = node.preserved_condition
    assert preserved is not None
    assert (preserved.status, preserved.reason, preserved.message) == ("False", "Preservation stopped.", "")
    assert preserved.last_transition_time == NOW


async def test_repeated_events_are_aggregated_into_one_series(
    api: client.ApiClient, writer: Writer, namespace: str, node_name: str
) -> None:
    custom = client.CustomObjectsApi(api)
    created = await create_machine(custom, namespace, "m")
    snap = await machine_snapshot(api, namespace, "m")
    step = p.RecordEvent(kind="Machine", name="m", type="Normal", reason="PreservationStarted", message="hello")
    for _ in range(3):
        await writer.record_event(snap, step, now=NOW)
    other = p.RecordEvent(kind="Machine", name="m", type="Warning", reason="InvalidPreserveValue", message="bad")
    await writer.record_event(snap, other, now=NOW)

    events = (await client.CoreV1Api(api).list_namespaced_event(namespace)).items
    by_reason = {e.reason: e for e in events}
    assert set(by_reason) == {"PreservationStarted", "InvalidPreserveValue"}
    started = by_reason["PreservationStarted"]
    assert started.count == 3
    assert started.involved_object.kind == "Machine"
    assert started.involved_object.uid == created["metadata"]["uid"]
    assert started.message == "hello"
    assert (by_reason["InvalidPreserveValue"].count, by_reason["InvalidPreserveValue"].type) == (1, "Warning")

    await create_node(client.CoreV1Api(api), node_name)
    await writer.recorder.record(
        regarding=Regarding(kind="Node", name=node_name), type="Normal", reason="R", message="m", action="A", now=NOW
    )
    node_events = (await client.CoreV1Api(api).list_namespaced_event("default")).items
    assert any(e.involved_object.name == node_name and e.involved_object.kind == "Node" for e in node_events)


async def test_repeats_recorded_at_once_are_each_counted(api: client.ApiClient, writer: Writer, namespace: str) -> None:
    await create_machine(client.CustomObjectsApi(api), namespace, "m")
    snap = await machine_snapshot(api, namespace, "m")
    step = p.RecordEvent(kind="Machine", name="m", type="Normal", reason="PreservationStarted", message="again")
    await asyncio.gather(*(writer.record_event(snap, step, now=NOW) for _ in range(6)))
    (event,) = (await client.CoreV1Api(api).list_namespaced_event(namespace)).items
    assert event.count == 6


async def test_a_plan_stops_at_the_first_failure(
    api: client.ApiClient, writer: Writer, namespace: str, node_name: str
) -> None:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    await create_node(core, node_name)
    await create_machine(custom, namespace, "m", node=node_name, phase="Failed")
    snap = await machine_snapshot(api, namespace, "m", node=node_name)
    await core.patch_node(node_name, {"metadata": {"labels": {"changed": "yes"}}})  # snapshot's node is stale
    steps = [
        p.SetPreserveExpiry(expiry=NOW + dt.timedelta(hours=1)),
        p.PatchNodeAnnotations(set={v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true"}),
        p.RecordEvent(kind="Machine", name="m", type="Normal", reason="PreservationStarted", message="x"),
    ]
    with pytest.raises(StepFailed) as failed:
        await execute_machine_plan(writer=writer, snap=snap, steps=steps, now=NOW)
    assert isinstance(failed.value.step, p.PatchNodeAnnotations)
    machine = await get_machine(custom, namespace, "m")
    assert machine["status"]["currentStatus"]["preserveExpiryTime"] == "2026-11-21T13:00:00Z"
    assert (await read_node(api, node_name)).metadata.annotations == {}
    assert (await client.CoreV1Api(api).list_namespaced_event(namespace)).items == []


async def test_a_missing_machine_ends_the_plan_as_gone(api: client.ApiClient, writer: Writer, namespace: str) -> None:
    machine = Machine.model_validate({"metadata": {"name": "absent", "resourceVersion": "1"}})
    with pytest.raises(ObjectGone):
        await execute_machine_plan(
            writer=writer,
            snap=Snapshot(machine=machine, node=None),
            steps=[p.SetPreserveExpiry(expiry=NOW)],
            now=NOW,
        )


async def test_a_machine_set_plan_writes_in_order_and_fails_as_a_machine_plan_does(
    api: client.ApiClient, writer: Writer, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = await machine_set_owner(api, namespace, "ms")
    await create_machine(custom, namespace, "a", owner=owner)
    await create_machine(custom, namespace, "b", owner=owner)
    machine_set = MachineSet.model_validate(
        await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    )
    machines = [Machine.model_validate(await get_machine(custom, namespace, name)) for name in ("a", "b")]
    status = p.PatchMachineSetStatus(auto_preserve_failed_machine_count=1, preserved_failed_replicas=1)
    plan = p.MachineSetPlan(
        machine_annotations={
            "a": p.PatchMachineAnnotations(set={"x": "1"}),
            "b": p.PatchMachineAnnotations(set={"x": "2"}),
        },
        status=status,
    )
    await execute_machine_set_plan(writer=writer, machine_set=machine_set, machines=machines, plan=plan, now=NOW)
    assert [(await get_machine(custom, namespace, n))["metadata"]["annotations"]["x"] for n in ("a", "b")] == ["1", "2"]
    written = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    assert written["status"]["autoPreserveFailedMachineCount"] == 1

    # The status was written at a newer resourceVersion than the plan saw: a conflict, retried with backoff.
    with pytest.raises(StepFailed) as failed:
        await execute_machine_set_plan(
            writer=writer, machine_set=machine_set, machines=[], plan=p.MachineSetPlan(status=status), now=NOW
        )
    assert failed.value.conflict
    # A machine deleted since the plan ends it as gone, before the status is written.
    await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "b")
    fresh = MachineSet.model_validate(written)
    only_b = p.MachineSetPlan(machine_annotations={"b": plan.machine_annotations["b"]}, status=status)
    with pytest.raises(ObjectGone):
        await execute_machine_set_plan(writer=writer, machine_set=fresh, machines=machines, plan=only_b, now=NOW)
    unchanged = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    assert unchanged["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]


async def test_a_failed_drains_outcome_goes_into_the_record_the_condition_and_events(
    api: client.ApiClient, writer: Writer, namespace: str, node_name: str
) -> None:
    custom = client.CustomObjectsApi(api)
    await create_node(client.CoreV1Api(api), node_name, ready=False)
    record = start_record(now=NOW, timeout=dt.timedelta(hours=1), max_timeout=dt.timedelta(hours=2), by=USER)
    await create_machine(custom, namespace, "m", node=node_name, phase="Failed", annotations=record.annotations())
    snap = await machine_snapshot(api, namespace, "m", node=node_name)
    drain = p.DrainNode(
        record=record, reason=v.ConditionReason.PRESERVED_BY_USER, expiry=record.until, timeout=dt.timedelta(minutes=1)
    )
    blocking = [f"{namespace}/guarded"]
    attempt = NOW + dt.timedelta(seconds=30)
    assert snap.node is not None
    after = plan_after_drain(
        machine=snap.machine, node=snap.node, drain=drain, drained=False, blocking_pods=blocking, now=attempt
    )
    await execute_machine_plan(writer=writer, snap=snap, steps=after.steps, now=attempt)

    annotations = (await get_machine(custom, namespace, "m"))["metadata"]["annotations"]
    assert annotations == {
        **record.annotations(),
        v.PRESERVED_DRAIN_ANNOTATION: "failed",
        v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION: "2026-11-21T12:00:30Z",
        v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION: "2026-11-21T12:00:30Z",
    }
    read_back = Machine.model_validate(await get_machine(custom, namespace, "m")).preservation
    assert read_back is not None
    assert read_back.drain is not None
    assert (read_back.drain.outcome, read_back.drain.last_attempt) == (v.DrainOutcome.FAILED, attempt)
    condition = (await read_node(api, node_name)).preserved_condition
    assert condition is not None
    assert condition.status == "False"
    assert condition.message.startswith(v.DRAIN_FAILED_MESSAGE)
    assert condition.message.endswith(f"Pods blocking the drain: {namespace}/guarded."), condition.message
    events = (await client.CoreV1Api(api).list_namespaced_event(namespace)).items
    assert [(e.reason, e.type) for e in events] == [("PreservedNodeDrainFailed", "Warning")]
