"""The record of a preservation, kept in the Machine's annotations: since when, until when, why, and the
outcome of the current failure's drain.

Annotations are the one place every MCM version leaves alone: MCM v0.61 prunes (CRD) or drops (status
writes of its own types) `status.currentStatus.preserveExpiryTime`, so the expiry there is only a mirror for
`kubectl get machines`, never read back. Condition messages are for people and are never read either.

Only the controller's identity may write the record (the webhook denies everyone else), but while the
webhook is down anyone could; so the record is read defensively:
- the expiry in force is capped at `since + max_timeout`, whoever wrote `until`;
- a record whose times do not parse is *damaged*: it counts as a preservation that has run out, so the
  controller ends it the ordinary way (a damaged record never keeps a machine forever).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from machine_preservation.core import vocabulary as v

# A damaged record's times: long past, so it reads as expired.
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def format_timestamp(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as the API server writes timestamps."""
    utc = moment.astimezone(dt.UTC) if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str | None) -> dt.datetime | None:
    """An RFC 3339 timestamp with a zone (`Z` or an offset), as UTC; None when absent or malformed."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
        if moment.tzinfo is None:
            return None  # a time without a zone is ambiguous
        return moment.astimezone(dt.UTC)
    except (ValueError, OverflowError):  # OverflowError: a zone that moves year 1 or 9999 out of range
        return None


@dataclass(frozen=True)
class DrainRecord:
    """The drain of the current failure: drained, or failing since `failing_since` (last tried at `last_attempt`)."""

    outcome: v.DrainOutcome
    failing_since: dt.datetime | None = None
    last_attempt: dt.datetime | None = None

    def annotations(self) -> dict[str, str]:
        written = {v.PRESERVED_DRAIN_ANNOTATION: self.outcome.value}
        if self.failing_since is not None:
            written[v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION] = format_timestamp(self.failing_since)
        if self.last_attempt is not None:
            written[v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION] = format_timestamp(self.last_attempt)
        return written


@dataclass(frozen=True)
class PreservationRecord:
    since: dt.datetime
    until: dt.datetime  # as written; `expiry()` is what counts
    by: v.PreservedBy
    drain: DrainRecord | None = None
    damaged: bool = False
    added_ca_annotation: bool = False  # this preservation put the CA annotation on the node (or took it over)
    announcement_pending: bool = False  # its PreservationStarted Events are not recorded yet
    node_gone_since: dt.datetime | None = None  # the machine's Node is gone since then (None: it exists)

    def expiry(self, *, max_timeout: dt.timedelta) -> dt.datetime:
        """When the preservation ends: `until`, but never later than `since + max_timeout`."""
        return min(self.until, self.since + max_timeout)

    def expired(self, *, now: dt.datetime, max_timeout: dt.timedelta) -> bool:
        return self.expiry(max_timeout=max_timeout) <= now

    def annotations(self) -> dict[str, str]:
        """The annotations that say exactly this record (the drain keys only when there is a drain record)."""
        written = {
            v.PRESERVED_SINCE_ANNOTATION: format_timestamp(self.since),
            v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(self.until),
            v.PRESERVED_BY_ANNOTATION: self.by.value,
        }
        if self.added_ca_annotation:
            written[v.PRESERVED_ADDED_CA_ANNOTATION] = "true"
        if self.announcement_pending:
            written[v.PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION] = "true"
        if self.drain is not None:
            written.update(self.drain.annotations())
        if self.node_gone_since is not None:
            written[v.PRESERVED_NODE_GONE_SINCE_ANNOTATION] = format_timestamp(self.node_gone_since)
        return written


def start_record(
    *, now: dt.datetime, timeout: dt.timedelta, max_timeout: dt.timedelta, by: v.PreservedBy
) -> PreservationRecord:
    """A new preservation from now for `timeout` (at most `max_timeout`), in whole seconds as stored."""
    since = now.astimezone(dt.UTC).replace(microsecond=0)
    return PreservationRecord(since=since, until=since + min(timeout, max_timeout), by=by)


def read_record(annotations: Mapping[str, str]) -> PreservationRecord | None:
    """The record the annotations hold; None when there is none (no record key at all)."""
    if not any(key in annotations for key in v.PRESERVATION_RECORD_ANNOTATIONS):
        return None
    since = parse_timestamp(annotations.get(v.PRESERVED_SINCE_ANNOTATION))
    until = parse_timestamp(annotations.get(v.PRESERVED_UNTIL_ANNOTATION))
    by_raw = annotations.get(v.PRESERVED_BY_ANNOTATION, "")
    by = v.PreservedBy(by_raw) if by_raw in v.PreservedBy._value2member_map_ else v.PreservedBy.USER
    if since is None or until is None:
        return PreservationRecord(since=_EPOCH, until=_EPOCH, by=by, damaged=True)
    return PreservationRecord(
        since=since,
        until=until,
        by=by,
        drain=_read_drain(annotations),
        added_ca_annotation=annotations.get(v.PRESERVED_ADDED_CA_ANNOTATION) == "true",
        announcement_pending=annotations.get(v.PRESERVED_ANNOUNCEMENT_PENDING_ANNOTATION) == "true",
        # A damaged time reads as "gone since the epoch": the Node is still missing, and nothing is announced again.
        node_gone_since=(
            parse_timestamp(annotations[v.PRESERVED_NODE_GONE_SINCE_ANNOTATION]) or _EPOCH
            if v.PRESERVED_NODE_GONE_SINCE_ANNOTATION in annotations
            else None
        ),
    )


def _read_drain(annotations: Mapping[str, str]) -> DrainRecord | None:
    raw = annotations.get(v.PRESERVED_DRAIN_ANNOTATION, "")
    if raw not in v.DrainOutcome._value2member_map_:
        return None  # absent or damaged: the drain is simply done again
    outcome = v.DrainOutcome(raw)
    if outcome == v.DrainOutcome.DRAINED:
        return DrainRecord(outcome=outcome)
    failing_since = parse_timestamp(annotations.get(v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION))
    last_attempt = parse_timestamp(annotations.get(v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION))
    if failing_since is None or last_attempt is None:
        return None
    return DrainRecord(outcome=outcome, failing_since=failing_since, last_attempt=last_attempt)


def record_patch(
    *, current: Mapping[str, str], record: PreservationRecord | None
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The annotation changes (set, remove) that make `current` hold exactly `record` (None: no record)."""
    wanted = record.annotations() if record is not None else {}
    to_set = {key: value for key, value in wanted.items() if current.get(key) != value}
    to_remove = tuple(key for key in v.PRESERVATION_RECORD_ANNOTATIONS if key in current and key not in wanted)
    return to_set, to_remove
