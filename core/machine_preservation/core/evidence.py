"""The evidence of a machine's failure: what an investigation needs, captured before the drain evicts the pods.

A JSON document kept in the shoot (vocabulary EVIDENCE_*), for the shoot's SRE who cannot read the seed: the
node's conditions at the failure, its recent Events (they expire after an hour), the pods that ran on it, and
MCM's last operation on the Machine. `build_evidence` turns what the API served, whatever its shape, into a
document bounded at every level (strings, lists, and the whole at EVIDENCE_MAX_BYTES), saying in `truncated`
what it left out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import shows_preservation
from machine_preservation.core.models import ContainerStatus, Machine, Node, Pod, json_int

EVIDENCE_VERSION: Final = 1

# Limits of one document. A kubelet's condition or event message is a sentence or two; 1 KiB keeps any real
# one whole. A node's events of the last hour are rarely more than a few dozen; a node runs ≤ 110 pods by
# default (≤ 250 at most on common providers), a pod a handful of containers.
MESSAGE_LIMIT: Final = 1024
NAME_LIMIT: Final = 253  # a DNS subdomain: the longest Kubernetes object name
WORD_LIMIT: Final = 128  # reasons, types, phases, states: CamelCase words
TIME_LIMIT: Final = 64  # an RFC 3339 timestamp with nanoseconds and an offset is 35 characters
CONDITION_LIMIT: Final = 20
EVENT_LIMIT: Final = 50
POD_LIMIT: Final = 200
CONTAINER_LIMIT: Final = 20
UNAVAILABLE_LIMIT: Final = 10
# At most this many input items are looked at, so a hostile list of millions is cut before any sorting.
SCAN_LIMIT: Final = 5000


class EvidenceModel(BaseModel):
    # Lenient when read back: a document written by another version still renders.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class ConditionEvidence(EvidenceModel):
    """A Node condition at the failure."""

    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition_time: dt.datetime | None = None


class EventEvidence(EvidenceModel):
    """An Event about the Node."""

    type: str = ""  # Normal or Warning
    reason: str = ""
    message: str = ""
    count: int = 1
    first_time: dt.datetime | None = None
    last_time: dt.datetime | None = None
    # The component that reported it (`source.component`, else `reportingComponent`).
    source: str = ""


class ContainerEvidence(EvidenceModel):
    """A container's status, as the kubelet of the failed node last reported it."""

    name: str = ""
    init: bool = False  # an init container
    restart_count: int = 0
    state: str = ""  # running, waiting or terminated
    state_reason: str = ""  # e.g. CrashLoopBackOff while waiting
    last_termination_reason: str = ""  # e.g. OOMKilled, Error
    last_termination_exit_code: int | None = None
    last_termination_finished_at: dt.datetime | None = None


class PodEvidence(EvidenceModel):
    """A pod that ran on the node when its preservation started."""

    namespace: str = ""
    name: str = ""
    owner_kind: str = ""  # the controlling owner, e.g. ReplicaSet, DaemonSet, StatefulSet, Node (a mirror pod)
    owner_name: str = ""
    phase: str = ""
    reason: str = ""  # the pod's status reason, e.g. Evicted, NodeLost
    created_at: dt.datetime | None = None
    deleted_at: dt.datetime | None = None  # the pod was being deleted (its grace period ends then) when captured
    containers: tuple[ContainerEvidence, ...] = ()


class LastOperation(EvidenceModel):
    """MCM's last operation on the Machine (`status.lastOperation`)."""

    description: str = ""
    state: str = ""  # e.g. Processing, Failed, Successful
    type: str = ""  # e.g. Create, HealthCheck, Delete
    last_update_time: dt.datetime | None = None


class MachineEvidence(EvidenceModel):
    name: str = ""
    phase: str = ""
    last_operation: LastOperation = Field(default_factory=LastOperation)


class Truncated(EvidenceModel):
    """What the document leaves out: items beyond the limits, strings cut at theirs."""

    conditions: int = 0
    events: int = 0
    pods: int = 0
    containers: int = 0  # over the pods kept
    strings: int = 0
    # Whether the oldest events and pods were left out to keep the document within EVIDENCE_MAX_BYTES.
    to_fit_size: bool = False


class Evidence(EvidenceModel):
    """The evidence document (JSON under EVIDENCE_DATA_KEY, camelCase keys)."""

    version: int  # EVIDENCE_VERSION when written; required, so always stored
    node: str = ""
    captured_at: dt.datetime | None = None
    conditions: tuple[ConditionEvidence, ...] = ()
    events: tuple[EventEvidence, ...] = ()  # newest first
    pods: tuple[PodEvidence, ...] = ()  # newest first
    machine: MachineEvidence = Field(default_factory=MachineEvidence)
    # What could not be read, and why (for people), e.g. "events: forbidden".
    unavailable: tuple[str, ...] = ()
    truncated: Truncated = Field(default_factory=Truncated)


