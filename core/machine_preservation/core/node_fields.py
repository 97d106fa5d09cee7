"""The preservation as its Node tells it, in fields meant for programs (vocabulary: NODE_PRESERVATION_ANNOTATIONS
and NODE_DRAIN_ANNOTATIONS): a shoot's SRE can read the Node but not the Machine in the seed, and a condition
message is written for people, never to be parsed.

The fields are derived, like the condition: the mirror of the Machine's record (since, until, by) under the same
keys, `until` being the expiry in force (a record's `until` past the maximum counts as capped); the drain state
from the record's drain outcome, `draining` while the first attempt of the current failure is pending or running
(a retry leaves `failed` until it succeeds: no two writes per attempt); and, while the drain failed, what the last
attempt found: how many pods are left and which PodDisruptionBudgets refused. Those two only the drain's outcome
knows (`lifecycle.plan_after_drain`); a plan keeps them as they are. Each plan diffs the fields it wants with the
Node's, so a converged node costs no write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from machine_preservation.core import vocabulary as v
from machine_preservation.core.plan import PatchNodeAnnotations
from machine_preservation.core.preservation_record import PreservationRecord, format_timestamp

# The fields a preserved node's plan keeps converged.
FIELDS = (*v.NODE_PRESERVATION_ANNOTATIONS, *v.NODE_DRAIN_ANNOTATIONS)
# Every key that tells about a preservation on a Node: all of them go when it stops (the evidence's name too, which
# the evidence's writer sets).
STOP_REMOVES = (*FIELDS, v.PRESERVED_EVIDENCE_ANNOTATION)
_MIRRORED = (v.PRESERVED_SINCE_ANNOTATION, v.PRESERVED_UNTIL_ANNOTATION, v.PRESERVED_BY_ANNOTATION)


def preserved_fields(
    *, record: PreservationRecord, expiry: dt.datetime, failed: bool, current: Mapping[str, str]
) -> dict[str, str]:
    """The fields of a preserved machine's Node: `record` is the record the plan leaves and `expiry` its expiry in
    force, `failed` whether the plan is for a Failed machine (only a Failed machine's node is drained), `current` the
    Node's annotations."""
    fields = {
        v.PRESERVED_SINCE_ANNOTATION: format_timestamp(record.since),
        v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(expiry),
        v.PRESERVED_BY_ANNOTATION: record.by.value,
    }
    if not failed:
        return fields
    drain = record.drain
    if drain is None:
        fields[v.PRESERVED_DRAIN_ANNOTATION] = v.NodeDrainState.DRAINING.value
    elif drain.outcome == v.DrainOutcome.DRAINED:
        fields[v.PRESERVED_DRAIN_ANNOTATION] = v.NodeDrainState.DRAINED.value
    else:
        fields[v.PRESERVED_DRAIN_ANNOTATION] = v.NodeDrainState.FAILED.value
        fields.update({key: current[key] for key in v.NODE_DRAIN_ANNOTATIONS if key in current})
    return fields


def fields_after_drain(
    *, before: Mapping[str, str], drained: bool, pods_left: int, blocked_by: Sequence[str] | None
) -> dict[str, str]:
    """The fields once a drain attempt ended, from `before` (the fields the plan left): `blocked_by` names the
    PodDisruptionBudgets that refused its evictions (None: the attempt evicted nothing, the last names stay)."""
    fields = {key: value for key, value in before.items() if key in _MIRRORED}
    if drained:
        fields[v.PRESERVED_DRAIN_ANNOTATION] = v.NodeDrainState.DRAINED.value
        return fields
    fields[v.PRESERVED_DRAIN_ANNOTATION] = v.NodeDrainState.FAILED.value
    fields[v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION] = str(pods_left)
    names = (
        blocked_by_value(blocked_by) if blocked_by is not None else before.get(v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION)
    )
    if names:
        fields[v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION] = names
    return fields


def blocked_by_value(budgets: Sequence[str]) -> str:
    """The PodDisruptionBudgets (`namespace/name`) as the Node names them: sorted, at most DRAIN_BLOCKED_BY_LIMIT."""
    return ",".join(sorted(set(budgets))[: v.DRAIN_BLOCKED_BY_LIMIT])


def fields_patch(
    *, current: Mapping[str, str], wanted: Mapping[str, str], keys: Sequence[str] = FIELDS
) -> PatchNodeAnnotations:
    """The write that makes the Node's `keys` say exactly `wanted` (empty where they do)."""
    return PatchNodeAnnotations(
        set={key: value for key, value in wanted.items() if current.get(key) != value},
        remove=tuple(key for key in keys if key in current and key not in wanted),
    )
