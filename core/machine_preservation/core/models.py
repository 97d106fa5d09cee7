"""Pydantic models of the parts of Kubernetes, MCM and Gardener objects this product reads.

Lenient on purpose: unknown fields are ignored, missing ones take Kubernetes' zero values, so a model
can be built from any real object (admission request, watch event, list item). Models are frozen: the
core decides on snapshots and returns desired changes; it never mutates its inputs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import sys
from collections.abc import Mapping
from enum import Enum
from typing import Any, Final, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass as pydantic_dataclass

from machine_preservation.core import vocabulary as v
from machine_preservation.core.preservation_record import PreservationRecord, read_record

# One set per distinct combination of set fields, shared by every instance that has it.
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


class KubeModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    def model_post_init(self, context: Any, /) -> None:
        # Pydantic keeps a set of the fields given per instance (≥ 216 bytes each): ~40 % of a cached Node's
        # memory, Node, metadata, spec, status and each condition being models. A frozen model never adds to it
        # (a copy copies it first), so instances with the same fields may share one.
        given = self.__pydantic_fields_set__
        object.__setattr__(self, "__pydantic_fields_set__", _FIELDS_SETS.setdefault(frozenset(given), given))


class OwnerReference(KubeModel):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


# The parts of a Node that every cached Node has one of, as slotted dataclasses: no per-instance dict (a model's
# holds every field, ~350 bytes for the metadata). Validated by pydantic like the models around them.
_NODE_PART = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class _NodePart:
    __slots__ = ()

    def model_copy(self, *, update: Mapping[str, Any]) -> Self:
        """A copy with `update`'s fields changed, as a model's `model_copy` (validated, unlike a model's)."""
        return dataclasses.replace(self, **update)  # type: ignore[type-var]


def _has_annotations(annotations: Mapping[str, str], annotated: bool | None) -> bool:
    return bool(annotations) if annotated is None else annotated


@pydantic_dataclass(frozen=True, slots=True, config=_NODE_PART)
class NodeMeta(_NodePart):
    """The metadata the product reads of a Node."""

    name: str = ""
    generate_name: str = ""
    uid: str = ""
    resource_version: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)
    # Whether the object has any annotation, given where `annotations` keeps only some (`cached_node`); see
    # `has_annotations`.
    annotated: bool | None = None
    deletion_timestamp: dt.datetime | None = None

    @property
    def has_annotations(self) -> bool:
        """Whether the object has an annotations map at all (a JSON patch can add a key only to one that exists)."""
        return _has_annotations(self.annotations, self.annotated)


class ObjectMeta(KubeModel):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    annotated: bool | None = None
    creation_timestamp: dt.datetime | None = None
    deletion_timestamp: dt.datetime | None = None
    owner_references: list[OwnerReference] = Field(default_factory=list)

    @property
    def has_annotations(self) -> bool:
        return _has_annotations(self.annotations, self.annotated)

    def controller_owner(self) -> OwnerReference | None:
        return next((ref for ref in self.owner_references if ref.controller), None)

    def controller_name(self, kind: str) -> str | None:
        """The name of the controlling owner when it is a `kind`; None otherwise."""
        owner = self.controller_owner()
        return owner.name if owner is not None and owner.kind == kind else None


class Taint(KubeModel):
    key: str
    value: str = ""
    effect: str
    time_added: dt.datetime | None = None
    # Its position in the Node's `spec.taints`, where the model keeps only some of them (`cached_node`).
    index: int | None = None


class NodeCondition(KubeModel):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: dt.datetime | None = None
    last_heartbeat_time: dt.datetime | None = None


