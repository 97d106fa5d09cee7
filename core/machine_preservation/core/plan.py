"""The contract between the pure core and the controller shell: a plan of desired changes.

The core looks at a snapshot (objects + config + now) and returns a `MachinePlan` (or a
`MachineSetPlan`): an ordered tuple of steps, the drain that follows them (if any), and when to look again.
The shell executes the steps in order, each as one idempotent API write, and stops at the first failure (the
next reconcile recomputes the plan from the objects). Then it drains, writing the drain's `alongside` steps
meanwhile, and asks the core (`lifecycle.plan_after_drain`) what the outcome writes. The order is what makes a
crash at any point safe: for a start the preservation record (Machine annotations) is written first, for a stop
it is removed last, so an interrupted stop is finished rather than mistaken for "not preserved".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from machine_preservation.core.preservation_record import PreservationRecord


@dataclass(frozen=True)
class PatchMachineAnnotations:
    """Set and remove annotations on the Machine (metadata)."""

    set: Mapping[str, str] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    # Written only once every Event before it in the plan has been recorded, and not at all if one failed: it
    # acknowledges them. The shell sends Events without holding up the other writes.
    after_events: bool = False


@dataclass(frozen=True)
class SetPreserveExpiry:
    """Mirror the expiry into `status.currentStatus.preserveExpiryTime` (None clears it), with
    `lastUpdateTime = now`; only where the Machine CRD keeps the field. Never read back as the record."""

    expiry: dt.datetime | None


@dataclass(frozen=True)
class SetMachinePhase:
    """Write `status.currentStatus.phase` (recovery Failed → Running when MCM has not)."""

    phase: str


@dataclass(frozen=True)
class DeleteMachine:
    """Delete the Machine (a Failed machine whose preservation ended)."""


@dataclass(frozen=True)
class PatchNodeAnnotations:
    """Set and remove annotations on the Node (metadata)."""

    set: Mapping[str, str] = field(default_factory=dict)
    remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class SetPreservedTaint:
    """Add (present=True) or remove the `node.machine.sapcloud.io/preserved:NoSchedule` taint."""

    present: bool


@dataclass(frozen=True)
class SetPreservedCondition:
    """Write the Node's `Preserved` condition (node status subresource)."""

    status: str  # "True" | "False"
    reason: str
    message: str
    last_transition_time: dt.datetime


@dataclass(frozen=True)
class DrainNode:
    """Evict the node's pods (Eviction API; DaemonSet and mirror pods stay), once the plan's steps are written.

    The shell drains, writing `alongside` meanwhile, then executes `core.lifecycle.plan_after_drain`, which
    records the outcome in the preservation record (so a done drain is not repeated and a failed one is paced)
    and in the condition. The shell runs at most one drain per node at a time.
    """

    # What the outcome needs (the plan-time view; a stale one is corrected by the next plan).
    record: PreservationRecord | None = None  # the preservation in force (may have been written by this plan)
    reason: str = ""  # the Preserved condition reason (ConditionReason)
    expiry: dt.datetime | None = None  # the record's expiry, rendered into the condition message
    # How long evictions are retried after the first failed drain: the Machine's spec.drainTimeout, else
    # PreservationConfig.drain_timeout. Past it, `evict` is False: the shell only looks whether the node has
    # become empty (someone removed the blocking pods) and evicts nothing.
    timeout: dt.timedelta | None = None
    evict: bool = True
    # The Node's preservation fields (core.node_fields) as the plan's steps leave them, which the outcome's differ from.
    node_fields: Mapping[str, str] = field(default_factory=dict)
    # Written in order while the evictions run, as they tell about the drain but nothing about it waits for them
    # (the "being drained" condition, the acknowledgement of a start's Events). A failure among them fails the
    # plan once the drain has ended: its outcome is not written, and the next plan starts over.
    alongside: tuple[MachineStep, ...] = ()


@dataclass(frozen=True)
class RecordEvent:
    """A Kubernetes Event on the Machine or the Node."""

    kind: str  # "Machine" | "Node"
    name: str
    type: str  # "Normal" | "Warning"
    reason: str  # CamelCase, e.g. "PreservationStarted"
    message: str
    # Recorded at most once (an observation re-made on every look), instead of counting repeats.
    once: bool = False
    # What makes two Events one: the message, unless a key names the happening itself (a message written again
    # after a restart may say it differently).
    key: str = ""


MachineStep = (
    PatchMachineAnnotations
    | SetPreserveExpiry
    | SetMachinePhase
    | DeleteMachine
    | PatchNodeAnnotations
    | SetPreservedTaint
    | SetPreservedCondition
    | RecordEvent
)


@dataclass(frozen=True)
class MachinePlan:
    steps: tuple[MachineStep, ...] = ()
    # Drain the node once the steps are written (by then the taint keeps new pods away).
    drain: DrainNode | None = None
    # Look again after this long even if nothing changes (e.g. exactly at preserveExpiryTime).
    requeue_after: dt.timedelta | None = None


@dataclass(frozen=True)
class PatchMachineSetStatus:
    auto_preserve_failed_machine_count: int
    preserved_failed_replicas: int


@dataclass(frozen=True)
class PatchMachineDeploymentStatus:
    preserved_failed_replicas: int


@dataclass(frozen=True)
class MachineSetPlan:
    """Per-MachineSet decisions: auto value granted/released (as Machine annotation patches by name)."""

    machine_annotations: Mapping[str, PatchMachineAnnotations] = field(default_factory=dict)
    status: PatchMachineSetStatus | None = None
    events: tuple[RecordEvent, ...] = ()
