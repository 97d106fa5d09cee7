"""What `show NODE` prints: the node's preservation (every field) and the evidence of its failure, read from the
evidence ConfigMap (core.evidence), as text or as the documented structure. Pure.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from machine_preservation.cli.kubectl.outcomes import cut
from machine_preservation.cli.kubectl.view import (
    NONE,
    STRUCTURE_VERSION,
    Condition,
    NodeRow,
    conditions_of,
    short_duration,
    table,
    tainted,
    time_left,
)
from machine_preservation.core import vocabulary as v
from machine_preservation.core.evidence import ContainerEvidence, Evidence, PodEvidence
from machine_preservation.core.preservation_record import format_timestamp

# A message in a table cell; the structured output carries the document's own (bounded) strings.
TEXT_LIMIT: Final = 160


@dataclass(frozen=True)
class EvidenceState:
    """The evidence ConfigMap as read: its `namespace/name`; the document, or why there is none."""

    where: str
    evidence: Evidence | None = None
    problem: str | None = None  # "none recorded", "cannot be read: ..."
    expires: str | None = None  # RFC 3339, once the preservation ended


def read_evidence(where: str, config_map: Mapping[str, Any] | None) -> EvidenceState:
    """The evidence in `config_map` (None: there is no such ConfigMap)."""
    if config_map is None:
        return EvidenceState(where=where, problem="none recorded")
    metadata = config_map.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    expires = annotations.get(v.EVIDENCE_EXPIRES_KEY) if isinstance(annotations, Mapping) else None
    expires = expires if isinstance(expires, str) else None
    data = config_map.get("data")
    raw = data.get(v.EVIDENCE_DATA_KEY) if isinstance(data, Mapping) else None
    if not isinstance(raw, str):
        return EvidenceState(where=where, problem=f"cannot be read: no {v.EVIDENCE_DATA_KEY}", expires=expires)
    try:
        evidence = Evidence.model_validate(json.loads(raw[: 2 * v.EVIDENCE_MAX_BYTES]))
    except (ValueError, ValidationError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return EvidenceState(where=where, problem=f"cannot be read: {cut(first, TEXT_LIMIT)}", expires=expires)
    return EvidenceState(where=where, evidence=evidence, expires=expires)


def _when(moment: dt.datetime | None, now: dt.datetime) -> str:
    if moment is None:
        return NONE
    ago = (now - moment).total_seconds()
    relative = f"{short_duration(ago)} ago" if ago >= 0 else f"in {short_duration(-ago)}"
    return f"{format_timestamp(moment)} ({relative})"


def _field(label: str, value: str) -> str:
    return f"{label + ':':<23}{value}"


def preservation_lines(row: NodeRow, preserved: Condition | None, now: dt.datetime, *, is_tainted: bool) -> list[str]:
    drain = row.drain.cell(wide=True)
    lines = [
        _field("Node", row.node),
        _field("Machine", row.machine or NONE),
        _field("Value", row.value or NONE),
        _field("Preserved by", row.preserved_by or NONE),
        _field("Since", _when(row.since.at, now) if row.since.at is not None else row.since.shown),
        _field("Until", row.until.shown + (f" ({time_left(row.seconds_left)} left)" if row.until.at else "")),
        _field("Ready", row.ready),
        _field("Drain", drain),
        _field("Scale-down protected", "yes" if row.scale_down_protected else "no"),
        _field("Tainted", f"{v.PRESERVED_TAINT_KEY}:{v.PRESERVED_TAINT_EFFECT}" if is_tainted else "no"),
    ]
    if preserved is not None:
        shown = ", ".join(part for part in (preserved.status, preserved.reason, preserved.message) if part)
        lines.append(_field("Preserved condition", cut(shown, 2 * TEXT_LIMIT)))
    return lines


def _container_summary(container: ContainerEvidence) -> str:
    last = container.last_termination_reason
    if container.last_termination_exit_code is not None:
        last = f"{last or 'exit'} ({container.last_termination_exit_code})"
    state = container.state + (f" ({container.state_reason})" if container.state_reason else "")
    return f"{container.name}: {state or NONE}, last {last or NONE}"


def _pod_cells(pod: PodEvidence) -> list[str]:
    restarts = sum(c.restart_count for c in pod.containers)
    terminations = [_container_summary(c) for c in pod.containers if c.last_termination_reason or c.restart_count]
    owner = f"{pod.owner_kind}/{pod.owner_name}" if pod.owner_kind else NONE
    phase = pod.phase + (f" ({pod.reason})" if pod.reason else "")
    if pod.deleted_at is not None:  # already being deleted at the failure (a pod stuck terminating shows here)
        phase = f"{phase or NONE}, terminating"
    return [
        cut(f"{pod.namespace}/{pod.name}", 2 * 48),
        cut(owner, 64),
        phase or NONE,
        str(restarts),
        cut("; ".join(terminations), TEXT_LIMIT) or NONE,
    ]


def _indented(text: str) -> list[str]:
    return ["  " + line for line in text.splitlines()]


def evidence_lines(state: EvidenceState, now: dt.datetime) -> list[str]:
    if state.evidence is None:
        return [_field("Evidence", f"{state.problem} ({state.where})")]
    evidence = state.evidence
    lines = [_field("Evidence", f"{state.where}, captured {_when(evidence.captured_at, now)}")]
    if state.expires:
        lines.append(_field("Evidence deleted at", state.expires))
    lines += ["", "Conditions at the failure:", *_condition_lines(evidence)]
    lines += ["", "Events (newest first):", *_event_lines(evidence)]
    lines += ["", "Pods on the node (newest first):"]
    if evidence.pods:
        lines += _indented(
            table(("POD", "OWNER", "PHASE", "RESTARTS", "LAST TERMINATIONS"), [_pod_cells(p) for p in evidence.pods])
        )
    else:
        lines.append("  none")
    return [*lines, *_operation_lines(evidence, now), *_gap_lines(evidence)]


def _condition_lines(evidence: Evidence) -> list[str]:
    return _indented(
        table(
            ("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"),
            [
                [
                    c.type,
                    c.status,
                    c.reason or NONE,
                    format_timestamp(c.last_transition_time) if c.last_transition_time else NONE,
                    cut(c.message, TEXT_LIMIT) or NONE,
                ]
                for c in evidence.conditions
            ],
        )
    )


def _event_lines(evidence: Evidence) -> list[str]:
    if not evidence.events:
        return ["  none"]
    return _indented(
        table(
            ("LAST SEEN", "TYPE", "REASON", "COUNT", "FROM", "MESSAGE"),
            [
                [
                    format_timestamp(e.last_time) if e.last_time else NONE,
                    e.type or NONE,
                    e.reason or NONE,
                    str(e.count),
                    cut(e.source, 48) or NONE,
                    cut(e.message, TEXT_LIMIT) or NONE,
                ]
                for e in evidence.events
            ],
        )
    )


def _operation_lines(evidence: Evidence, now: dt.datetime) -> list[str]:
    operation = evidence.machine.last_operation
    lines = [
        "",
        f"MCM's last operation on Machine {evidence.machine.name or NONE} (phase {evidence.machine.phase or NONE}):",
        f"  {operation.type or NONE} {operation.state or NONE} at {_when(operation.last_update_time, now)}",
    ]
    if operation.description:
        lines.append(f"  {cut(operation.description, 4 * TEXT_LIMIT)}")
    return lines


def _gap_lines(evidence: Evidence) -> list[str]:
    """What the controller could not read, and what the document left out."""
    lines: list[str] = []
    if evidence.unavailable:
        lines += ["", "Not recorded:", *(f"  {cut(item, TEXT_LIMIT)}" for item in evidence.unavailable)]
    truncated = evidence.truncated
    left_out = [
        f"{count} {what}"
        for count, what in (
            (truncated.conditions, "conditions"),
            (truncated.events, "events"),
            (truncated.pods, "pods"),
            (truncated.containers, "containers"),
            (truncated.strings, "strings cut"),
        )
        if count
    ]
    if left_out or truncated.to_fit_size:
        size = " (to fit the size limit)" if truncated.to_fit_size else ""
        lines += ["", f"Left out of the evidence{size}: {', '.join(left_out) or 'the oldest items'}"]
    return lines


def show_text(row: NodeRow, node: Mapping[str, Any], state: EvidenceState, now: dt.datetime) -> str:
    preserved = next((c for c in conditions_of(node) if c.type == v.PRESERVED_CONDITION_TYPE), None)
    lines = preservation_lines(row, preserved, now, is_tainted=tainted(node))
    return "\n".join([*lines, *evidence_lines(state, now)])


def show_structure(row: NodeRow, node: Mapping[str, Any], state: EvidenceState) -> dict[str, Any]:
    """The documented structure of `show -o json|yaml`."""
    return {
        "kind": "NodePreservation",
        "version": STRUCTURE_VERSION,
        "preservation": row.structure(),
        "tainted": tainted(node),
        "conditions": [c.structure() for c in conditions_of(node)],
        "evidence": {
            "configMap": state.where,
            "problem": state.problem,
            "expires": state.expires,
            "document": None if state.evidence is None else state.evidence.model_dump(mode="json", by_alias=True),
        },
    }
