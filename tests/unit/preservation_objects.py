"""Builders of Machines, Nodes and MachineSets for the core's decision tests, with readable defaults."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, MachineSet, Node
from machine_preservation.core.preservation_record import DrainRecord, PreservationRecord

NOW = dt.datetime(2026, 8, 20, 10, 0, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
ABSENT = object()  # "leave this annotation out", as opposed to an empty value


def _annotations(**values: object) -> dict[str, str]:
    keys = {
        "preserve": v.PRESERVE_ANNOTATION,
        "last_applied": v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION,
        "priority": v.MACHINE_PRIORITY_ANNOTATION,
        "last_priority": v.LAST_MACHINE_PRIORITY_ANNOTATION,
        "reported_invalid": v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION,
        "ca": v.CA_SCALE_DOWN_DISABLED_ANNOTATION,
        "ca_marker": v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
        "mcm_marker": v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,
    }
    return {keys[name]: value for name, value in values.items() if value is not ABSENT and isinstance(value, str)}


def machine(
    *,
    name: str = "m1",
    node: str = "n1",
    phase: str = v.MachinePhase.RUNNING,
    expiry: dt.datetime | None = None,
    since: dt.datetime | None = None,
    by: v.PreservedBy = v.PreservedBy.USER,
    drain: DrainRecord | None = None,
    mirrored: dt.datetime | None = None,
    added_ca: bool = False,
    preserve: object = ABSENT,
    last_applied: object = ABSENT,
    priority: object = ABSENT,
    last_priority: object = ABSENT,
    reported_invalid: object = ABSENT,
    timeout: str | None = None,
    drain_timeout: str | None = None,
    created: dt.datetime | None = None,
    failed_at: dt.datetime | None = None,
    owner: str = "ms1",
    deleting: bool = False,
    node_gone_since: dt.datetime | None = None,
) -> Machine:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {v.NODE_LABEL: node} if node else {},
            "annotations": _annotations(
                preserve=preserve,
                last_applied=last_applied,
                priority=priority,
                last_priority=last_priority,
                reported_invalid=reported_invalid,
            ),
            "creationTimestamp": (created or NOW - 100 * HOUR).isoformat(),
            "ownerReferences": [{"kind": "MachineSet", "name": owner, "uid": f"uid-{owner}", "controller": True}],
        },
        "spec": {"machinePreserveTimeout": timeout, "drainTimeout": drain_timeout},
        "status": {
            "currentStatus": {
                "phase": phase,
                "preserveExpiryTime": mirrored.isoformat() if mirrored else None,
                "lastUpdateTime": failed_at.isoformat() if failed_at else None,
            }
        },
    }
    if expiry is not None:
        # The record of a preservation that started `since` (default: a 72h one that ends at `expiry`).
        record = PreservationRecord(
            since=since or expiry - 72 * HOUR,
            until=expiry,
            by=by,
            drain=drain,
            added_ca_annotation=added_ca,
            node_gone_since=node_gone_since,
        )
        body["metadata"]["annotations"].update(record.annotations())
    if deleting:
        body["metadata"]["deletionTimestamp"] = NOW.isoformat()
    return Machine.model_validate(body)


def preserved_condition(
    *,
    status: str = "True",
    reason: str = v.ConditionReason.PRESERVED_BY_USER,
    message: str = "",
    transition: dt.datetime | None = None,
) -> dict[str, Any]:
    return {
        "type": v.PRESERVED_CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (transition or NOW - 10 * HOUR).isoformat(),
    }


def node(
    *,
    name: str = "n1",
    preserve: object = ABSENT,
    ca: object = ABSENT,
    ca_marker: object = ABSENT,
    mcm_marker: object = ABSENT,
    ready: str = "False",
    tainted: bool = False,
    unschedulable: bool = False,
    condition: dict[str, Any] | None = None,
    extra_conditions: tuple[dict[str, Any], ...] = (),
    fields: Mapping[str, str] | None = None,
) -> Node:
    """A Node; `fields` are its preservation fields (`node_fields_of`)."""
    conditions = [{"type": v.NODE_READY_CONDITION_TYPE, "status": ready}, *extra_conditions]
    if condition is not None:
        conditions.append(condition)
    taints = [{"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT}] if tainted else []
    return Node.model_validate(
        {
            "metadata": {
                "name": name,
                "annotations": {
                    **_annotations(preserve=preserve, ca=ca, ca_marker=ca_marker, mcm_marker=mcm_marker),
                    **(fields or {}),
                },
            },
            "spec": {"taints": [{"key": "other", "effect": "NoExecute"}, *taints], "unschedulable": unschedulable},
            "status": {"conditions": conditions},
        }
    )


def node_fields_of(m: Machine, drain: str | None = None, **drain_fields: str) -> dict[str, str]:
    """The preservation fields a preserved machine's converged Node carries: its record's since, until and by, the
    drain state `drain`, and `pods_left`/`blocked_by`."""
    record = m.metadata.annotations
    fields = {
        key: record[key]
        for key in (v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION)
    }
    if drain is not None:
        fields[v.PRESERVED_DRAIN_ANNOTATION] = drain
    keys = {"pods_left": v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION, "blocked_by": v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION}
    return {**fields, **{keys[name]: value for name, value in drain_fields.items()}}


def machine_set(
    *,
    name: str = "ms1",
    max_auto: int = 0,
    count: int = 0,
    preserved_failed: int = 0,
    deployment: str | None = "md1",
    revision: str | None = None,
    created: dt.datetime | None = None,
    deleting: bool = False,
) -> MachineSet:
    metadata: dict[str, Any] = {
        "name": name,
        "annotations": {v.MACHINE_SET_REVISION_ANNOTATION: revision} if revision is not None else {},
        "creationTimestamp": (created or NOW - 200 * HOUR).isoformat(),
        "ownerReferences": (
            [{"kind": "MachineDeployment", "name": deployment, "uid": f"uid-{deployment}", "controller": True}]
            if deployment
            else []
        ),
    }
    if deleting:
        metadata["deletionTimestamp"] = NOW.isoformat()
    return MachineSet.model_validate(
        {
            "metadata": metadata,
            "spec": {"autoPreserveFailedMachineMax": max_auto},
            "status": {"autoPreserveFailedMachineCount": count, "preservedFailedReplicas": preserved_failed},
        }
    )


def with_phase(m: Machine, phase: str) -> Machine:
    """The machine after MCM moved it to `phase`."""
    current = m.status.current_status.model_copy(update={"phase": phase})
    return m.model_copy(update={"status": m.status.model_copy(update={"current_status": current})})