@pydantic_dataclass(frozen=True, slots=True, config=_NODE_PART)
class NodeSpec(_NodePart):
    provider_id: str = Field(default="", alias="providerID")
    # A tuple: the empty one, every untainted cached Node's, is shared (an empty list is 56 bytes each).
    taints: tuple[Taint, ...] = ()
    # Whether the Node has any taint, where `taints` keeps only some (`cached_node`); see `has_taints`.
    tainted: bool | None = None
    unschedulable: bool = False

    @property
    def has_taints(self) -> bool:
        """Whether the Node has a taints list at all (a JSON patch can append only to one that exists)."""
        return bool(self.taints) if self.tainted is None else self.tainted


class NodeStatus(KubeModel):
    conditions: list[NodeCondition] = Field(default_factory=list)


class Node(KubeModel):
    metadata: NodeMeta = Field(default_factory=NodeMeta)
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)

    def condition(self, condition_type: str) -> NodeCondition | None:
        return next((c for c in self.status.conditions if c.type == condition_type), None)

    @property
    def preserved_condition(self) -> NodeCondition | None:
        return self.condition(v.PRESERVED_CONDITION_TYPE)

    def has_taint(self, key: str, effect: str) -> bool:
        return any(t.key == key and t.effect == effect for t in self.spec.taints)


# How much of a string the Node cache keeps: more than any value the product writes or reads (timestamps, short
# words, Go durations), so only a value that is invalid anyway is cut, and one shoot's Nodes cannot fill the cache.
CACHED_VALUE_LIMIT: Final = 1024
# How many conditions besides Ready and Preserved it keeps (the unhealthy ones MCM knows are a handful).
CACHED_CONDITIONS_LIMIT: Final = 16


def cached_node(raw: Mapping[str, Any]) -> Node:
    """The Node as the controller's cache keeps it: only what the product reads of a Node, bounded whatever the
    Node holds.

    One controller keeps every Node of every shoot of a seed (4,000 for 200 shoots of 20 machines), and a whole
    model of a Gardener node retains ~19 KiB, mostly labels, other components' annotations and the kubelet's
    condition messages, none of which a plan reads; a shoot owner may add thousands of taints and conditions.
    Kept: name, uid, resourceVersion, deletionTimestamp; the annotations the vocabulary names and whether there
    are any; providerID and unschedulable; our taint with its position in the list and whether there are any; the
    Preserved condition (less its heartbeat); the Ready condition and at most CACHED_CONDITIONS_LIMIT other
    conditions that are True (a node is unhealthy by a condition only while it is True) as type and status only.
    Strings are cut at CACHED_VALUE_LIMIT characters. Keys and the few condition words are interned, so nodes
    share them."""
    metadata = mapping_of(raw.get("metadata"))
    annotations = mapping_of(metadata.get("annotations"))
    spec = mapping_of(raw.get("spec"))
    taints = spec.get("taints")
    taints = taints if isinstance(taints, list) else []
    kept_metadata = {
        "name": metadata.get("name", ""),
        "uid": metadata.get("uid", ""),
        "resourceVersion": metadata.get("resourceVersion", ""),
        "deletionTimestamp": metadata.get("deletionTimestamp"),
        "annotations": {sys.intern(k): _bounded(value) for k, value in annotations.items() if k in v.ANNOTATIONS},
        "annotated": bool(annotations),
    }
    kept_spec = {
        "providerID": _bounded(spec.get("providerID", "")),
        "unschedulable": spec.get("unschedulable", False),
        "taints": [
            {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT, "index": index}
            | ({"timeAdded": taint["timeAdded"]} if "timeAdded" in taint else {})
            for index, taint in enumerate(taints)
            if isinstance(taint, Mapping)
            and taint.get("key") == v.PRESERVED_TAINT_KEY
            and taint.get("effect") == v.PRESERVED_TAINT_EFFECT
        ],
        "tainted": bool(taints),
    }
    conditions: list[dict[str, Any]] = []
    others = 0
    for condition in mapping_of(raw.get("status")).get("conditions") or ():
        kept = _cached_condition(condition) if isinstance(condition, Mapping) else None
        if kept is None:
            continue
        if kept.get("type") not in (v.PRESERVED_CONDITION_TYPE, v.NODE_READY_CONDITION_TYPE):
            others += 1
            if others > CACHED_CONDITIONS_LIMIT:
                continue
        conditions.append(kept)
    status: NodeStatus | dict[str, Any] = {"conditions": conditions}
    if all(len(kept) == 2 for kept in conditions):  # type and status only, as on every Node not preserved
        status = _shared_status(tuple((kept["type"], kept["status"]) for kept in conditions))
    return Node.model_validate({"metadata": kept_metadata, "spec": kept_spec, "status": status})


