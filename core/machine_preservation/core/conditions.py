"""The Node's `Preserved` condition: its reasons, its messages and when it must be (re)written.

Messages are for people and are never read back to decide anything (the drain's outcome is in the
preservation record). They keep upstream MCM's wording, which MCM v0.62 itself reads when it takes over a
preservation: "Preserved node drained successfully." once the drain of the current failure is done;
"Preserved node could not be drained." after a failed attempt, followed by the pods still blocking it (as
Cluster API's drain condition names them); while the first drain runs, "Preserved node is being drained."
with the pods it waits for. The time is the expiry in Go's default time format (`2026-08-23 10:00:00 +0000 UTC`).

`lastTransitionTime` follows the Kubernetes convention (now when the status changes, else kept).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.models import Node, NodeCondition
from machine_preservation.core.plan import DrainNode, SetPreservedCondition

TRUE = "True"
FALSE = "False"
# Enough names to act on without making the condition unreadable.
MAX_LISTED_BLOCKING_PODS = 10


def go_time_string(moment: dt.datetime) -> str:
    """Render like Go's time.Time.String() for a UTC time: `2026-08-23 10:00:00.5 +0000 UTC`."""
    utc = moment.astimezone(dt.UTC) if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    fraction = f".{utc.microsecond:06d}".rstrip("0") if utc.microsecond else ""
    return f"{utc:%Y-%m-%d %H:%M:%S}{fraction} +0000 UTC"


def reason_for(value: v.PreserveValue) -> v.ConditionReason:
    """`Preserved by MCM.` for the auto value, `Preserved by user.` for any other value."""
    return v.ConditionReason.PRESERVED_BY_MCM if value == v.PreserveValue.AUTO else v.ConditionReason.PRESERVED_BY_USER


def preserved_until_message(expiry: dt.datetime) -> str:
    return f"{v.PRESERVED_UNTIL_MESSAGE_PREFIX} {go_time_string(expiry)}."


def drained_message(expiry: dt.datetime) -> str:
    return f"{v.DRAINED_SUCCESSFULLY_MESSAGE} {preserved_until_message(expiry)}"


def draining_message(expiry: dt.datetime, pods: Sequence[str]) -> str:
    return f"{v.DRAINING_MESSAGE} {preserved_until_message(expiry)}{_listed_pods('Waiting for pods', pods)}"


def _listed_pods(label: str, pods: Sequence[str]) -> str:
    names = sorted(set(pods))  # sorted: the same pods give the same message
    if not names:
        return ""
    listed = ", ".join(names[:MAX_LISTED_BLOCKING_PODS])
    more = len(names) - MAX_LISTED_BLOCKING_PODS
    return f" {label}: {listed}{f' and {more} more' if more > 0 else ''}."


def drain_failed_message(
    expiry: dt.datetime, blocking_pods: Sequence[str], *, gave_up_after: dt.timedelta | None = None
) -> str:
    message = f"{v.DRAIN_FAILED_MESSAGE} {preserved_until_message(expiry)}"
    message += _listed_pods("Pods blocking the drain", blocking_pods)
    if gave_up_after is not None:
        message += f" {gave_up_message(gave_up_after)}"
    return message


def gave_up_message(timeout: dt.timedelta) -> str:
    return (
        f"Evictions stopped after the drain timeout ({format_go_duration(timeout)}); "
        "the node counts as drained once these pods are gone."
    )


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
) -> SetPreservedCondition | None:
    """The write that makes the condition say this; None when it already does (status, reason, message)."""
    if current is not None and (current.status, current.reason, current.message) == (status, reason, message):
        return None
    return SetPreservedCondition(
        status=status,
        reason=reason,
        message=message,
        last_transition_time=_transition_time(current, status, now),
    )


def condition_after_drain(
    *, node: Node, drain: DrainNode, drained: bool, blocking_pods: Sequence[str], now: dt.datetime
) -> SetPreservedCondition | None:
    """The condition to write once the drain `drain` ended (None: it already says so); `blocking_pods` as
    `namespace/name`. After evictions were given up (`drain.evict` False) a still blocked node says so."""
    if drain.expiry is None:
        raise ValueError("DrainNode.expiry is required to describe the drain outcome")
    if drained:
        message = drained_message(drain.expiry)
    else:
        if not drain.evict and drain.timeout is None:
            raise ValueError("DrainNode.timeout is required when evictions were given up")
        gave_up_after = drain.timeout if not drain.evict else None
        message = drain_failed_message(drain.expiry, blocking_pods, gave_up_after=gave_up_after)
    return condition_step(
        current=node.preserved_condition,
        status=TRUE if drained else FALSE,
        reason=drain.reason,
        message=message,
        now=now,
    )


def written(node: Node, step: SetPreservedCondition) -> Node:
    """`node` as the step leaves it: the Preserved condition replaced, the others kept (the strategic merge patch
    is keyed by type)."""
    condition = NodeCondition(
        type=v.PRESERVED_CONDITION_TYPE,
        status=step.status,
        reason=step.reason,
        message=step.message,
        last_transition_time=step.last_transition_time,
    )
    others = [c for c in node.status.conditions if c.type != v.PRESERVED_CONDITION_TYPE]
    return node.model_copy(update={"status": node.status.model_copy(update={"conditions": [*others, condition]})})


def _transition_time(current: NodeCondition | None, status: str, now: dt.datetime) -> dt.datetime:
    if current is not None and current.status == status and current.last_transition_time is not None:
        return current.last_transition_time
    return now
