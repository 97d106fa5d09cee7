"""The executor: each step of a core plan (core/plan.py), for a Machine, a MachineSet or a MachineDeployment,
as one idempotent API write (a Node's annotations and taint, one after the other, as one).

Writes that depend on the snapshot the plan was computed from carry that snapshot's
resourceVersion (a merge patch with `metadata.resourceVersion`, answered 409 when stale), and the
resourceVersion is carried forward from each response, so a plan never acts on a state that has
changed underneath it; the reconcile is then retried from fresh caches. Taints are changed with a
JSON patch whose `test` ops pin exactly the list entry or list state we saw, so a concurrent taint
change is never overwritten; where a plan changes a Node's annotations and then its taint, both go in one JSON
patch at the snapshot's resourceVersion. The Preserved condition is a strategic merge patch keyed by type (it
touches no other condition). Steps run in order; the first failure stops the plan (ObjectGone or StepFailed,
which the worker loop turns into "done" or a retry with backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio import client

from machine_preservation.controller.machinery.events import EventRecorder, Regarding
from machine_preservation.controller.machinery.queue import ObjectGone, RetryWithBackoff
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.core import plan as p
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.kube.api_errors import Conflict, Failed, Invalid, NotFound, api_call, call
from machine_preservation.kube.clients import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH

logger = logging.getLogger(__name__)

MACHINES = "machines"


class StepFailed(RetryWithBackoff):
    """A step could not be written; the reconcile is retried with backoff."""

    def __init__(self, step: object, cause: Failed, *, conflict: bool) -> None:
        super().__init__(f"{type(step).__name__} failed: {cause.status} {cause.reason}")
        self.step = step
        self.conflict = conflict


def _version_of(custom_object: object) -> str:
    """The resourceVersion of a custom object as the API returned it (a dict)."""
    if not isinstance(custom_object, dict):
        raise TypeError(f"expected a custom object, got {type(custom_object).__name__}")
    return str(custom_object["metadata"]["resourceVersion"])


@dataclass
class Snapshot:
    """The objects a plan acts on, with their resourceVersions advanced by each write."""

    machine: Machine
    node: Node | None
    machine_version: str = ""
    node_version: str = ""

    def __post_init__(self) -> None:
        self.machine_version = self.machine_version or self.machine.metadata.resource_version
        if self.node is not None:
            self.node_version = self.node_version or self.node.metadata.resource_version


@dataclass
class Writer:
    """The API writes behind the plan steps, for Machines in one namespace and their Nodes."""

    control: client.ApiClient
    target: client.ApiClient
    namespace: str
    recorder: EventRecorder
    # The process's reconcile slots: a write to the shoot gives its slot back while it waits for the shoot's API
    # server, so a slow shoot does not hold the slots the other shoots' reconciles need.
    slots: ReconcileSlots = field(default_factory=ReconcileSlots)

    # --- machines ----------------------------------------------------------------------------------

    async def patch_machine_annotations(self, snap: Snapshot, step: p.PatchMachineAnnotations) -> None:
        annotations: dict[str, str | None] = dict.fromkeys(step.remove)
        annotations.update(step.set)
        try:
            body = {"metadata": {"resourceVersion": snap.machine_version, "annotations": annotations}}
            with api_call():
                await self._merge_patch_machine(snap, body, status=False)
        except Conflict:
            # MCM rewrites a Failed machine's status on every retry of its delete (about every 0.1 s while the
            # webhook refuses it), so a drain's outcome would conflict forever. What the plan decided from, the
            # annotations and the phase, is compared instead: still as read, the write goes in at the new version.
            version = await self._version_if_decided_alike(snap)
            if version is None:
                raise
            body = {"metadata": {"resourceVersion": version, "annotations": annotations}}
            await self._merge_patch_machine(snap, body, status=False)

    async def patch_machine_status(self, snap: Snapshot, current_status: dict[str, Any]) -> None:
        body = {"metadata": {"resourceVersion": snap.machine_version}, "status": {"currentStatus": current_status}}
        await self._merge_patch_machine(snap, body, status=True)

    async def _merge_patch_machine(self, snap: Snapshot, body: dict[str, Any], *, status: bool) -> None:
        """One merge patch on the Machine or its status subresource; remembers the new resourceVersion."""
        custom = self._custom()
        patch = custom.patch_namespaced_custom_object_status if status else custom.patch_namespaced_custom_object
        result = await patch(
            v.MACHINE_API_GROUP,
            v.MACHINE_API_VERSION,
            self.namespace,
            MACHINES,
            snap.machine.metadata.name,
            body,
            _content_type=MERGE_PATCH,
        )
        snap.machine_version = _version_of(result)

    async def set_preserve_expiry(self, snap: Snapshot, step: p.SetPreserveExpiry, *, now: dt.datetime) -> None:
        expiry = None if step.expiry is None else format_timestamp(step.expiry)
        await self.patch_machine_status(snap, {"preserveExpiryTime": expiry, "lastUpdateTime": format_timestamp(now)})

    async def set_machine_phase(self, snap: Snapshot, step: p.SetMachinePhase, *, now: dt.datetime) -> None:
        await self.patch_machine_status(snap, {"phase": step.phase, "lastUpdateTime": format_timestamp(now)})

    async def delete_machine(self, snap: Snapshot) -> None:
        try:
            await call(
                self._custom().delete_namespaced_custom_object(
                    v.MACHINE_API_GROUP,
                    v.MACHINE_API_VERSION,
                    self.namespace,
                    MACHINES,
                    snap.machine.metadata.name,
                    # Only the machine the plan saw, in the state it saw (a changed one is planned again).
                    body=client.V1DeleteOptions(
                        preconditions=client.V1Preconditions(
                            uid=snap.machine.metadata.uid, resource_version=snap.machine_version or None
                        )
                    ),
                )
            )
        except NotFound:
            return
        except Conflict:
            if await self._deleted_by_someone_else(snap):
                # Once the preservation is over, MCM's next delete passes the webhook and often comes first
                # (our node writes just before make it look again): the machine goes, as this step wants,
                # and the plan's Events after it still say why.
                return
            raise

    async def _version_if_decided_alike(self, snap: Snapshot) -> str | None:
        """The Machine's current resourceVersion if its annotations and phase are still those of the snapshot (only
        its status or other metadata changed), else None. Only before this plan's first Machine write: the snapshot
        does not follow our own writes."""
        if snap.machine_version != snap.machine.metadata.resource_version:
            return None
        current = await self._listed_by_name(snap)
        if current is None:
            return None
        machine = Machine.model_validate(current)
        alike = (
            machine.metadata.annotations == snap.machine.metadata.annotations
            and machine.phase == snap.machine.phase
            and machine.metadata.deletion_timestamp == snap.machine.metadata.deletion_timestamp
        )
        return machine.metadata.resource_version if alike else None

    async def _listed_by_name(self, snap: Snapshot) -> dict[str, Any] | None:
        """The snapshot's Machine as the API has it now (a list by name: the controller reads Machines only by list
        and watch), None when it is gone or another machine of the same name took its place."""
        listed = await self._custom().list_namespaced_custom_object(
            v.MACHINE_API_GROUP,
            v.MACHINE_API_VERSION,
            self.namespace,
            MACHINES,
            field_selector=f"metadata.name={snap.machine.metadata.name}",
        )
        if not isinstance(listed, dict):
            raise TypeError(f"expected a list of custom objects, got {type(listed).__name__}")
        ours = [i for i in listed["items"] if i["metadata"].get("uid") == snap.machine.metadata.uid]
        return ours[0] if ours else None

    async def _deleted_by_someone_else(self, snap: Snapshot) -> bool:
        """Whether the machine of the snapshot is already being deleted. Another machine of the same name is not
        ours."""
        current = await self._listed_by_name(snap)
        return bool(current and current["metadata"].get("deletionTimestamp"))

    # --- nodes -------------------------------------------------------------------------------------

    async def patch_node_annotations(self, snap: Snapshot, step: p.PatchNodeAnnotations) -> None:
        node = self._node(snap)
        annotations: dict[str, str | None] = dict.fromkeys(step.remove)
        annotations.update(step.set)
        body = {"metadata": {"resourceVersion": snap.node_version, "annotations": annotations}}
        result = await client.CoreV1Api(self.target).patch_node(node.metadata.name, body, _content_type=MERGE_PATCH)
        snap.node_version = (result.metadata.resource_version if result.metadata else None) or ""

    async def set_preserved_taint(self, snap: Snapshot, step: p.SetPreservedTaint, *, now: dt.datetime) -> None:
        operations = _taint_operations(self._node(snap), step, pin=snap.node_version, now=now)
        if operations:
            await self._json_patch_node(snap, operations)

    async def patch_node_annotations_and_taint(
        self, snap: Snapshot, step: NodeAnnotationsAndTaint, *, now: dt.datetime
    ) -> None:
        """Both steps in one JSON patch at the snapshot's resourceVersion (as the annotations' merge patch alone
        is): one round trip to the shoot and one Node change instead of two. Only for a node whose annotations
        map exists (`_paired`): a key cannot be added to a missing map."""
        node = self._node(snap)
        annotations = step.annotations
        operations: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": snap.node_version}
        ]
        operations += [
            {"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
            for key, value in annotations.set.items()
        ]
        # A key the snapshot does not have is not there at its resourceVersion (removing it would fail the patch).
        operations += [
            {"op": "remove", "path": f"/metadata/annotations/{_pointer(key)}"}
            for key in annotations.remove
            if key in node.metadata.annotations and key not in annotations.set
        ]
        operations += _taint_operations(node, step.taint, pin=None, now=now)  # pinned by the test above
        await self._json_patch_node(snap, operations)

    async def _json_patch_node(self, snap: Snapshot, operations: list[dict[str, Any]]) -> None:
        result = await client.CoreV1Api(self.target).patch_node(
            self._node(snap).metadata.name, operations, _content_type=JSON_PATCH
        )
        snap.node_version = (result.metadata.resource_version if result.metadata else None) or ""

    async def set_preserved_condition(self, snap: Snapshot, step: p.SetPreservedCondition) -> None:
        node = self._node(snap)
        condition = {
            "type": v.PRESERVED_CONDITION_TYPE,
            "status": step.status,
            "reason": step.reason,
            "message": step.message,
            "lastTransitionTime": format_timestamp(step.last_transition_time),
        }
        body = {"status": {"conditions": [condition]}}
        result = await client.CoreV1Api(self.target).patch_node_status(
            node.metadata.name, body, _content_type=STRATEGIC_MERGE_PATCH
        )
        snap.node_version = (result.metadata.resource_version if result.metadata else None) or ""

    # --- events ------------------------------------------------------------------------------------

    async def record_event(self, snap: Snapshot, step: p.RecordEvent, *, now: dt.datetime) -> None:
        uid = ""
        if step.kind == "Machine" and step.name == snap.machine.metadata.name:
            uid = snap.machine.metadata.uid
        elif step.kind == "Node" and snap.node is not None and step.name == snap.node.metadata.name:
            uid = snap.node.metadata.uid
        await self.recorder.record(
            regarding=Regarding(kind=step.kind, name=step.name, uid=uid),
            type=step.type,
            reason=step.reason,
            message=step.message,
            key=step.key,
            action="Preservation",
            now=now,
            once=step.once,
        )

    # --- machine sets ------------------------------------------------------------------------------

    async def patch_machine_set_status(self, machine_set: MachineSet, step: p.PatchMachineSetStatus) -> None:
        """The counters, at the resourceVersion the plan saw."""
        body = {
            "metadata": {"resourceVersion": machine_set.metadata.resource_version},
            "status": {
                "autoPreserveFailedMachineCount": step.auto_preserve_failed_machine_count,
                "preservedFailedReplicas": step.preserved_failed_replicas,
            },
        }
        await self._custom().patch_namespaced_custom_object_status(
            v.MACHINE_API_GROUP,
            v.MACHINE_API_VERSION,
            self.namespace,
            "machinesets",
            machine_set.metadata.name,
            body,
            _content_type=MERGE_PATCH,
        )

    async def patch_machine_deployment_status(
        self, deployment: MachineDeployment, step: p.PatchMachineDeploymentStatus
    ) -> None:
        """The counter, at the resourceVersion the plan saw."""
        body = {
            "metadata": {"resourceVersion": deployment.metadata.resource_version},
            "status": {"preservedFailedReplicas": step.preserved_failed_replicas},
        }
        await self._custom().patch_namespaced_custom_object_status(
            v.MACHINE_API_GROUP,
            v.MACHINE_API_VERSION,
            self.namespace,
            "machinedeployments",
            deployment.metadata.name,
            body,
            _content_type=MERGE_PATCH,
        )

    # --- internals ---------------------------------------------------------------------------------

    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.control)

    @staticmethod
    def _node(snap: Snapshot) -> Node:
        if snap.node is None:
            raise ObjectGone(f"machine {snap.machine.metadata.name} has no node for a node step")
        return snap.node


def _taint_operations(
    node: Node, step: p.SetPreservedTaint, *, pin: str | None, now: dt.datetime
) -> list[dict[str, Any]]:
    """The JSON patch that adds or removes our taint (none when the node is as the step wants it). Its `test` ops
    pin exactly the list entries or the empty list it saw (by the resourceVersion `pin`, unless the patch is pinned
    already), so a concurrent change to the taints fails the patch (422) instead of being overwritten; an append
    needs no pin."""
    ours = [
        i if t.index is None else t.index  # the cache keeps only our taints, each with its position
        for i, t in enumerate(node.spec.taints)
        if t.key == v.PRESERVED_TAINT_KEY and t.effect == v.PRESERVED_TAINT_EFFECT
    ]
    if step.present:
        if ours:
            return []
        taint = {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT, "timeAdded": format_timestamp(now)}
        if node.spec.has_taints:
            # Append: whatever else is in the list now stays as it is.
            return [{"op": "add", "path": "/spec/taints/-", "value": taint}]
        pinned = [] if pin is None else [{"op": "test", "path": "/metadata/resourceVersion", "value": pin}]
        return [*pinned, {"op": "add", "path": "/spec/taints", "value": [taint]}]
    operations: list[dict[str, Any]] = []
    for index in reversed(ours):  # highest index first, so earlier indices stay valid
        operations += [
            {"op": "test", "path": f"/spec/taints/{index}/key", "value": v.PRESERVED_TAINT_KEY},
            {"op": "test", "path": f"/spec/taints/{index}/effect", "value": v.PRESERVED_TAINT_EFFECT},
            {"op": "remove", "path": f"/spec/taints/{index}"},
        ]
    return operations


def _pointer(key: str) -> str:
    """A map key as one JSON pointer token (RFC 6901: `~` and `/` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class NodeAnnotationsAndTaint:
    """Two adjacent steps of a plan written as one (see `_paired`)."""

    annotations: p.PatchNodeAnnotations
    taint: p.SetPreservedTaint


# What a step writes: a Machine plan's steps act on its Snapshot; a status step on the object it is the status of.
Target = Snapshot | MachineSet | MachineDeployment
Step = p.MachineStep | p.PatchMachineSetStatus | p.PatchMachineDeploymentStatus
# What one write does: a step, or two steps written as one.
Write = Step | NodeAnnotationsAndTaint


async def execute(*, writer: Writer, writes: Sequence[tuple[Target, Step]], now: dt.datetime) -> None:
    """Write the steps in order.

    An Event is sent once the writes before it have succeeded and does not hold up the writes after it (as
    client-go's recorder does not): the protection of a failed machine comes two round trips sooner. Only a
    Machine patch marked `after_events` waits for the Events sent before it. Every Event has been answered when
    this returns.

    The first failure ends the plan: ObjectGone if the object a step writes no longer exists (an Event's 404 is
    not that), else StepFailed; a failed Event fails the plan like a write, once the writes have been made."""
    events: list[asyncio.Task[None]] = []
    try:
        await _write_in_order(writer=writer, writes=writes, now=now, events=events)
    finally:
        await _answered(writer=writer, writes=writes, events=events)
    _raise_first_failure(events)


async def _write_in_order(
    *, writer: Writer, writes: Sequence[tuple[Target, Step]], now: dt.datetime, events: list[asyncio.Task[None]]
) -> None:
    for target, step in _paired(writes):
        if isinstance(step, p.RecordEvent):
            events.append(asyncio.create_task(_write(writer=writer, target=target, step=step, now=now)))
            continue
        if isinstance(step, p.PatchMachineAnnotations) and step.after_events:
            await _answered(writer=writer, writes=writes, events=events)
            _raise_first_failure(events)
        await _write(writer=writer, target=target, step=step, now=now)


def _paired(writes: Sequence[tuple[Target, Step]]) -> list[tuple[Target, Write]]:
    """The writes, with a Node's annotations followed by its taint made one write where the Node has an
    annotations map (a start's protection, a stop's clean-up)."""
    paired: list[tuple[Target, Write]] = []
    for target, step in writes:
        if (
            isinstance(step, p.SetPreservedTaint)
            and paired
            and paired[-1][0] is target
            and isinstance(annotations := paired[-1][1], p.PatchNodeAnnotations)
            and isinstance(target, Snapshot)
            and target.node is not None
            and target.node.metadata.has_annotations
        ):
            paired[-1] = (target, NodeAnnotationsAndTaint(annotations=annotations, taint=step))
        else:
            paired.append((target, step))
    return paired


async def _answered(*, writer: Writer, writes: Sequence[tuple[Target, Step]], events: list[asyncio.Task[None]]) -> None:
    """Wait until every Event sent is answered (whatever the answer)."""
    if not events:
        return
    # Waiting for a Node's Event is waiting on the shoot's API server: the slot is free meanwhile.
    shoot = any(in_the_target_cluster(step) for _, step in writes if isinstance(step, p.RecordEvent))
    async with writer.slots.lent() if shoot else contextlib.nullcontext():
        await asyncio.gather(*events, return_exceptions=True)  # cancelled with this wait


def _raise_first_failure(events: list[asyncio.Task[None]]) -> None:
    for task in events:
        if (error := task.exception()) is not None:
            raise error


async def _write(*, writer: Writer, target: Target, step: Write, now: dt.datetime) -> None:
    try:
        with api_call():  # a request to the shoot gives the slot back while it waits (the shoot client's trace)
            await _execute_one(writer=writer, target=target, step=step, now=now)
    except Failed as error:
        if isinstance(error, NotFound) and not isinstance(step, p.RecordEvent):
            raise ObjectGone(f"{type(step).__name__}: {error.reason}") from error
        # A failed JSON-patch `test` op is answered 422; for our guarded patches that means "changed".
        guarded = isinstance(step, (p.SetPreservedTaint, NodeAnnotationsAndTaint))
        conflict = isinstance(error, Conflict) or (guarded and isinstance(error, Invalid))
        raise StepFailed(step, error, conflict=conflict) from error


async def execute_machine_plan(
    *, writer: Writer, snap: Snapshot, steps: Sequence[p.MachineStep], now: dt.datetime
) -> None:
    """A Machine plan's steps, on its snapshot (see `execute`)."""
    await execute(writer=writer, writes=[(snap, step) for step in steps], now=now)


async def execute_machine_set_plan(
    *, writer: Writer, machine_set: MachineSet, machines: Sequence[Machine], plan: p.MachineSetPlan, now: dt.datetime
) -> None:
    """A MachineSet plan: the machines' annotations, the Events about them, then the MachineSet's status (see
    `execute`)."""
    snaps = {m.metadata.name: Snapshot(machine=m, node=None) for m in machines}
    writes: list[tuple[Target, Step]] = [(snaps[name], patch) for name, patch in plan.machine_annotations.items()]
    writes += [(snaps[event.name], event) for event in plan.events if event.name in snaps]
    if plan.status is not None:
        writes.append((machine_set, plan.status))
    await execute(writer=writer, writes=writes, now=now)


def in_the_target_cluster(step: Write) -> bool:
    """Whether the step writes to the target cluster (a shoot's API server) rather than the control cluster."""
    if isinstance(step, p.RecordEvent):
        return step.kind == "Node"
    return isinstance(
        step, (p.PatchNodeAnnotations, p.SetPreservedTaint, p.SetPreservedCondition, NodeAnnotationsAndTaint)
    )


async def _execute_one(*, writer: Writer, target: Target, step: Write, now: dt.datetime) -> None:
    match target, step:
        case MachineSet(), p.PatchMachineSetStatus():
            await writer.patch_machine_set_status(target, step)
        case MachineDeployment(), p.PatchMachineDeploymentStatus():
            await writer.patch_machine_deployment_status(target, step)
        case Snapshot(), p.PatchMachineAnnotations():
            await writer.patch_machine_annotations(target, step)
        case Snapshot(), p.SetPreserveExpiry():
            await writer.set_preserve_expiry(target, step, now=now)
        case Snapshot(), p.SetMachinePhase():
            await writer.set_machine_phase(target, step, now=now)
        case Snapshot(), p.DeleteMachine():
            await writer.delete_machine(target)
        case Snapshot(), p.PatchNodeAnnotations():
            await writer.patch_node_annotations(target, step)
        case Snapshot(), p.SetPreservedTaint():
            await writer.set_preserved_taint(target, step, now=now)
        case Snapshot(), NodeAnnotationsAndTaint():
            await writer.patch_node_annotations_and_taint(target, step, now=now)
        case Snapshot(), p.SetPreservedCondition():
            await writer.set_preserved_condition(target, step)
        case Snapshot(), p.RecordEvent():
            await writer.record_event(target, step, now=now)
        case _:
            raise TypeError(f"no executor for plan step {step!r} on {type(target).__name__}")