@functools.lru_cache(maxsize=64)
def _shared_status(conditions: tuple[tuple[Any, Any], ...]) -> NodeStatus:
    """One status for every Node whose cached conditions are the same (all Ready and nothing else True, mostly):
    ~0.8 KiB less per Node. Models are frozen, so no Node can change another's."""
    return NodeStatus.model_validate({"conditions": [{"type": kind, "status": status} for kind, status in conditions]})


def _cached_condition(condition: Mapping[str, Any]) -> dict[str, Any] | None:
    kind, status = condition.get("type"), condition.get("status")
    if not isinstance(kind, str) or not isinstance(status, str):
        return {key: _bounded(value) for key, value in condition.items()}  # let the model say what is wrong with it
    if kind == v.PRESERVED_CONDITION_TYPE:
        return {key: _bounded(value) for key, value in condition.items() if key != "lastHeartbeatTime"}
    if kind == v.NODE_READY_CONDITION_TYPE or status == "True":
        return {"type": sys.intern(_bounded(kind)), "status": sys.intern(_bounded(status))}
    return None


def _bounded(value: Any) -> Any:
    """A string cut at CACHED_VALUE_LIMIT characters; anything else as it is (the model judges it)."""
    return value[:CACHED_VALUE_LIMIT] if isinstance(value, str) else value


class NoNode(Enum):
    """Why a machine has no Node to act on."""

    # No `node` label, or one naming another machine's Node (which is left alone).
    NO_LABEL = "no node label"
    # The `node` label names a Node that does not exist (or is being deleted: `lifecycle.not_deleted`).
    NOT_FOUND = "node not found"


class MachineCurrentStatus(KubeModel):
    phase: str = ""
    timeout_active: bool | None = None
    last_update_time: dt.datetime | None = None
    preserve_expiry_time: dt.datetime | None = None


# The fields of MCM's `status.lastOperation` a Failed machine's evidence keeps (core.evidence), as strings.
_LAST_OPERATION_FIELDS: Final = ("description", "state", "type", "lastUpdateTime")


