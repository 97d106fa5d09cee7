"""Every annotation, label, taint, condition and value the product reads or writes.

Exact strings follow upstream machine-controller-manager, except the auto value we write (`auto-preserve`;
upstream's `auto-preserved` is read as the same).
"""

from enum import StrEnum
from typing import Final

PRESERVE_ANNOTATION: Final = "node.machine.sapcloud.io/preserve"
LAST_APPLIED_NODE_PRESERVE_ANNOTATION: Final = "node.machine.sapcloud.io/last-applied-node-preserve-value"

CA_SCALE_DOWN_DISABLED_ANNOTATION: Final = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION: Final = "cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm"
CA_SCALE_DOWN_DISABLED_VALUE: Final = "true"
# Our ownership marker of the CA annotation on a Node, where MCM does not preserve natively. Not MCM's `-by-mcm`:
# MCM v0.61 removes every `scale-down-disabled` carrying that marker from the nodes of a complete
# MachineDeployment on each of its syncs (its clean-up after a rollout), preserved or not.
CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION: Final = (
    "node.machine.sapcloud.io/scale-down-disabled-by-preservation"
)

MACHINE_PRIORITY_ANNOTATION: Final = "machinepriority.machine.sapcloud.io"
# Our own record of the priority a machine had before preservation raised it, so stop can restore it.
LAST_MACHINE_PRIORITY_ANNOTATION: Final = "node.machine.sapcloud.io/last-machine-priority"
DEFAULT_MACHINE_PRIORITY: Final = 3

PRESERVED_TAINT_KEY: Final = "node.machine.sapcloud.io/preserved"
PRESERVED_TAINT_EFFECT: Final = "NoSchedule"

NODE_LABEL: Final = "node"
# MCM's label on each Node it manages, naming the node's Machine (`machineutils.MachineLabelKey`): how a shoot's
# user, who cannot read the seed's Machines, tells a node of an MCM-managed pool (the kubectl plugin).
MCM_MACHINE_NAME_LABEL: Final = "node.gardener.cloud/machine-name"
FORCE_DRAIN_LABEL: Final = "force-drain"

PRESERVED_CONDITION_TYPE: Final = "Preserved"
NODE_READY_CONDITION_TYPE: Final = "Ready"
# Node conditions that make MCM consider a node unhealthy when True (MCM's `--node-conditions` default).
DEFAULT_UNHEALTHY_NODE_CONDITIONS: Final = (
    "KernelDeadlock",
    "ReadonlyFilesystem",
    "DiskPressure",
    "NetworkUnavailable",
)

# MCM's rollout sequence number of a MachineSet (copied from Kubernetes Deployments); a rollback raises it.
MACHINE_SET_REVISION_ANNOTATION: Final = "deployment.kubernetes.io/revision"


class PreserveValue(StrEnum):
    """Values of the preserve annotation (case-sensitive; whitespace is significant). NONE is "no preference":
    the annotation absent or `""` (and an invalid value, which counts as absent)."""

    NOW = "now"
    WHEN_FAILED = "when-failed"
    FALSE = "false"
    AUTO = "auto-preserve"
    NONE = ""


# Upstream's spelling of the auto value: read as PreserveValue.AUTO; written only to hand a machine over to an
# MCM that preserves natively.
UPSTREAM_AUTO_PRESERVE_VALUE: Final = "auto-preserved"
USER_PRESERVE_VALUES: Final = ("now", "when-failed", "false")
AUTO_PRESERVE_VALUES: Final = (PreserveValue.AUTO.value, UPSTREAM_AUTO_PRESERVE_VALUE)
# `""` means "no preference" (not a valid value for upstream MCM); it is valid everywhere a user may write.
USER_ALLOWED_VALUES: Final = ("", *USER_PRESERVE_VALUES)

# Our record (on the Machine) of the invalid preserve values already reported with a Warning Event,
# so each distinct invalid value is reported once instead of on every reconcile.
REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION: Final = "node.machine.sapcloud.io/reported-invalid-preserve-values"