# A DNS subdomain (RFC 1123), what a ConfigMap's name must be.
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HASH_LENGTH: Final = 16


def evidence_name(node_name: str) -> str:
    """The name of the evidence ConfigMap of a node: EVIDENCE_NAME_PREFIX and the node's name; the prefix and a
    hash of the name when that is too long or not a valid name (the same node always gets the same name)."""
    name = v.EVIDENCE_NAME_PREFIX + node_name
    if len(name) <= NAME_LIMIT and _SUBDOMAIN.fullmatch(name):
        return name
    return (
        v.EVIDENCE_NAME_PREFIX + hashlib.sha256(node_name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LENGTH]
    )


def to_json(evidence: Evidence) -> str:
    """The document as stored: compact JSON with camelCase keys, fields at their defaults left out (a pod's
    twenty containers of empty fields would weigh 4 KiB). `Evidence.model_validate_json` reads it back."""
    return _dump(evidence)


def size(item: EvidenceModel) -> int:
    """The size in bytes (UTF-8) of the stored document, or of an item in it."""
    return len(_dump(item).encode())


def _dump(item: EvidenceModel) -> str:
    return item.model_dump_json(by_alias=True, exclude_defaults=True)


def build_evidence(
    *,
    node_name: str,
    captured_at: dt.datetime,
    node: object,
    events: object,
    pods: Sequence[Pod],
    machine: object,
    unavailable: Sequence[str] = (),
) -> Evidence:
    """The evidence document from what the API served: `node` the Node, `events` the Events about it, `machine`
    its Machine, each as read (any shape: what is not as expected is left empty), and `pods`, the Pods on it as
    cached (`pods_of` what a list served). Its JSON (`to_json`) is at most EVIDENCE_MAX_BYTES long."""
    cutter = _Cutter()
    # Our own Preserved condition and Events are the preservation, not the failure (the Node's fields tell it).
    raw_conditions = _path(node, "status", "conditions")
    failure = [c for c in _items(raw_conditions, SCAN_LIMIT) if _path(c, "type") != v.PRESERVED_CONDITION_TYPE]
    left_out = min(_length(raw_conditions), SCAN_LIMIT) - len(failure)
    conditions = failure[:CONDITION_LIMIT]
    # Chosen on their times alone, so only the kept items are built.
    scanned = _items(events, SCAN_LIMIT, keep_last=True)
    failure_events = [x for x in scanned if _event_source(x) != v.EVENT_REPORTING_COMPONENT]
    newest_events = _newest(failure_events, EVENT_LIMIT, _event_time)
    newest_pods = _newest(list(pods[:SCAN_LIMIT]), POD_LIMIT, _pod_time)
    evidence = Evidence(
        version=EVIDENCE_VERSION,
        node=cutter.cut(node_name, NAME_LIMIT),
        captured_at=captured_at,
        conditions=tuple(_condition(c, cutter) for c in conditions),
        events=tuple(_event(e, cutter) for e in newest_events),
        pods=tuple(_pod(p, cutter) for p in newest_pods),
        machine=_machine(machine, cutter),
        unavailable=tuple(cutter.cut(n, MESSAGE_LIMIT) for n in _items(unavailable, UNAVAILABLE_LIMIT)),
    )
    truncated = Truncated(
        conditions=_length(raw_conditions) - left_out - len(conditions),
        events=_length(events) - (len(scanned) - len(failure_events)) - len(evidence.events),
        pods=len(pods) - len(evidence.pods),
        containers=cutter.containers,
        strings=cutter.strings,
    )
    return _fit(evidence.model_copy(update={"truncated": truncated}))