class MachineStatus(KubeModel):
    # Only what the product reads: every Machine of a seed is cached, and MCM copies its node's conditions (the
    # kubelet's messages) and its last operation's description into the rest.
    current_status: MachineCurrentStatus = Field(default_factory=MachineCurrentStatus)
    # MCM's last operation, kept only while the machine is Failed (the few whose failure's evidence is recorded),
    # each field a string cut at CACHED_VALUE_LIMIT characters.
    last_operation: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _failed_only(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or "lastOperation" not in raw:
            return raw
        phase = mapping_of(raw.get("currentStatus")).get("phase")
        operation = mapping_of(raw.get("lastOperation")) if phase == v.MachinePhase.FAILED else {}
        kept = {key: _bounded(operation[key]) for key in _LAST_OPERATION_FIELDS if isinstance(operation.get(key), str)}
        return {**raw, "lastOperation": kept}


class MachineSpec(KubeModel):
    provider_id: str = Field(default="", alias="providerID")
    machine_preserve_timeout: str | None = None
    drain_timeout: str | None = None
    max_evict_retries: int | None = None


class Machine(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineSpec = Field(default_factory=MachineSpec)
    status: MachineStatus = Field(default_factory=MachineStatus)

    @property
    def phase(self) -> str:
        return self.status.current_status.phase

    @property
    def mirrored_expiry(self) -> dt.datetime | None:
        """`status.currentStatus.preserveExpiryTime`: a mirror of the record's expiry (or MCM's own expiry
        when MCM preserves natively); pruned or dropped by MCM v0.61, so never the record."""
        return self.status.current_status.preserve_expiry_time

    @property
    def preservation(self) -> PreservationRecord | None:
        """The preservation record in the annotations (None: not preserved). Not cached: `model_copy` would
        carry a cached record over to a copy with other annotations."""
        return read_record(self.metadata.annotations)

    @property
    def node_name(self) -> str:
        return self.metadata.labels.get(v.NODE_LABEL, "")


class MachineSetSpec(KubeModel):
    replicas: int = 0
    auto_preserve_failed_machine_max: int = 0
    template: dict[str, Any] = Field(default_factory=dict)


class MachineSetStatus(KubeModel):
    replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    auto_preserve_failed_machine_count: int = 0
    preserved_failed_replicas: int = 0


class MachineSet(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineSetSpec = Field(default_factory=MachineSetSpec)
    status: MachineSetStatus = Field(default_factory=MachineSetStatus)


class MachineDeploymentSpec(KubeModel):
    replicas: int = 0
    auto_preserve_failed_machine_max: int = 0
    paused: bool = False
    template: dict[str, Any] = Field(default_factory=dict)


class MachineDeploymentStatus(KubeModel):
    replicas: int = 0
    updated_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    unavailable_replicas: int = 0
    preserved_failed_replicas: int = 0


class MachineDeployment(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineDeploymentSpec = Field(default_factory=MachineDeploymentSpec)
    status: MachineDeploymentStatus = Field(default_factory=MachineDeploymentStatus)


# The labels a cached Pod keeps, at most (a pod's labels are its owner's input, unbounded in number): enough for
# every workload seen, whose controllers add two or three to the app's own.
CACHED_POD_LABELS_LIMIT: Final = 32
# Kubernetes' bounds of a label's key (prefix and name) and value: a longer one is not from a valid Pod.
_LABEL_KEY_LIMIT: Final = 253 + 1 + 63
_LABEL_VALUE_LIMIT: Final = 63
# What a cached Pod keeps of its status for the evidence of a failure (core.evidence): strings one past the
# longest the evidence keeps, so that it still counts what it cuts; the first container statuses of both lists,
# and how many there were.
_STATUS_TEXT_LIMIT: Final = 1025
STATUS_CONTAINERS_LIMIT: Final = 20


class ContainerStatus(NamedTuple):
    """A container's status as a cached Pod keeps it: a tuple, as a pod may have many (what the evidence reads)."""

    name: str
    init: bool
    restart_count: int | None
    state: str  # running, waiting, terminated or ""
    state_reason: str
    last_termination_reason: str
    last_termination_exit_code: int | None
    last_termination_finished_at: str


class Pod(KubeModel):
    """A Pod reduced to what a drain reads: where it runs, whether it is going away, whether it stays (mirror or
    DaemonSet pod), and its labels, which tell the PodDisruptionBudgets that cover it; and what the evidence of the
    node's failure keeps of it (taken from this cache before the drain's first eviction). The controller caches the
    pods of failed machines' nodes (`node_pods`), as many as fail at once, so the object is boiled down on parsing
    into one flat model: ~825 bytes per cached pod with three labels and its status (~630 without the status),
    against ~3.8 KB with full metadata (benchmarks/pod_cache_memory.py, 2026-11-29)."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    node_name: str = ""
    deletion_timestamp: dt.datetime | None = None
    mirror: bool = False  # a static pod's mirror (annotation kubernetes.io/config.mirror)
    controller_kind: str = ""  # the kind of the controlling owner reference, if any
    # None: more labels than CACHED_POD_LABELS_LIMIT, or one Kubernetes would not accept (not known, so not matched).
    labels: dict[str, str] | None = Field(default_factory=dict)
    # For the evidence of a failure: the controller's name, the creation time and status as served (bounded).
    controller_name: str = ""
    created_at: str = ""
    phase: str = ""
    reason: str = ""
    containers: tuple[ContainerStatus, ...] = ()
    container_count: int = 0  # the statuses the pod had, init containers' too

    @model_validator(mode="before")
    @classmethod
    def _reduce(cls, raw: Any) -> Any:
        """Accept a Pod as the API serves it (metadata, spec); anything else is validated as is."""
        if not isinstance(raw, dict) or ("metadata" not in raw and "spec" not in raw):
            return raw
        metadata, spec = mapping_of(raw.get("metadata")), mapping_of(raw.get("spec"))
        annotations = mapping_of(metadata.get("annotations"))
        owners = metadata.get("ownerReferences")
        owners = owners if isinstance(owners, list) else []
        controller = next((o for o in owners if isinstance(o, dict) and o.get("controller") is True), {})
        status = mapping_of(raw.get("status"))
        statuses = [
            (item, init)
            for key, init in (("initContainerStatuses", True), ("containerStatuses", False))
            for item in _list_of(status.get(key))
        ]
        return {
            "name": metadata.get("name", ""),
            "namespace": metadata.get("namespace", ""),
            "uid": metadata.get("uid", ""),
            "nodeName": spec.get("nodeName", ""),
            "deletionTimestamp": metadata.get("deletionTimestamp"),
            "mirror": v.MIRROR_POD_ANNOTATION in annotations,
            "controllerKind": controller.get("kind") or "",
            "labels": _pod_labels(metadata.get("labels")),
            "controllerName": _status_text(controller.get("name")),
            "createdAt": _status_text(metadata.get("creationTimestamp")),
            "phase": _status_text(status.get("phase")),
            "reason": _status_text(status.get("reason")),
            "containers": tuple(_container_status(item, init) for item, init in statuses[:STATUS_CONTAINERS_LIMIT]),
            "containerCount": len(statuses),
        }


def _list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _status_text(value: Any) -> str:
    return value[:_STATUS_TEXT_LIMIT] if isinstance(value, str) else ""


def json_int(value: Any) -> int | None:
    """A JSON integer within int64 (what Kubernetes serves), None for anything else (bool is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63 else None


def _container_status(raw: Any, init: bool) -> ContainerStatus:
    item = mapping_of(raw)
    state = mapping_of(item.get("state"))
    current = next((s for s in ("running", "waiting", "terminated") if isinstance(state.get(s), dict)), "")
    terminated = mapping_of(mapping_of(item.get("lastState")).get("terminated"))
    return ContainerStatus(
        name=_status_text(item.get("name")),
        init=init,
        restart_count=json_int(item.get("restartCount")),
        state=current,
        state_reason=_status_text(mapping_of(state.get(current)).get("reason")) if current else "",
        last_termination_reason=_status_text(terminated.get("reason")),
        last_termination_exit_code=json_int(terminated.get("exitCode")),
        last_termination_finished_at=_status_text(terminated.get("finishedAt")),
    )


def _pod_labels(raw: Any) -> dict[str, str] | None:
    """The labels as a cached Pod keeps them (keys interned: pods share them), or None where they are not kept."""
    labels = mapping_of(raw)
    if len(labels) > CACHED_POD_LABELS_LIMIT:
        return None
    if not all(
        isinstance(key, str)
        and isinstance(value, str)
        and len(key) <= _LABEL_KEY_LIMIT
        and len(value) <= _LABEL_VALUE_LIMIT
        for key, value in labels.items()
    ):
        return None
    return {sys.intern(key): value for key, value in labels.items()}


def mapping_of(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else empty (a malformed part must fail validation, not raise)."""
    return value if isinstance(value, dict) else {}
