"""The Gardener Extension contract as pure decisions: what to do with an `Extension` object, and the status
bodies to write.

gardenlet drives an extension through its `extensions.gardener.cloud/v1alpha1 Extension` object (one per shoot,
named after the type, in the shoot namespace) and waits on it. This module says, from a snapshot of that object:

- whether to act at all, and which operation (`decide`): an operation is wanted when the annotation
  `gardener.cloud/operation` asks for one (`reconcile`, `migrate`, `restore`), when the object is being
  deleted, or when the last operation did not succeed (a retry, also after a restart). `wait-for-state` (set
  by gardenlet while it restores `status.state`) means hands off. The operation is the first that applies of:
  migrate annotation → Migrate; deletion → Delete; restore annotation → Restore; no last operation → Create;
  an unfinished Create, Migrate or Restore → the same again; otherwise Reconcile. Nothing is done for a shoot
  whose last operation Failed, for an object already migrated away (unless it is migrated or restored again),
  or for a deletion when our finalizer is not there (we never set anything up);
- the JSON merge patches of the status subresource that report an operation: Processing (progress 1), then
  Succeeded (progress 100, `observedGeneration`, `lastError` cleared) or Error (progress 50, `lastError`, its
  description at most 2 KiB);
- the `ControlPlaneHealthy` condition (its times move only on change) and the heartbeat Lease that makes
  gardenlet believe the extension's conditions.

`decide` is level-based: called again after an Error it returns the same operation, so the caller must space
its retries (Gardener's controllers requeue failed reconciles with a growing backoff).

One difference from Gardener's library, on purpose: Gardener drops a `reconcile` annotation even when it then
skips the object (Failed shoot, migrated object); `decide` returns None there and leaves the annotation alone.
gardenlet does not ask a Failed or migrated shoot's extension to reconcile, so nobody waits on it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from machine_preservation.core.admission.field_errors import shorten
from machine_preservation.core.gardener import provider_config
from machine_preservation.core.preservation_record import format_timestamp

EXTENSION_TYPE: Final = provider_config.EXTENSION_TYPE
SHOOT_CLASS: Final = "shoot"
API_GROUP: Final = "extensions.gardener.cloud"
API_VERSION: Final = "extensions.gardener.cloud/v1alpha1"
KIND: Final = "Extension"
PLURAL: Final = "extensions"

FINALIZER: Final = f"{API_GROUP}/{EXTENSION_TYPE}"

OPERATION_ANNOTATION: Final = "gardener.cloud/operation"
TIMESTAMP_ANNOTATION: Final = "gardener.cloud/timestamp"
DELETION_CONFIRMATION_ANNOTATION: Final = "confirmation.gardener.cloud/deletion"

HEARTBEAT_LEASE_NAME: Final = "gardener-extension-heartbeat"
HEARTBEAT_RENEW_SECONDS: Final = 30

CONTROL_PLANE_HEALTHY: Final = "ControlPlaneHealthy"


class Operation(StrEnum):
    """Values of the `gardener.cloud/operation` annotation that concern an extension."""

    RECONCILE = "reconcile"
    MIGRATE = "migrate"
    RESTORE = "restore"
    WAIT_FOR_STATE = "wait-for-state"


class OperationType(StrEnum):
    """`status.lastOperation.type`."""

    CREATE = "Create"
    RECONCILE = "Reconcile"
    DELETE = "Delete"
    MIGRATE = "Migrate"
    RESTORE = "Restore"


class OperationState(StrEnum):
    """`status.lastOperation.state` (and the Shoot's: only Failed matters to us there)."""

    PROCESSING = "Processing"
    SUCCEEDED = "Succeeded"
    ERROR = "Error"
    FAILED = "Failed"
    PENDING = "Pending"
    ABORTED = "Aborted"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"
    PROGRESSING = "Progressing"  # Gardener's health checks: not there yet, and not (yet) a failure


class HealthReason(StrEnum):
    """The reasons of Gardener's health-check library (extensions/pkg/controller/healthcheck), which gardenlet
    merges into the Shoot's conditions."""

    SUCCESSFUL = "HealthCheckSuccessful"
    UNSUCCESSFUL = "HealthCheckUnsuccessful"
    PROGRESSING = "HealthCheckProgressing"


class ErrorCode(StrEnum):
    """The `lastError.codes` gardenlet understands that can come from this extension."""

    CONFIGURATION_PROBLEM = "ERR_CONFIGURATION_PROBLEM"
    RETRYABLE_CONFIGURATION_PROBLEM = "ERR_RETRYABLE_CONFIGURATION_PROBLEM"
    INFRA_DEPENDENCIES = "ERR_INFRA_DEPENDENCIES"
    RETRYABLE_INFRA_DEPENDENCIES = "ERR_RETRYABLE_INFRA_DEPENDENCIES"
    CLEANUP_CLUSTER_RESOURCES = "ERR_CLEANUP_CLUSTER_RESOURCES"
    PROBLEMATIC_WEBHOOK = "ERR_PROBLEMATIC_WEBHOOK"


PROGRESS_PROCESSING: Final = 1
PROGRESS_ERROR: Final = 50
PROGRESS_SUCCEEDED: Final = 100


# --- the object, as read -----------------------------------------------------------------------------------


class _Model(BaseModel):
    """Tolerant: unknown fields kept (extra), absent or null ones take zero values, times stay text (see
    `parse_timestamp`), so no Extension an API server accepts makes the controller fail to read it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)


def _none_as_empty(value: Any, empty: Any) -> Any:
    return empty if value is None else value


class LastOperation(_Model):
    type: str = ""
    state: str = ""
    progress: int = 0
    description: str = ""
    last_update_time: str | None = None


class LastError(_Model):
    description: str = ""
    task_id: str | None = Field(default=None, alias="taskID")
    codes: list[str] = Field(default_factory=list)
    last_update_time: str | None = None

    @field_validator("codes", mode="before")
    @classmethod
    def _codes(cls, value: Any) -> Any:
        return _none_as_empty(value, [])


class Condition(_Model):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    codes: list[str] = Field(default_factory=list)
    last_transition_time: str | None = None
    last_update_time: str | None = None

    @field_validator("codes", mode="before")
    @classmethod
    def _codes(cls, value: Any) -> Any:
        return _none_as_empty(value, [])


class ExtensionMeta(_Model):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    deletion_timestamp: str | None = None

    @field_validator("labels", "annotations", mode="before")
    @classmethod
    def _maps(cls, value: Any) -> Any:
        return _none_as_empty(value, {})

    @field_validator("finalizers", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _none_as_empty(value, [])


class ExtensionSpec(_Model):
    type: str = ""
    # Where the extension runs for this object (Gardener ≥ v1.119): `shoot` (the default when absent), `seed` or
    # `garden`. This extension serves shoots only.
    class_: str | None = Field(default=None, alias="class")
    provider_config: Any = None


class ExtensionStatus(_Model):
    last_operation: LastOperation | None = None
    last_error: LastError | None = None
    observed_generation: int = 0
    state: Any = None
    conditions: list[Condition] = Field(default_factory=list)

    @field_validator("conditions", mode="before")
    @classmethod
    def _conditions(cls, value: Any) -> Any:
        return _none_as_empty(value, [])


class Extension(_Model):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ExtensionMeta = Field(default_factory=ExtensionMeta)
    spec: ExtensionSpec = Field(default_factory=ExtensionSpec)
    status: ExtensionStatus = Field(default_factory=ExtensionStatus)

    @field_validator("metadata", "spec", "status", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _none_as_empty(value, {})

    @property
    def operation_annotation(self) -> str | None:
        return self.metadata.annotations.get(OPERATION_ANNOTATION)

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None

    @property
    def ours(self) -> bool:
        """Whether this extension serves the object, as Gardener's predicates select it (`HasType`, `HasClass`): our
        type, and the shoot class (the default)."""
        return self.spec.type == EXTENSION_TYPE and self.spec.class_ in (None, "", SHOOT_CLASS)


# --- what to do ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One operation on an Extension, and the metadata steps around it, in this order:

    1. `remove_annotation_first`: drop `gardener.cloud/operation` (its value is `reconcile`) before any work,
       keeping `gardener.cloud/timestamp`; a new `reconcile` arriving during the work then triggers again;
    2. `add_finalizer`: add FINALIZER before reporting Processing (Create, Reconcile, Restore);
    3. status Processing, the work, status Succeeded (or Error, and stop there);
    4. after Succeeded: `remove_finalizer` (Delete: ours) or `remove_all_finalizers` (Migrate: the object is
       handed over to the new seed and must be deletable here), then `remove_annotation_after` (Migrate and
       Restore drop `gardener.cloud/operation` only once done, so that gardenlet sees them finished; not when
       step 1 already dropped a `reconcile`, so a request arriving meanwhile is not lost).
    """

    type: OperationType
    remove_annotation_first: bool
    add_finalizer: bool
    remove_finalizer: bool
    remove_all_finalizers: bool
    remove_annotation_after: bool

    @property
    def processing_description(self) -> str:
        return _DESCRIPTIONS[self.type][0]

    @property
    def succeeded_description(self) -> str:
        return _DESCRIPTIONS[self.type][1]

    @property
    def error_description(self) -> str:
        return _DESCRIPTIONS[self.type][2]


_DESCRIPTIONS: Final[Mapping[OperationType, tuple[str, str, str]]] = {
    OperationType.CREATE: (
        "Reconciling the Extension",
        "Successfully reconciled the Extension",
        "Error reconciling the Extension",
    ),
    OperationType.RECONCILE: (
        "Reconciling the Extension",
        "Successfully reconciled the Extension",
        "Error reconciling the Extension",
    ),
    OperationType.DELETE: (
        "Deleting the Extension",
        "Successfully deleted the Extension",
        "Error deleting the Extension",
    ),
    OperationType.MIGRATE: (
        "Migrating the Extension",
        "Successfully migrated the Extension",
        "Error migrating the Extension",
    ),
    OperationType.RESTORE: (
        "Restoring the Extension",
        "Successfully restored the Extension",
        "Error restoring the Extension",
    ),
}

_UNFINISHED_KEEP_TYPE: Final = frozenset({OperationType.CREATE, OperationType.MIGRATE, OperationType.RESTORE})
_REQUESTED: Final = frozenset({Operation.RECONCILE, Operation.MIGRATE, Operation.RESTORE})


def operation_type(extension: Extension) -> OperationType:
    """The operation the object's state calls for (the first rule that applies; see the module docstring)."""
    annotation = extension.operation_annotation
    last = extension.status.last_operation
    if annotation == Operation.MIGRATE:
        return OperationType.MIGRATE
    if extension.deleting:
        return OperationType.DELETE
    if annotation == Operation.RESTORE:
        return OperationType.RESTORE
    if last is None:
        return OperationType.CREATE
    if last.state != OperationState.SUCCEEDED and last.type in _UNFINISHED_KEEP_TYPE:
        return OperationType(last.type)
    return OperationType.RECONCILE


def is_migrated(extension: Extension) -> bool:
    """The last operation is a successful Migrate: the shoot now belongs to another seed."""
    last = extension.status.last_operation
    return last is not None and last.type == OperationType.MIGRATE and last.state == OperationState.SUCCEEDED


def wants_attention(extension: Extension) -> bool:
    """An operation is asked for: the annotation requests one, the object is being deleted, or the last
    operation has not succeeded (none yet, Processing after a restart, Error to retry)."""
    last = extension.status.last_operation
    return (
        extension.operation_annotation in _REQUESTED
        or extension.deleting
        or last is None
        or last.state != OperationState.SUCCEEDED
    )


def decide(extension: Extension, *, shoot_failed: bool) -> Action | None:
    """What to do with the Extension now; None for nothing.

    `shoot_failed`: the shoot's last operation (the `Cluster`'s `spec.shoot.status.lastOperation.state`) is
    Failed; False when the namespace is no shoot's."""
    if extension.operation_annotation == Operation.WAIT_FOR_STATE:
        return None
    if not wants_attention(extension) or shoot_failed:
        return None
    kind = operation_type(extension)
    if kind not in (OperationType.MIGRATE, OperationType.RESTORE) and is_migrated(extension):
        return None
    has_finalizer = FINALIZER in extension.metadata.finalizers
    remove_first = extension.operation_annotation == Operation.RECONCILE
    if kind == OperationType.MIGRATE:
        return Action(kind, remove_first, False, False, True, not remove_first)
    if kind == OperationType.DELETE:
        if not has_finalizer:
            return None
        return Action(kind, remove_first, False, True, False, False)
    if kind == OperationType.RESTORE:
        return Action(kind, remove_first, not has_finalizer, False, False, not remove_first)
    return Action(kind, remove_first, not has_finalizer, False, False, False)


def shoot_failed(cluster: Mapping[str, Any] | None) -> bool:
    """Whether the shoot in a `Cluster` object (as read, JSON) Failed; False for no Cluster or no shoot."""
    spec = cluster.get("spec") if isinstance(cluster, Mapping) else None
    shoot = spec.get("shoot") if isinstance(spec, Mapping) else None
    status = shoot.get("status") if isinstance(shoot, Mapping) else None
    last = status.get("lastOperation") if isinstance(status, Mapping) else None
    return isinstance(last, Mapping) and last.get("state") == OperationState.FAILED


def asks_for_work(old: Extension, new: Extension) -> bool:
    """Whether an update of an Extension is one gardenlet drives us with (as Gardener's extension predicates
    select): a new generation, an operation annotation set or changed (not removed: that is our own write), a new
    timestamp, the deletion; not a status change."""
    old_annotations, new_annotations = old.metadata.annotations, new.metadata.annotations
    operation = new_annotations.get(OPERATION_ANNOTATION)
    return (
        old.metadata.generation != new.metadata.generation
        or (operation is not None and operation != old_annotations.get(OPERATION_ANNOTATION))
        or old_annotations.get(TIMESTAMP_ANNOTATION) != new_annotations.get(TIMESTAMP_ANNOTATION)
        or old.deleting != new.deleting
    )


# --- metadata patches ----------------------------------------------------------------------------------------


def remove_operation_annotation_patch(resource_version: str = "") -> dict[str, Any]:
    """Merge patch dropping `gardener.cloud/operation` (and nothing else: the timestamp stays). With a
    resourceVersion, the API server refuses it when the object changed meanwhile."""
    metadata: dict[str, Any] = {"annotations": {OPERATION_ANNOTATION: None}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


def finalizers_patch(
    extension: Extension, *, add: bool = False, remove: bool = False, clear: bool = False
) -> dict[str, Any] | None:
    """Merge patch setting the finalizer list (with the resourceVersion read, so a concurrent change of the
    list is refused, not lost); None when the list would not change."""
    current = list(extension.metadata.finalizers)
    if clear:
        wanted: list[str] = []
    elif add:
        wanted = current if FINALIZER in current else [*current, FINALIZER]
    elif remove:
        wanted = [name for name in current if name != FINALIZER]
    else:
        wanted = current
    if wanted == current:
        return None
    return {"metadata": {"finalizers": wanted, "resourceVersion": extension.metadata.resource_version}}


# --- status patches (for the status subresource) -------------------------------------------------------------


def _last_operation(
    op: OperationType, state: OperationState, progress: int, now: dt.datetime, text: str
) -> dict[str, Any]:
    return {
        "type": str(op),
        "state": str(state),
        "progress": progress,
        "description": text,
        "lastUpdateTime": format_timestamp(now),
    }


def processing(op: OperationType, now: dt.datetime, description: str) -> dict[str, Any]:
    """Status patch: the operation started (progress 1). `lastError` and the rest stay as they are."""
    return {
        "status": {
            "lastOperation": _last_operation(op, OperationState.PROCESSING, PROGRESS_PROCESSING, now, description)
        }
    }


def succeeded(
    op: OperationType, now: dt.datetime, *, generation: int, description: str, state: Any = None
) -> dict[str, Any]:
    """Status patch: the operation finished (progress 100), the generation is observed, `lastError` cleared;
    `state` (what must survive a migration) written when given."""
    status: dict[str, Any] = {
        "lastOperation": _last_operation(op, OperationState.SUCCEEDED, PROGRESS_SUCCEEDED, now, description),
        "lastError": None,
        "observedGeneration": generation,
    }
    if state is not None:
        status["state"] = state
    return {"status": status}


def error_text(description: str, cause: str) -> str:
    """`<description>: <cause>` with a capital first letter, as Gardener words its errors."""
    text = f"{description}: {cause}" if cause else description
    return text[:1].upper() + text[1:]


def error(
    op: OperationType,
    now: dt.datetime,
    *,
    generation: int,
    description: str,
    codes: Iterable[ErrorCode | str] = (),
) -> dict[str, Any]:
    """Status patch: the operation failed (progress 50) with `lastError` {description, codes, lastUpdateTime}.
    The generation counts as observed (it was worked on), so gardenlet reports the error, not a stale object.
    The description is cut to MAX_MESSAGE_BYTES (2 KiB): a cause quoting much input must neither bloat the object
    nor make the patch too large to be written, which would leave the Extension in Processing."""
    description = shorten(description)
    stamp = format_timestamp(now)
    listed = sorted({str(code) for code in codes})
    return {
        "status": {
            "lastOperation": _last_operation(op, OperationState.ERROR, PROGRESS_ERROR, now, description),
            "lastError": {
                "description": description,
                "codes": listed or None,
                "taskID": None,
                "lastUpdateTime": stamp,
            },
            "observedGeneration": generation,
        }
    }


# --- conditions ------------------------------------------------------------------------------------------------


def updated_condition(
    previous: Condition | None,
    *,
    condition_type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: dt.datetime,
    codes: Iterable[ErrorCode | str] = (),
) -> dict[str, Any]:
    """The condition as it should read now: `lastTransitionTime` moves only when the status changes,
    `lastUpdateTime` only when the reason, message or codes change; so an unchanged verdict gives an unchanged
    condition (nothing to write)."""
    stamp = format_timestamp(now)
    listed = sorted({str(code) for code in codes})
    message = message or "No message given."
    reason = reason or "Unspecified"
    transition = stamp
    update = stamp
    if previous is not None:
        if previous.status == status and previous.last_transition_time:
            transition = previous.last_transition_time
        unchanged = previous.reason == reason and previous.message == message and sorted(previous.codes) == listed
        if unchanged and previous.last_update_time:
            update = previous.last_update_time
    condition: dict[str, Any] = {
        "type": condition_type,
        "status": str(status),
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "lastUpdateTime": update,
    }
    if listed:
        condition["codes"] = listed
    return condition


def _as_dict(condition: Condition) -> dict[str, Any]:
    dumped = condition.model_dump(by_alias=True, exclude_none=True)
    if not dumped.get("codes"):
        dumped.pop("codes", None)
    return dumped


def control_plane_healthy(
    extension: Extension,
    *,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: dt.datetime,
    codes: Iterable[ErrorCode | str] = (),
) -> dict[str, Any] | None:
    """Status patch setting the ControlPlaneHealthy condition (other conditions kept: a merge patch replaces the
    whole list); None when the condition already reads so."""
    conditions = extension.status.conditions
    previous = next((c for c in conditions if c.type == CONTROL_PLANE_HEALTHY), None)
    wanted = updated_condition(
        previous,
        condition_type=CONTROL_PLANE_HEALTHY,
        status=status,
        reason=reason,
        message=message,
        now=now,
        codes=codes,
    )
    if previous is not None and _same(previous, wanted):
        return None
    merged = [wanted if c.type == CONTROL_PLANE_HEALTHY else _as_dict(c) for c in conditions]
    if previous is None:
        merged.append(wanted)
    return {"status": {"conditions": merged}}


def _same(previous: Condition, wanted: Mapping[str, Any]) -> bool:
    known: dict[str, Any] = {
        "type": previous.type,
        "status": previous.status,
        "reason": previous.reason,
        "message": previous.message,
        "lastTransitionTime": previous.last_transition_time,
        "lastUpdateTime": previous.last_update_time,
    }
    if previous.codes:
        known["codes"] = sorted(previous.codes)
    return known == dict(wanted)


# --- heartbeat ------------------------------------------------------------------------------------------------


def format_micro_time(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with microseconds, as the API server writes a MicroTime (Lease renewTime)."""
    utc = moment.astimezone(dt.UTC) if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def heartbeat_lease(
    namespace: str,
    now: dt.datetime,
    *,
    holder: str = EXTENSION_TYPE,
    renew_seconds: int = HEARTBEAT_RENEW_SECONDS,
) -> dict[str, Any]:
    """The Lease `gardener-extension-heartbeat` in the extension's namespace, renewed now. gardenlet reads its
    renewTime to decide whether the conditions this extension writes are current."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": HEARTBEAT_LEASE_NAME, "namespace": namespace},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": renew_seconds,
            "renewTime": format_micro_time(now),
        },
    }
