"""Issue 4's behaviour list, the items the other controller tests leave out, through the whole controller on
the real control plane: `""` and removal on the machine, node-over-machine precedence with the last-applied
record, `false`, rollouts and auto-preservation, scale-down priority, every Event reason, and machines
without a node. Stable outcomes ("not preserved again") are checked across several informer resyncs, each
of which reconciles every machine again."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.controller.standalone import Controller
from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.node_fields import STOP_REMOVES
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_custom,
    create_machine,
    events_about,
    guarded_pods,
    is_preserved,
    is_unpreserved,
    machine_model,
    machine_set_owner,
    machines_of,
    new_node,
    owner_reference,
    read_node_model,
)
from tests.polling import eventually_async

MERGE = "application/merge-patch+json"
P = v.PRESERVE_ANNOTATION
PRIORITY, LAST_PRIORITY = v.MACHINE_PRIORITY_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION
STOPPED = ("False", "Preservation stopped.", "")
DRAIN_FAILED = v.DRAIN_FAILED_MESSAGE


async def machine(api: client.ApiClient, namespace: str, name: str) -> Machine:
    found = await machine_model(api, namespace, name)
    assert found is not None, f"machine {name} is gone"
    return found


async def node(api: client.ApiClient, name: str) -> Node:
    return await read_node_model(client.CoreV1Api(api), name)


async def annotate_machine(api: client.ApiClient, namespace: str, name: str, annotations: dict[str, Any]) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "machines", name, {"metadata": {"annotations": annotations}}, _content_type=MERGE
    )


async def preserved_on_node(api: client.ApiClient, namespace: str, name: str, node_name: str) -> bool:
    m, n = await machine(api, namespace, name), await node(api, node_name)
    condition = n.preserved_condition
    return (
        is_preserved(m)
        and condition is not None
        and condition.status == "True"
        and n.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
    )


async def stopped_on_node(api: client.ApiClient, namespace: str, name: str, node_name: str) -> bool:
    m, n = await machine(api, namespace, name), await node(api, node_name)
    condition = n.preserved_condition
    return (
        is_unpreserved(m)
        and condition is not None
        and (condition.status, condition.reason, condition.message) == STOPPED
        and not (
            {v.CA_SCALE_DOWN_DISABLED_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION}
            & set(n.metadata.annotations)
        )
        and not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        and not ({PRIORITY, LAST_PRIORITY} & set(m.metadata.annotations))
    )


@contextlib.asynccontextmanager
async def preserved_by_its_own_now(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_name: str
) -> AsyncIterator[Controller]:
    """Machine "m" on Node `node_name`, preserved by its own `now`, with a controller that resyncs twice a second."""
    await create_machine(client.CustomObjectsApi(api), namespace, "m", node=node_name, annotations={P: "now"})
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:
        await eventually_async(lambda: preserved_on_node(api, namespace, "m", node_name))
        yield running.controller


async def resyncs(controller: Controller, count: int = 3) -> None:
    """Wait until every cached Machine was replayed to the reconcilers `count` more times."""
    caches = controller.caches
    assert caches is not None
    target = caches.machines.stats.resyncs + count
    await eventually_async(lambda: caches.machines.stats.resyncs >= target)


async def reasons_about(api: client.ApiClient, namespace: str, kind: str, name: str) -> dict[str, list[str]]:
    """Event reason -> the messages recorded under it, for one Machine or Node."""
    found: dict[str, list[str]] = {}
    for event in await events_about(api, namespace, kind, name):
        found.setdefault(event.reason or "", []).append(event.message or "")
    return found


async def reported(api: client.ApiClient, namespace: str, reason: str, machine_name: str, node_name: str) -> bool:
    """The Event `reason` is on the Machine and on its Node."""
    on_machine = await reasons_about(api, namespace, "Machine", machine_name)
    on_node = await reasons_about(api, namespace, "Node", node_name)
    return reason in on_machine and reason in on_node


# --- `""` and removal of the machine's annotation -----------------------------------------------------------


@pytest.mark.parametrize("change", [None, ""], ids=["removed", "empty"])
async def test_removing_or_emptying_the_machine_annotation_stops_and_does_not_preserve_again(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str], change: str | None
) -> None:
    node_name = await new_node(api, node_names, ready=True)
    async with preserved_by_its_own_now(control_plane, api, namespace, node_name) as controller:
        await annotate_machine(api, namespace, "m", {P: change})
        await eventually_async(lambda: stopped_on_node(api, namespace, "m", node_name))
        await resyncs(controller)
        assert await stopped_on_node(api, namespace, "m", node_name), "not preserved again"
    m = await machine(api, namespace, "m")
    assert m.metadata.annotations.get(P) == change, "the user's change is left as it is"
    for kind, name in (("Machine", "m"), ("Node", node_name)):
        events = await reasons_about(api, namespace, kind, name)
        assert events["PreservationStarted"] == [events["PreservationStarted"][0]], "started once"
        assert events["PreservationStopped"] == [
            "Preservation stopped: no preserve value is in force (annotation removed or empty)."
        ]


# --- node over machine, and the last-applied record ----------------------------------------------------------


async def test_the_node_value_wins_and_its_removal_is_seen_through_the_last_applied_record(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    # `when-failed` on a Running machine alone would not preserve it; the node's `now` does.
    node_name = await new_node(api, node_names, ready=True, annotations={P: "now"})
    await create_machine(client.CustomObjectsApi(api), namespace, "m", node=node_name, annotations={P: "when-failed"})
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:
        await eventually_async(lambda: preserved_on_node(api, namespace, "m", node_name))

        async def synced_from_node() -> bool:
            annotations = (await machine(api, namespace, "m")).metadata.annotations
            return P not in annotations and annotations.get(v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION) == "now"

        await eventually_async(synced_from_node)
        condition = (await node(api, node_name)).preserved_condition
        assert condition is not None
        assert condition.reason == "Preserved by user."

        # The node's annotation goes: only the machine's last-applied record says there was one.
        await client.CoreV1Api(api).patch_node(node_name, {"metadata": {"annotations": {P: None}}})
        await eventually_async(lambda: stopped_on_node(api, namespace, "m", node_name))
        await resyncs(running.controller)
        assert await stopped_on_node(api, namespace, "m", node_name), "not preserved again"
    annotations = (await machine(api, namespace, "m")).metadata.annotations
    assert annotations == {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: ""}, "the machine's own value stays removed"
    assert P not in (await node(api, node_name)).metadata.annotations
    assert await reported(api, namespace, "PreservationStopped", "m", node_name)


async def test_an_empty_node_value_overrides_the_machines_value(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node_name = await new_node(api, node_names, ready=True)
    async with preserved_by_its_own_now(control_plane, api, namespace, node_name) as controller:
        # A node's `""` still overrides the machine's annotation (and takes it over).
        await client.CoreV1Api(api).patch_node(node_name, {"metadata": {"annotations": {P: ""}}})
        await eventually_async(lambda: stopped_on_node(api, namespace, "m", node_name))
        await resyncs(controller)
        assert await stopped_on_node(api, namespace, "m", node_name), "not preserved again"
    assert P not in (await machine(api, namespace, "m")).metadata.annotations, "the node decided"
    assert (await node(api, node_name)).metadata.annotations == {P: ""}


# --- `false` ------------------------------------------------------------------------------------------------


async def test_false_stops_a_preservation_and_opts_a_failed_machine_out_of_auto_preservation(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = await machine_set_owner(api, namespace, replicas=3, autoPreserveFailedMachineMax=2)
    for name, values in (("opted-out", {P: "false"}), ("plain", {})):
        failed_node = await new_node(api, node_names, ready=False)
        await create_machine(custom, namespace, name, node=failed_node, phase="Failed", owner=owner, annotations=values)
    running_node = await new_node(api, node_names, ready=True)
    await create_machine(custom, namespace, "running", node=running_node, owner=owner, annotations={P: "now"})
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:

        async def settled() -> bool:
            plain, opted = await machine(api, namespace, "plain"), await machine(api, namespace, "opted-out")
            return (
                plain.metadata.annotations.get(P) == "auto-preserve"
                and is_preserved(plain)
                and await preserved_on_node(api, namespace, "running", running_node)
                and is_unpreserved(opted)
            )

        await eventually_async(settled)
        await annotate_machine(api, namespace, "running", {P: "false"})
        await eventually_async(lambda: stopped_on_node(api, namespace, "running", running_node))
        await resyncs(running.controller)

        # The budget (2) has room, yet the opted-out machine is never auto-preserved.
        opted = await machine(api, namespace, "opted-out")
        assert opted.metadata.annotations.get(P) == "false"
        assert is_unpreserved(opted)
        stopped = await machine(api, namespace, "running")
        assert stopped.metadata.annotations.get(P) == "false"
        assert is_unpreserved(stopped)
        assert await stopped_on_node(api, namespace, "running", running_node)
        status = (await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms"))["status"]
        assert (status["autoPreserveFailedMachineCount"], status["preservedFailedReplicas"]) == (1, 1)
    stops = (await reasons_about(api, namespace, "Machine", "running"))["PreservationStopped"]
    assert stops == ['Preservation stopped: the preserve value is "false".']


# --- rollouts -----------------------------------------------------------------------------------------------


async def test_failed_machines_of_a_machine_set_being_replaced_are_not_auto_preserved(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    deployment = owner_reference("MachineDeployment", await create_custom(api, namespace, "MachineDeployment", "md"))
    spec = {"replicas": 1, "autoPreserveFailedMachineMax": 1}
    for name, revision in (("old", "1"), ("new", "2")):
        machine_set = await create_custom(
            api,
            namespace,
            "MachineSet",
            name,
            spec=spec,
            owner=deployment,
            annotations={v.MACHINE_SET_REVISION_ANNOTATION: revision},
        )
        failed_node = await new_node(api, node_names, ready=False)
        await create_machine(
            custom,
            namespace,
            f"{name}-m",
            node=failed_node,
            phase="Failed",
            owner=owner_reference("MachineSet", machine_set),
        )
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:

        async def newer_auto_preserved() -> bool:
            m = await machine(api, namespace, "new-m")
            return m.metadata.annotations.get(P) == "auto-preserve" and is_preserved(m)

        await eventually_async(newer_auto_preserved)
        await resyncs(running.controller)
        old = await machine(api, namespace, "old-m")
        assert P not in old.metadata.annotations, "the MachineSet being replaced grants no auto value"
        assert is_unpreserved(old)

        # The rollout is undone (the newer MachineSet goes): the old one is no longer being replaced.
        await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "new")

        async def older_auto_preserved() -> bool:
            m = await machine(api, namespace, "old-m")
            return m.metadata.annotations.get(P) == "auto-preserve" and is_preserved(m)

        await eventually_async(older_auto_preserved)


# --- scale-down priority ------------------------------------------------------------------------------------


async def test_scale_down_priority_is_raised_while_preserved_and_restored_after(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = await machine_set_owner(api, namespace, replicas=5, autoPreserveFailedMachineMax=1)
    machines: dict[str, tuple[dict[str, str], bool]] = {
        "manual": ({P: "now", PRIORITY: "4"}, True),
        "marked": ({P: "now", PRIORITY: "1"}, True),  # the cluster-autoscaler's deletion mark
        "marked-later": ({P: "now"}, True),
        "other": ({}, True),
        "auto": ({}, False),
    }
    for name, (values, ready) in machines.items():
        node_name = await new_node(api, node_names, ready=ready)
        phase = "Running" if ready else "Failed"
        await create_machine(custom, namespace, name, node=node_name, phase=phase, owner=owner, annotations=values)

    async def priorities(expected: dict[str, dict[str, str]]) -> bool:
        for name, wanted in expected.items():
            annotations = (await machine(api, namespace, name)).metadata.annotations
            actual = {k: annotations[k] for k in (PRIORITY, LAST_PRIORITY) if k in annotations}
            assert actual == wanted, (name, actual)
        return True

    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:
        # Unpreserved ceiling 3 ("other" has the default): manual 3 + 2, auto-preserved 3 + 1; "marked" stays 1.
        preserved = {
            "manual": {PRIORITY: "5", LAST_PRIORITY: "4"},
            "marked": {PRIORITY: "1"},
            "marked-later": {PRIORITY: "5", LAST_PRIORITY: ""},
            "other": {},
            "auto": {PRIORITY: "4", LAST_PRIORITY: ""},
        }
        await eventually_async(lambda: priorities(preserved))
        for name in ("manual", "marked", "marked-later", "auto"):
            assert is_preserved(await machine(api, namespace, name)), name

        # The cluster-autoscaler marks a preserved machine for deletion: the mark is not overwritten.
        await annotate_machine(api, namespace, "marked-later", {PRIORITY: "1"})
        await resyncs(running.controller)
        await priorities({**preserved, "marked-later": {PRIORITY: "1", LAST_PRIORITY: ""}})

        for name in ("manual", "marked", "marked-later"):
            await annotate_machine(api, namespace, name, {P: None})
        # Restored on stop (a deletion mark stays); "manual" is unpreserved with 4 now, so the auto-preserved
        # one moves above it.
        await eventually_async(
            lambda: priorities(
                {
                    "manual": {PRIORITY: "4"},
                    "marked": {PRIORITY: "1"},
                    "marked-later": {PRIORITY: "1"},
                    "other": {},
                    "auto": {PRIORITY: "5", LAST_PRIORITY: ""},
                }
            )
        )


# --- Events: expiry, drain outcome, invalid node value --------------------------------------------------------


async def test_expiry_stops_removes_the_annotation_and_is_reported(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node_name = await new_node(api, node_names, ready=True)
    timeout = {"machinePreserveTimeout": "5s"}
    await create_machine(
        client.CustomObjectsApi(api), namespace, "m", node=node_name, annotations={P: "now"}, spec=timeout
    )
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:
        await eventually_async(lambda: reported(api, namespace, "PreservationStarted", "m", node_name))
        await eventually_async(lambda: stopped_on_node(api, namespace, "m", node_name), limit=60)
        await resyncs(running.controller)
        assert await stopped_on_node(api, namespace, "m", node_name), "not preserved again"
    assert P not in (await machine(api, namespace, "m")).metadata.annotations, "removed at expiry"
    for kind, name in (("Machine", "m"), ("Node", node_name)):
        events = await reasons_about(api, namespace, kind, name)
        assert "PreservationStopped" not in events
        [message] = events["PreservationExpired"]
        assert message.startswith("Preservation expired at ")
        assert message.endswith("the preserve annotation is removed so the machine is not preserved again.")


async def failed_machine_on_a_blocked_node(
    api: client.ApiClient, namespace: str, node_names: list[str], **spec: str
) -> str:
    """Machine "m", Failed and preserved `now`, on a NotReady node whose pod "guarded" a PDB keeps; the node."""
    node_name = await new_node(api, node_names, ready=False)
    await guarded_pods(api, namespace, node_name, "guarded")
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m", node=node_name, phase="Failed", annotations={P: "now"}, spec=spec)
    return node_name


async def test_a_blocked_drain_names_the_blocking_pod_and_is_reported(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node_name = await failed_machine_on_a_blocked_node(api, namespace, node_names)
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, max_drain_attempt=dt.timedelta(seconds=3)
    ):

        async def draining() -> str:
            condition = (await node(api, node_name)).preserved_condition
            return condition.message if condition is not None and condition.status == "False" else ""

        # While the first attempt runs (up to 3 s), the node says so and names the pods it waits for.
        message = await eventually_async(draining, limit=60, interval=0.05)
        assert message.startswith(v.DRAINING_MESSAGE), message
        assert message.endswith(f"Waiting for pods: {namespace}/guarded."), message
        m = await machine(api, namespace, "m")
        assert m.preservation is not None
        assert m.preservation.drain is None, "no outcome before the attempt ends"

        async def drain_failed() -> str:
            condition = (await node(api, node_name)).preserved_condition
            return condition.message if condition is not None and condition.message.startswith(DRAIN_FAILED) else ""

        message = await eventually_async(drain_failed, limit=60)
        record = (await machine(api, namespace, "m")).preservation
        assert record is not None
        assert record.drain is not None
        assert record.drain.outcome == v.DrainOutcome.FAILED, "the outcome is in the record"
        assert record.drain.failing_since == record.drain.last_attempt, "one attempt so far (the next in 1 min)"
        assert message.endswith(f"Pods blocking the drain: {namespace}/guarded."), message
        n = await node(api, node_name)
        assert n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        assert is_preserved(await machine(api, namespace, "m")), "still preserved"
        pod = await core.read_namespaced_pod("guarded", namespace)
        assert pod.metadata.deletion_timestamp is None, "the PDB kept the pod from being evicted"
        await eventually_async(lambda: reported(api, namespace, "PreservedNodeDrainFailed", "m", node_name))
    for kind, name in (("Machine", "m"), ("Node", node_name)):
        failures = [e for e in await events_about(api, namespace, kind, name) if e.reason == "PreservedNodeDrainFailed"]
        assert [e.type for e in failures] == ["Warning"]
        assert f"pods blocking: {namespace}/guarded" in (failures[0].message or "")
        # Stamped when the attempt ended (as the record's attempt is), not when it was planned 3 s earlier.
        assert failures[0].first_timestamp == record.drain.last_attempt


async def test_the_node_tells_a_blocked_drain_in_fields_and_loses_them_with_the_preservation(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    # What an SRE with access to the shoot only reads: the Node's fields, never the messages.
    node_name = await failed_machine_on_a_blocked_node(api, namespace, node_names)
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, max_drain_attempt=dt.timedelta(seconds=3)
    ):

        async def drain_state() -> str:
            return (await node(api, node_name)).metadata.annotations.get(v.PRESERVED_DRAIN_ANNOTATION, "")

        # While the first attempt runs (up to 3 s).
        assert await eventually_async(drain_state, limit=60, interval=0.05) == "draining"

        async def failed() -> dict[str, str]:
            annotations = (await node(api, node_name)).metadata.annotations
            return annotations if annotations.get(v.PRESERVED_DRAIN_ANNOTATION) == "failed" else {}

        annotations = await eventually_async(failed, limit=60)
        record = (await machine(api, namespace, "m")).preservation
        assert record is not None
        assert {key: annotations[key] for key in v.NODE_PRESERVATION_ANNOTATIONS} == {
            v.PRESERVED_SINCE_ANNOTATION: format_timestamp(record.since),
            v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(record.until),
            v.PRESERVED_BY_ANNOTATION: "user",
            v.PRESERVED_DRAIN_ANNOTATION: "failed",
        }
        assert annotations[v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION] == "1"
        assert annotations[v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION] == f"{namespace}/guard"

        # `false` ends the Failed machine's preservation: the Node forgets it before the Machine goes.
        await annotate_machine(api, namespace, "m", {P: "false"})

        async def machine_gone() -> bool:
            return await machine_model(api, namespace, "m") is None

        await eventually_async(machine_gone, limit=60)
        left = (await node(api, node_name)).metadata.annotations
        assert not set(left) & set(STOP_REMOVES), left


async def test_evictions_stop_at_the_drain_timeout_and_an_emptied_node_still_counts_as_drained(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core = client.CoreV1Api(api)
    node_name = await failed_machine_on_a_blocked_node(api, namespace, node_names, drainTimeout="3s")
    async with running_controller(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        max_drain_attempt=dt.timedelta(seconds=1),
        preservation=PreservationConfig(drain_retry_interval=dt.timedelta(seconds=1)),
    ):

        async def gave_up() -> Any:
            condition = (await node(api, node_name)).preserved_condition
            return condition if condition is not None and "Evictions stopped" in condition.message else None

        condition = await eventually_async(gave_up, limit=60)
        assert condition.status == "False"
        assert condition.message.endswith(
            f"Pods blocking the drain: {namespace}/guarded. Evictions stopped after the drain timeout (3s); "
            "the node counts as drained once these pods are gone."
        ), condition.message
        record = (await machine(api, namespace, "m")).preservation
        assert record is not None
        assert record.drain is not None
        assert record.drain.outcome == v.DrainOutcome.FAILED
        assert record.drain.failing_since is not None
        assert record.drain.last_attempt is not None
        assert record.drain.last_attempt >= record.drain.failing_since + dt.timedelta(seconds=1), "attempts repeated"
        # Attempts are over: with a 1 s retry interval, an attempt would have moved the record's last one by now.
        await asyncio.sleep(3)
        later = (await node(api, node_name)).preserved_condition
        assert later is not None
        assert later.message == condition.message
        assert (await machine(api, namespace, "m")).preservation == record
        assert (await core.read_namespaced_pod("guarded", namespace)).metadata.deletion_timestamp is None

        # The user removes the blocking pod: the controller notices the empty node without evicting anything.
        await core.delete_namespaced_pod("guarded", namespace, grace_period_seconds=0)

        async def drained() -> bool:
            condition = (await node(api, node_name)).preserved_condition
            return (
                condition is not None
                and condition.status == "True"
                and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
            )

        await eventually_async(drained, limit=30)
        await eventually_async(lambda: reported(api, namespace, "PreservedNodeDrained", "m", node_name))


async def test_an_invalid_node_value_is_treated_as_absent_and_reported_on_the_node(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node_name = await new_node(api, node_names, ready=True, annotations={P: "forever"})
    await create_machine(client.CustomObjectsApi(api), namespace, "m", node=node_name, annotations={P: "now"})
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
        # The node's value does not count: the machine's own `now` is in force.
        await eventually_async(lambda: preserved_on_node(api, namespace, "m", node_name))

        async def warned() -> list[client.CoreV1Event]:
            events = await events_about(api, namespace, "Node", node_name)
            return [e for e in events if e.reason == "InvalidPreserveValue"]

        [event] = await eventually_async(warned)
        assert event.type == "Warning"
        assert f'{P}="forever" on Node "{node_name}" is invalid and ignored' in (event.message or "")
    annotations = (await machine(api, namespace, "m")).metadata.annotations
    assert annotations[P] == "now", "an invalid node value does not take over"
    assert v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION not in annotations


# --- machines without a node --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_label", "says"),
    [("", "The machine has no node: only the expiry is set."), ("n-absent", 'Node "n-absent" not found')],
    ids=["no-node-label", "node-not-found"],
)
async def test_a_machine_without_a_node_gets_only_the_expiry(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_label: str, says: str
) -> None:
    await create_machine(client.CustomObjectsApi(api), namespace, "m", node=node_label, annotations={P: "now"})
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):

        async def started() -> list[str]:
            return (await reasons_about(api, namespace, "Machine", "m")).get("PreservationStarted", [])

        [message] = await eventually_async(started)
        assert says in message

        async def preserved() -> Machine | None:
            found = await machine(api, namespace, "m")
            return found if is_preserved(found) else None

        # The start's later writes (the mirrored expiry) may still be on their way when its Event is there.
        m = await eventually_async(preserved)
        assert v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION not in m.metadata.annotations

        if node_label:  # a Running machine whose Node is gone: noted, and said once
            assert v.PRESERVED_NODE_GONE_SINCE_ANNOTATION in m.metadata.annotations
            gone = (await reasons_about(api, namespace, "Machine", "m")).get("PreservedNodeGone", [])
            assert len(gone) == 1

        await annotate_machine(api, namespace, "m", {P: None})

        async def stopped() -> bool:
            # Its Node gone, the end of the preservation completes the delete MCM asked for.
            if node_label:
                return "m" not in await machines_of(api, namespace)
            return is_unpreserved(await machine(api, namespace, "m"))

        await eventually_async(stopped)

        async def stop_reported() -> bool:
            return "PreservationStopped" in await reasons_about(api, namespace, "Machine", "m")

        await eventually_async(stop_reported)
    if node_label:
        assert not await events_about(api, namespace, "Node", node_label), "no Node to report on"
