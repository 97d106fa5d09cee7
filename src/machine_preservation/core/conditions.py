"""The Node's `Preserved` condition: its reasons, its messages and when it must be (re)written.

Messages keep upstream's functional prefixes (reference §1.3): "Preserved node drained successfully." records
that the drain of the current failure is done, so it is not repeated; "Preserved node could not be drained."
records a failed drain, followed by the pods still blocking it (as Cluster API's drain condition names them).
The time is `preserveExpiryTime` in Go's default time format (`2026-08-23 10:00:00 +0000 UTC`).

`lastTransitionTime` follows the Kubernetes convention (now when the status changes, else kept), not
upstream's "kept when an existing condition flips" (reference §1.3, code-read).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.models import Node, NodeCondition
from machine_preservation.core.plan import DrainNode, SetPreservedCondition
from machine_preservation.core.preserve_value import Preference

TRUE = "True"
FALSE = "False"
# Enough names to act on without making the condition unreadable.
MAX_LISTED_BLOCKING_PODS = 10


def go_time_string(moment: dt.datetime) -> str:
    """Render like Go's time.Time.String() for a UTC time: `2026-08-23 10:00:00.5 +0000 UTC`."""
    utc = moment.astimezone(dt.UTC) if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    fraction = f".{utc.microsecond:06d}".rstrip("0") if utc.microsecond else ""
    return f"{utc:%Y-%m-%d %H:%M:%S}{fraction} +0000 UTC"


def reason_for(preference: Preference) -> v.ConditionReason:
    """`Preserved by MCM.` for the auto value, `Preserved by user.` for any other value."""
    return v.ConditionReason.PRESERVED_BY_MCM if preference == Preference.AUTO else v.ConditionReason.PRESERVED_BY_USER


def preserved_until_message(expiry: dt.datetime) -> str:
    return f"{v.PRESERVED_UNTIL_MESSAGE_PREFIX} {go_time_string(expiry)}."


def drained_message(expiry: dt.datetime) -> str:
    return f"{v.DRAINED_SUCCESSFULLY_MESSAGE} {preserved_until_message(expiry)}"


def drain_failed_message(
    expiry: dt.datetime, blocking_pods: Sequence[str], *, gave_up_after: dt.timedelta | None = None
) -> str:
    message = f"{v.DRAIN_FAILED_MESSAGE} {preserved_until_message(expiry)}"
    pods = sorted(set(blocking_pods))  # sorted: the same blockers give the same message
    if pods:
        listed = ", ".join(pods[:MAX_LISTED_BLOCKING_PODS])
        more = len(pods) - MAX_LISTED_BLOCKING_PODS
        message += f" Pods blocking the drain: {listed}{f' and {more} more' if more > 0 else ''}."
    if gave_up_after is not None:
        message += f" {gave_up_message(gave_up_after)}"
    return message


def gave_up_message(timeout: dt.timedelta) -> str:
    return (
        f"Evictions stopped after the drain timeout ({format_go_duration(timeout)}); "
        "the node counts as drained once these pods are gone."
    )


def evictions_exhausted(
    condition: NodeCondition | None, *, timeout: dt.timedelta, expiry: dt.datetime, now: dt.datetime
) -> bool:
    """Whether the drain of the preservation running until `expiry` has been failing for `timeout` (since the
    condition turned to "could not be drained"). A failure recorded for an earlier preservation (its message
    names another expiry) does not count: a new preservation gets the full timeout."""
    return (
        is_drain_failed(condition)
        and condition is not None
        and preserved_until_message(expiry) in condition.message
        and condition.last_transition_time is not None
        and now >= condition.last_transition_time + timeout
    )


def is_drained(condition: NodeCondition | None) -> bool:
    """Whether the condition records a successful drain of the current failure."""
    return (
        condition is not None
        and condition.status == TRUE
        and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
    )


def is_drain_failed(condition: NodeCondition | None) -> bool:
    return condition is not None and condition.status == FALSE and condition.message.startswith(v.DRAIN_FAILED_MESSAGE)


def is_stopped(condition: NodeCondition) -> bool:
    return condition.status == FALSE and condition.reason == v.ConditionReason.PRESERVATION_STOPPED


def shows_preservation(condition: NodeCondition | None) -> bool:
    """Whether the condition says the node is (being) preserved: present and not `Preservation stopped.`."""
    return condition is not None and not is_stopped(condition)


def condition_step(
    *,
    current: NodeCondition | None,
    status: str,
    reason: str,
    message: str,
    now: dt.datetime,
    last_heartbeat_time: dt.datetime | None = None,
) -> SetPreservedCondition | None:
    """The write that makes the condition say this; None when it already does (status, reason, message)."""
    if current is not None and (current.status, current.reason, current.message) == (status, reason, message):
        return None
    return SetPreservedCondition(
        status=status,
        reason=reason,
        message=message,
        last_transition_time=_transition_time(current, status, now),
        last_heartbeat_time=last_heartbeat_time,
    )


def condition_after_drain(
    *, node: Node, drain: DrainNode, drained: bool, blocking_pods: Sequence[str], now: dt.datetime
) -> SetPreservedCondition | None:
    """The condition to write once the drain `drain` ended; `blocking_pods` as `namespace/name`.

    After an eviction attempt always a write (its heartbeat records the attempt, which paces the next one
    after a failure). After a look without evictions (`drain.evict` False) that finds the node still blocked,
    a write only when the message changes (None otherwise), with the heartbeat kept.
    """
    if drain.expiry is None:
        raise ValueError("DrainNode.expiry is required to describe the drain outcome")
    current = node.preserved_condition
    status = TRUE if drained else FALSE
    if not drained and not drain.evict:
        if drain.timeout is None:
            raise ValueError("DrainNode.timeout is required when evictions were given up")
        message = drain_failed_message(drain.expiry, blocking_pods, gave_up_after=drain.timeout)
        return condition_step(
            current=current,
            status=status,
            reason=drain.reason,
            message=message,
            now=now,
            last_heartbeat_time=current.last_heartbeat_time if current is not None else None,
        )
    message = drained_message(drain.expiry) if drained else drain_failed_message(drain.expiry, blocking_pods)
    return SetPreservedCondition(
        status=status,
        reason=drain.reason,
        message=message,
        last_transition_time=_transition_time(current, status, now),
        last_heartbeat_time=now,
    )


def _transition_time(current: NodeCondition | None, status: str, now: dt.datetime) -> dt.datetime:
    if current is not None and current.status == status and current.last_transition_time is not None:
        return current.last_transition_time
    return now
