"""Reporting invalid preserve values once each, not on every reconcile.

An invalid value is treated as absent (DESIGN.md §3) and reported with a Warning Event. To keep the steady
state free of API writes, the values already reported are recorded on the Machine in
REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION (JSON list of `[kind, value]`). A value not in the record is
reported and recorded (one Machine write with its Event); the record follows the current findings, and
goes away when the values are fixed. A value that comes back after being fixed is reported again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from machine_preservation.core import events
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine
from machine_preservation.core.plan import PatchMachineAnnotations, RecordEvent
from machine_preservation.core.preserve_value import InvalidValue


def record_of(invalid: Sequence[InvalidValue]) -> str:
    return json.dumps([[finding.kind, finding.value] for finding in invalid], separators=(",", ":"))


def _reported(machine: Machine) -> set[tuple[str, str]]:
    raw = machine.metadata.annotations.get(v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION)
    if raw is None:
        return set()
    try:
        entries = json.loads(raw)
    except ValueError:
        return set()  # a damaged record: report again
    if not isinstance(entries, list):
        return set()
    return {
        (entry[0], entry[1])
        for entry in entries
        if isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)
    }


def report_invalid_values(
    *, machine: Machine, invalid: Sequence[InvalidValue]
) -> tuple[PatchMachineAnnotations, tuple[RecordEvent, ...]]:
    """The record update and the Warning Events for values not reported yet (both empty when up to date)."""
    current = machine.metadata.annotations.get(v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION)
    if not invalid:
        if current is None:
            return PatchMachineAnnotations(), ()
        return PatchMachineAnnotations(remove=(v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION,)), ()
    record = record_of(invalid)
    if current == record:
        return PatchMachineAnnotations(), ()
    reported = _reported(machine)
    new_events = tuple(
        events.invalid_value(finding) for finding in invalid if (finding.kind, finding.value) not in reported
    )
    return PatchMachineAnnotations(set={v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION: record}), new_events