# The record of a running preservation, on the Machine. Annotations survive every MCM version's writes
# (MCM v0.61 drops status fields its types do not know, and its CRDs prune them), so they are the source of
# truth; `status.currentStatus.preserveExpiryTime` only mirrors the expiry where the CRD keeps it.
PRESERVED_SINCE_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-since"  # RFC 3339
PRESERVED_UNTIL_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-until"  # RFC 3339, as written
PRESERVED_BY_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-by"  # PreservedBy
# "true" once this preservation added the CA annotation (and its marker) to the node: only then does the stop
# remove them. The node-side marker alone proves nothing, anyone able to update nodes can write it.
PRESERVED_ADDED_CA_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-added-scale-down-disabled"
# The drain of the current failure (present only while the machine is Failed and preserved).
PRESERVED_DRAIN_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-drain"  # DrainOutcome
PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-drain-failing-since"
PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-drain-last-attempt"
# "true" from the record's first write until its PreservationStarted Events are recorded: a controller that
# dies in between announces the start after its restart (absent on records of earlier versions: announced).
PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-announcement-pending"
# RFC 3339: since when the preserved machine's Node is gone (deleted by a person or a cloud-controller-manager);
# absent while it exists. A Node of that name registering again is the same machine's, and takes the preservation.
PRESERVED_NODE_GONE_SINCE_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-node-gone-since"

PRESERVATION_RECORD_ANNOTATIONS: Final = (
    PRESERVED_SINCE_ANNOTATION,
    PRESERVED_UNTIL_ANNOTATION,
    PRESERVED_BY_ANNOTATION,
    PRESERVED_ADDED_CA_ANNOTATION,
    PRESERVED_DRAIN_ANNOTATION,
    PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION,
    PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION,
    PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION,
    PRESERVED_NODE_GONE_SINCE_ANNOTATION,
)
DRAIN_RECORD_ANNOTATIONS: Final = (
    PRESERVED_DRAIN_ANNOTATION,
    PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION,
    PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION,
)


class PreservedBy(StrEnum):
    """Why a preservation started: a user's value (`now`, `when-failed`) or auto-preservation."""

    USER = "user"
    AUTO = "auto"


class DrainOutcome(StrEnum):
    DRAINED = "drained"
    FAILED = "failed"


# What an SRE (and `kubectl preservation`) reads on a preserved machine's Node, in fields meant for programs: the
# Node's mirror of the Machine's record under the same keys (the shoot's users cannot read Machines in the seed),
# and what the drain found. Only the controller writes them; they are absent while the node is not preserved.
NODE_PRESERVATION_ANNOTATIONS: Final = (
    PRESERVED_SINCE_ANNOTATION,  # RFC 3339
    PRESERVED_UNTIL_ANNOTATION,  # RFC 3339
    PRESERVED_BY_ANNOTATION,  # PreservedBy: a user's value, or the pool's auto-preservation budget
    PRESERVED_DRAIN_ANNOTATION,  # NodeDrainState; absent while no drain is needed (a machine not Failed)
)
# Decimal count of the pods the drain still waits for (present with the drain state `failed`).
PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-drain-pods-left"
# The PodDisruptionBudgets that refused an eviction, `namespace/name` joined by commas, sorted, at most
# DRAIN_BLOCKED_BY_LIMIT of them (present with the drain state `failed` when a PDB refused).
PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-drain-blocked-by"
DRAIN_BLOCKED_BY_LIMIT: Final = 10
# `namespace/name` of the ConfigMap that holds the evidence of the failure (EVIDENCE_* below).
PRESERVED_EVIDENCE_ANNOTATION: Final = "node.machine.sapcloud.io/preserved-evidence"
NODE_DRAIN_ANNOTATIONS: Final = (PRESERVED_DRAIN_PODS_LEFT_ANNOTATION, PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION)


class NodeDrainState(StrEnum):
    """The drain as the Node tells it: the record's DrainOutcome, and `draining` while it runs."""

    DRAINING = "draining"
    DRAINED = "drained"
    FAILED = "failed"


# The evidence of a failure, kept in the shoot for whoever can read its ConfigMaps (Gardener's viewer
# kubeconfigs can; Secrets they cannot): one ConfigMap per preserved Failed node, in EVIDENCE_NAMESPACE, owned by
# the Node (garbage-collected with it), its JSON under EVIDENCE_DATA_KEY, at most EVIDENCE_MAX_BYTES.
EVIDENCE_NAMESPACE: Final = "kube-system"
# The component our Events are reported by (`source.component`, `reportingComponent`): the evidence of a failure
# leaves them out, as they tell the preservation, not the failure.
EVENT_REPORTING_COMPONENT: Final = "machine-preservation-controller"
EVIDENCE_NAME_PREFIX: Final = "machine-preservation-evidence-"
EVIDENCE_DATA_KEY: Final = "evidence.json"
EVIDENCE_MAX_BYTES: Final = 256 * 1024
# Label on every evidence ConfigMap (value "true"), so the controller finds its own after a restart.
EVIDENCE_LABEL: Final = "machine-preservation.sapcloud.io/evidence"
# On the evidence ConfigMap: the Node it is about (a label value could not hold every node name).
EVIDENCE_NODE_KEY: Final = "machine-preservation.sapcloud.io/node"
# On the evidence ConfigMap, RFC 3339: when it is deleted (set once the preservation ended, plus the grace).
EVIDENCE_EXPIRES_KEY: Final = "machine-preservation.sapcloud.io/expires"