def _fit(evidence: Evidence) -> Evidence:
    """`evidence` within EVIDENCE_MAX_BYTES: the oldest events and pods left out (then the last conditions),
    whichever list weighs more first."""
    excess = size(evidence) - v.EVIDENCE_MAX_BYTES
    if excess <= 0:
        return evidence
    events, pods, conditions = list(evidence.events), list(evidence.pods), list(evidence.conditions)
    weights = {
        "events": [size(e) + 1 for e in events],  # + 1: the comma
        "pods": [size(p) + 1 for p in pods],
        "conditions": [size(c) + 1 for c in conditions],
    }
    lists: dict[str, list[Any]] = {"events": events, "pods": pods, "conditions": conditions}
    totals = {key: sum(weight) for key, weight in weights.items()}
    # Dropping items to their weight; `to_fit_size` and the counts below may add a few bytes, checked after.
    while excess > -_COUNTS_MARGIN and any(lists.values()):
        heavier = max(("events", "pods"), key=totals.__getitem__)
        key = heavier if lists[heavier] else "conditions"
        lists[key].pop()
        dropped = weights[key].pop()
        totals[key] -= dropped
        excess -= dropped
    truncated = evidence.truncated
    fitted = evidence.model_copy(
        update={
            "events": tuple(events),
            "pods": tuple(pods),
            "conditions": tuple(conditions),
            "truncated": truncated.model_copy(
                update={
                    "events": truncated.events + len(evidence.events) - len(events),
                    "pods": truncated.pods + len(evidence.pods) - len(pods),
                    "conditions": truncated.conditions + len(evidence.conditions) - len(conditions),
                    "to_fit_size": True,
                }
            ),
        }
    )
    if size(fitted) > v.EVIDENCE_MAX_BYTES:
        # Cannot be: without its lists, the document's strings are bounded far below the limit.
        raise AssertionError(f"evidence of {size(fitted)} bytes over {v.EVIDENCE_MAX_BYTES}")
    return fitted


# Room for `truncated` to grow by once items are dropped: its keys, digits and `true` (≤ 100 bytes).
_COUNTS_MARGIN: Final = 256


class _Cutter:
    """Cuts strings to their limits and counts what it cut."""

    def __init__(self) -> None:
        self.strings = 0
        self.containers = 0

    def cut(self, value: object, limit: int) -> str:
        """`value` cut at `limit` characters, a lone surrogate (no character) replaced; "" if not a string."""
        if not isinstance(value, str):
            return ""
        if len(value) > limit:
            self.strings += 1
            value = value[:limit]
        return value.encode("utf-8", "replace").decode()


_T = TypeVar("_T")


def _items(value: object, limit: int, *, keep_last: bool = False) -> list[Any]:
    """At most `limit` items of a JSON list (the last ones with `keep_last`); none of anything else."""
    if not isinstance(value, (list, tuple)):
        return []
    return list(value[-limit:] if keep_last else value[:limit])


def _length(value: object) -> int:
    return len(value) if isinstance(value, (list, tuple)) else 0


