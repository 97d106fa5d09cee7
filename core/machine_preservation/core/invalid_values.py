"""Reporting invalid preserve values once each, not on every reconcile.

An invalid value is treated as absent and reported with a Warning Event. To keep the steady state free of
API writes, the values already reported are recorded on the Machine in
REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION: a JSON list of `[kind, key]`. A value not in the record is
reported and recorded (one Machine write with its Event); the record follows the current findings, and
goes away when the values are fixed. A value that comes back after being fixed is reported again.

The record is small whatever the values: it shares the Machine's 256 KiB annotation budget with the very
value it reports (which may be huge, written while the webhook was down), so it must never be what makes a
patch too large. A short value is kept as it is (readable with kubectl); a long one, or one that looks like
a digest, is kept as `sha256:` + 32 hex digits of its SHA-256. At most MAX_ENTRIES entries are kept, so the
record stays under RECORD_LIMIT bytes. The Event shows at most SHOWN_CHARACTERS characters of the value.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Final

from machine_preservation.core import events
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine
from machine_preservation.core.plan import PatchMachineAnnotations, RecordEvent
from machine_preservation.core.preserve_value import InvalidValue

# A value whose JSON text (quotes included) is at most this long is recorded as it is.
LITERAL_LIMIT: Final = 66
DIGEST_PREFIX: Final = "sha256:"
_DIGEST_HEX: Final = 32
_DIGEST = re.compile(re.escape(DIGEST_PREFIX) + f"[0-9a-f]{{{_DIGEST_HEX}}}")
# A Machine has one preserve value of its own and one from its node; room to spare for both.
MAX_ENTRIES: Final = 4
# Each entry is at most `[` + two keys of LITERAL_LIMIT + `,` + `]`, entries joined by `,`, in `[...]`.
RECORD_LIMIT: Final = 2 + MAX_ENTRIES * (3 + 2 * LITERAL_LIMIT + 1)
# How much of a value an Event shows; the rest is summarised by its length.
SHOWN_CHARACTERS: Final = 48


def record_key(text: str) -> str:
    """What the record keeps of `text`: the text itself when short, else its digest."""
    if len(json.dumps(text)) <= LITERAL_LIMIT and not text.startswith(DIGEST_PREFIX):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return DIGEST_PREFIX + digest[:_DIGEST_HEX]


def _known_key(entry: str) -> str:
    """An entry read back from a record, as a key: digests stay; anything else (older records kept every
    value whole) is keyed like a value, so an upgrade does not report those values again."""
    return entry if _DIGEST.fullmatch(entry) else record_key(entry)


def _entries(invalid: Sequence[InvalidValue]) -> list[tuple[str, str]]:
    keys = dict.fromkeys((record_key(finding.kind), record_key(finding.value)) for finding in invalid)
    return list(keys)[:MAX_ENTRIES]


def record_of(invalid: Sequence[InvalidValue]) -> str:
    """The record for these findings (at most RECORD_LIMIT bytes)."""
    return json.dumps([list(entry) for entry in _entries(invalid)], separators=(",", ":"))


def _reported(machine: Machine) -> set[tuple[str, str]]:
    raw = machine.metadata.annotations.get(v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION)
    if raw is None:
        return set()
    try:
        entries = json.loads(raw)
    except (ValueError, RecursionError):
        return set()  # a damaged record: report again
    if not isinstance(entries, list):
        return set()
    return {
        (_known_key(entry[0]), _known_key(entry[1]))
        for entry in entries
        if isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)
    }


def shown_value(text: str) -> str:
    """The value as an Event shows it: escaped like a JSON string (no raw quotes or control characters), at
    most SHOWN_CHARACTERS characters of it, and the full length when cut."""
    if len(text) <= SHOWN_CHARACTERS:
        return json.dumps(text, ensure_ascii=False)[1:-1]
    head = json.dumps(text[:SHOWN_CHARACTERS], ensure_ascii=False)[1:-1]
    return f"{head}... ({len(text)} characters)"


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
    recorded = set(_entries(invalid))
    new_events: list[RecordEvent] = []
    for finding in invalid:
        entry = (record_key(finding.kind), record_key(finding.value))
        # A finding beyond the record's room is not reported either: it could not be remembered, and
        # reporting it on every reconcile would flood Events.
        if entry in recorded and entry not in reported:
            reported.add(entry)
            new_events.append(
                events.invalid_value(InvalidValue(finding.kind, finding.name, shown_value(finding.value)))
            )
    return PatchMachineAnnotations(set={v.REPORTED_INVALID_PRESERVE_VALUES_ANNOTATION: record}), tuple(new_events)