# Annotations only the controller's identity may change.
CONTROLLER_OWNED_ANNOTATIONS: Final = (
    *PRESERVATION_RECORD_ANNOTATIONS,
    *NODE_DRAIN_ANNOTATIONS,
    PRESERVED_EVIDENCE_ANNOTATION,
    LAST_APPLIED_NODE_PRESERVE_ANNOTATION,
    CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,
    CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
    LAST_MACHINE_PRIORITY_ANNOTATION,
    REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION,
)


class ConditionReason(StrEnum):
    """Reasons of the Preserved node condition (trailing full stops are upstream's)."""

    PRESERVED_BY_MCM = "Preserved by MCM."
    PRESERVED_BY_USER = "Preserved by user."
    PRESERVATION_STOPPED = "Preservation stopped."


DRAINED_SUCCESSFULLY_MESSAGE: Final = "Preserved node drained successfully."
DRAIN_FAILED_MESSAGE: Final = "Preserved node could not be drained."
DRAINING_MESSAGE: Final = "Preserved node is being drained."
PRESERVED_UNTIL_MESSAGE_PREFIX: Final = "Machine preserved until"


class EventReason(StrEnum):
    """Reasons of the Kubernetes Events the controller records (on the Machine, and on its Node)."""

    PRESERVATION_STARTED = "PreservationStarted"
    PRESERVATION_STOPPED = "PreservationStopped"
    PRESERVATION_EXPIRED = "PreservationExpired"
    PRESERVED_NODE_DRAINED = "PreservedNodeDrained"
    PRESERVED_NODE_DRAIN_FAILED = "PreservedNodeDrainFailed"
    MACHINE_RECOVERED = "PreservedMachineRecovered"
    INVALID_PRESERVE_VALUE = "InvalidPreserveValue"
    AUTO_PRESERVATION_GRANTED = "AutoPreservationGranted"
    AUTO_PRESERVATION_RELEASED = "AutoPreservationReleased"
    PRESERVATION_HANDED_OVER = "PreservationHandedOver"
    NODE_OF_ANOTHER_MACHINE = "NodeOfAnotherMachine"
    PRESERVED_NODE_GONE = "PreservedNodeGone"
    PRESERVED_NODE_RETURNED = "PreservedNodeReturned"
    # A Warning on the Node: the evidence of its failure could not be written (EVIDENCE_*).
    EVIDENCE_NOT_RECORDED = "PreservationEvidenceNotRecorded"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class MachinePhase(StrEnum):
    PENDING = "Pending"
    AVAILABLE = "Available"
    RUNNING = "Running"
    UNKNOWN = "Unknown"
    FAILED = "Failed"
    TERMINATING = "Terminating"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    IN_PLACE_UPDATING = "InPlaceUpdating"


MACHINE_API_GROUP: Final = "machine.sapcloud.io"
MACHINE_API_VERSION: Final = "v1alpha1"
SHOOT_API_GROUP: Final = "core.gardener.cloud"
SHOOT_API_VERSION: Final = "v1beta1"

# A static pod's mirror in the API: it stays on its node through a drain.
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

# Every annotation above; the controller's Node cache keeps no others (models.cached_node).
ANNOTATIONS: Final = frozenset(
    {
        PRESERVE_ANNOTATION,
        LAST_APPLIED_NODE_PRESERVE_ANNOTATION,
        CA_SCALE_DOWN_DISABLED_ANNOTATION,
        CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,
        CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
        MACHINE_PRIORITY_ANNOTATION,
        LAST_MACHINE_PRIORITY_ANNOTATION,
        MACHINE_SET_REVISION_ANNOTATION,
        REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION,
        *PRESERVATION_RECORD_ANNOTATIONS,
        *NODE_DRAIN_ANNOTATIONS,
        PRESERVED_EVIDENCE_ANNOTATION,
        MIRROR_POD_ANNOTATION,
    }
)