def _path(value: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _time(value: object) -> dt.datetime | None:
    """An RFC 3339 timestamp with a zone, as UTC; None when absent or malformed."""
    if not isinstance(value, str) or not value or len(value) > TIME_LIMIT:
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
        return moment.astimezone(dt.UTC) if moment.tzinfo is not None else None
    except (ValueError, OverflowError):  # malformed; or out of range once moved to UTC
        return None


def _condition(raw: object, cutter: _Cutter) -> ConditionEvidence:
    def text(key: str, limit: int) -> str:
        return cutter.cut(_path(raw, key), limit)

    return ConditionEvidence(
        type=text("type", WORD_LIMIT),
        status=text("status", WORD_LIMIT),
        reason=text("reason", WORD_LIMIT),
        message=text("message", MESSAGE_LIMIT),
        last_transition_time=_time(_path(raw, "lastTransitionTime")),
    )


def _event_source(raw: object) -> object:
    return _path(raw, "source", "component") or _path(raw, "reportingComponent")


def _event(raw: object, cutter: _Cutter) -> EventEvidence:
    first = _time(_path(raw, "firstTimestamp")) or _time(_path(raw, "eventTime"))
    source = _event_source(raw)
    return EventEvidence(
        type=cutter.cut(_path(raw, "type"), WORD_LIMIT),
        reason=cutter.cut(_path(raw, "reason"), WORD_LIMIT),
        message=cutter.cut(_path(raw, "message"), MESSAGE_LIMIT),
        count=json_int(_path(raw, "series", "count")) or json_int(_path(raw, "count")) or 1,
        first_time=first,
        last_time=_event_time(raw),
        source=cutter.cut(source, NAME_LIMIT),
    )


def pods_of(listed: object) -> list[Pod]:
    """The pods of a list the API served (its `items`; any shape), as the controller caches them: at most
    SCAN_LIMIT looked at, those that are no Pod left out."""
    items = _path(listed, "items")
    pods = []
    for raw in _items(items, SCAN_LIMIT):
        try:
            pods.append(Pod.model_validate(raw))
        except ValidationError:
            continue
    return pods


def _container(status: ContainerStatus, cutter: _Cutter) -> ContainerEvidence:
    return ContainerEvidence(
        name=cutter.cut(status.name, NAME_LIMIT),
        init=status.init,
        restart_count=status.restart_count or 0,
        state=status.state,
        state_reason=cutter.cut(status.state_reason, WORD_LIMIT),
        last_termination_reason=cutter.cut(status.last_termination_reason, WORD_LIMIT),
        last_termination_exit_code=status.last_termination_exit_code,
        last_termination_finished_at=_time(status.last_termination_finished_at),
    )


def _pod(pod: Pod, cutter: _Cutter) -> PodEvidence:
    kept = pod.containers[:CONTAINER_LIMIT]
    cutter.containers += max(0, pod.container_count - len(kept))
    return PodEvidence(
        namespace=cutter.cut(pod.namespace, NAME_LIMIT),
        name=cutter.cut(pod.name, NAME_LIMIT),
        owner_kind=cutter.cut(pod.controller_kind, WORD_LIMIT),
        owner_name=cutter.cut(pod.controller_name, NAME_LIMIT),
        phase=cutter.cut(pod.phase, WORD_LIMIT),
        reason=cutter.cut(pod.reason, WORD_LIMIT),
        created_at=_time(pod.created_at),
        deleted_at=pod.deletion_timestamp,
        containers=tuple(_container(status, cutter) for status in kept),
    )


def _machine(raw: object, cutter: _Cutter) -> MachineEvidence:
    operation = _path(raw, "status", "lastOperation")
    return MachineEvidence(
        name=cutter.cut(_path(raw, "metadata", "name"), NAME_LIMIT),
        phase=cutter.cut(_path(raw, "status", "currentStatus", "phase"), WORD_LIMIT),
        last_operation=LastOperation(
            description=cutter.cut(_path(operation, "description"), MESSAGE_LIMIT),
            state=cutter.cut(_path(operation, "state"), WORD_LIMIT),
            type=cutter.cut(_path(operation, "type"), WORD_LIMIT),
            last_update_time=_time(_path(operation, "lastUpdateTime")),
        ),
    )


def _newest(items: list[_T], limit: int, moment: Callable[[_T], dt.datetime | None]) -> list[_T]:
    """The `limit` items with the latest `moment`, latest first (those without one last, in their order)."""
    timed = [(_seconds(moment(item)), index) for index, item in enumerate(items)]
    return [items[index] for _, index in sorted(timed, key=lambda t: (-t[0], t[1]))[:limit]]


def _event_time(raw: object) -> dt.datetime | None:
    return (
        _time(_path(raw, "series", "lastObservedTime"))
        or _time(_path(raw, "lastTimestamp"))
        or _time(_path(raw, "firstTimestamp"))
        or _time(_path(raw, "eventTime"))
    )


def _pod_time(pod: Pod) -> dt.datetime | None:
    return _time(pod.created_at)


_EPOCH: Final = dt.datetime.min.replace(tzinfo=dt.UTC)


def _seconds(moment: dt.datetime | None) -> float:
    return (moment - _EPOCH).total_seconds() if moment is not None else float("-inf")


# --- keeping it: the ConfigMap, and when it goes --------------------------------------------------------------


def evidence_reference(node_name: str) -> str:
    """The Node's PRESERVED_EVIDENCE_ANNOTATION value: `namespace/name` of its evidence ConfigMap."""
    return f"{v.EVIDENCE_NAMESPACE}/{evidence_name(node_name)}"


def evidence_config_map(*, node_name: str, node_uid: str, evidence: Evidence) -> dict[str, Any]:
    """The ConfigMap that keeps `evidence`: labelled, annotated with its node, owned by the Node (the garbage
    collector deletes it with the Node)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": evidence_name(node_name),
            "namespace": v.EVIDENCE_NAMESPACE,
            "labels": {v.EVIDENCE_LABEL: "true"},
            "annotations": {v.EVIDENCE_NODE_KEY: node_name},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}],
        },
        "data": {v.EVIDENCE_DATA_KEY: to_json(evidence)},
    }


@dataclass(frozen=True)
class StoredEvidence:
    """An evidence ConfigMap as listed (its metadata)."""

    name: str
    node: str
    resource_version: str
    expires: dt.datetime | None  # None: not set, or not a timestamp


def stored_evidence(metadata: object) -> StoredEvidence | None:
    """An evidence ConfigMap's metadata, if it is one the controller wrote: labelled, annotated with a node, named
    after it and owned by that Node. None for anything else (a shoot's owner may label ConfigMaps as ours: those
    are left alone)."""
    node = _path(metadata, "annotations", v.EVIDENCE_NODE_KEY)
    name = _path(metadata, "name")
    if _path(metadata, "labels", v.EVIDENCE_LABEL) != "true" or not isinstance(node, str) or not node:
        return None
    if name != evidence_name(node) or _path(metadata, "namespace") != v.EVIDENCE_NAMESPACE:
        return None
    owners = _items(_path(metadata, "ownerReferences"), 16)
    if not any(
        _path(o, "kind") == "Node" and _path(o, "apiVersion") == "v1" and _path(o, "name") == node for o in owners
    ):
        return None
    version = _path(metadata, "resourceVersion")
    return StoredEvidence(
        name=name,
        node=node,
        resource_version=version if isinstance(version, str) else "",
        expires=_time(_path(metadata, "annotations", v.EVIDENCE_EXPIRES_KEY)),
    )


class SweepAction(StrEnum):
    EXPIRE = "expire"  # the preservation ended: set EVIDENCE_EXPIRES_KEY
    RENEW = "renew"  # preserved again: remove EVIDENCE_EXPIRES_KEY
    DELETE = "delete"  # past its expiry


@dataclass(frozen=True)
class Sweep:
    action: SweepAction
    evidence: StoredEvidence
    expires: dt.datetime | None = None  # for EXPIRE


def preserved_nodes(machines: Iterable[Machine], *, now: dt.datetime, native: bool) -> set[str]:
    """The nodes whose evidence is kept: those of machines preserved by our record, or (MCM preserving natively)
    by MCM's expiry."""
    return {
        machine.node_name
        for machine in machines
        if machine.node_name
        and (
            machine.preservation is not None
            or (native and machine.mirrored_expiry is not None and machine.mirrored_expiry > now)
        )
    }


def plan_sweep(
    stored: Sequence[StoredEvidence], *, preserved: Collection[str], now: dt.datetime, grace: dt.timedelta
) -> list[Sweep]:
    """What becomes of each evidence ConfigMap: kept while its node is preserved (`preserved`: node names), kept
    `grace` after the preservation ended (seen ended first at `now`), then deleted; a node preserved again keeps
    it again. A zero grace deletes it once the preservation ended."""
    sweeps = []
    for evidence in stored:
        if evidence.node in preserved:
            if evidence.expires is not None:
                sweeps.append(Sweep(SweepAction.RENEW, evidence))
        elif evidence.expires is None and grace > dt.timedelta(0):
            sweeps.append(Sweep(SweepAction.EXPIRE, evidence, expires=now + grace))
        elif evidence.expires is None or evidence.expires <= now:
            sweeps.append(Sweep(SweepAction.DELETE, evidence))
    return sweeps


def sweep_period(grace: dt.timedelta) -> dt.timedelta:
    """How often the evidence ConfigMaps are looked at: a tenth of the grace, between a second and a minute (an
    evidence outlives its grace by at most this)."""
    if grace <= dt.timedelta(0):
        return SWEEP_PERIOD_MAX
    return min(max(grace / 10, SWEEP_PERIOD_MIN), SWEEP_PERIOD_MAX)


SWEEP_PERIOD_MIN: Final = dt.timedelta(seconds=1)
SWEEP_PERIOD_MAX: Final = dt.timedelta(minutes=1)


def captured_since(data: object, *, since: dt.datetime) -> bool:
    """Whether a stored evidence document (EVIDENCE_DATA_KEY's value) was captured at or after `since` (during the
    preservation that started then); not for a document that does not say when it was captured."""
    if not isinstance(data, str) or len(data) > 2 * v.EVIDENCE_MAX_BYTES:
        return False
    try:
        captured = _time(_path(json.loads(data), "capturedAt"))
    except ValueError:  # not JSON
        return False
    return captured is not None and captured >= since


def resource_version(obj: object) -> str:
    """An object's `metadata.resourceVersion` as read (ValueError when it has none)."""
    version = _path(obj, "metadata", "resourceVersion")
    if not isinstance(version, str) or not version:
        raise ValueError("the object has no resourceVersion")
    return version


def natively_preserved_since(machine: Machine, node: Node, *, now: dt.datetime) -> dt.datetime | None:
    """When MCM's own preservation (v0.62+) of this Failed machine started, if MCM preserves it now: its expiry is
    ahead; it started when the node's Preserved condition last turned (else, not shown yet, now). None otherwise."""
    expiry = machine.mirrored_expiry
    if machine.phase != v.MachinePhase.FAILED or expiry is None or expiry <= now:
        return None
    condition = node.preserved_condition
    if shows_preservation(condition) and condition is not None and condition.last_transition_time is not None:
        return min(condition.last_transition_time, now)
    return now
