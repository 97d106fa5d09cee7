"""The machine plan around the preservation record: the cap on whatever `until` says, the pool's timeout, the
"being drained" condition of a first drain, and the drain record's pacing over several attempts."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.conditions import drain_failed_message, drained_message, draining_message
from machine_preservation.core.models import Node
from machine_preservation.core.plan import (
    DeleteMachine,
    DrainNode,
    MachinePlan,
    PatchMachineAnnotations,
    PatchNodeAnnotations,
    RecordEvent,
    SetPreservedCondition,
    SetPreserveExpiry,
)
from machine_preservation.core.preservation_record import DrainRecord, format_timestamp, parse_timestamp

from .lifecycle_helpers import CONFIG, execute, of_type, only, plan, write_kinds, writes
from .preservation_objects import HOUR, NOW, machine, node, node_fields_of, preserved_condition

FAILED, RUNNING = v.MachinePhase.FAILED, v.MachinePhase.RUNNING
MINUTE = dt.timedelta(minutes=1)
MAX = CONFIG.max_preserve_timeout
MIRROR = dataclasses.replace(CONFIG, mirror_status=True)
FAR = NOW + 10_000 * HOUR
WAS_DRAINED = DrainRecord(outcome=v.DrainOutcome.DRAINED)
T = NOW + 72 * HOUR

# --- an until far in the future ----------------------------------------------------------------------------


def test_an_until_far_in_the_future_counts_as_since_plus_the_maximum() -> None:
    since = NOW - HOUR
    capped = since + MAX
    m = machine(
        phase=FAILED, preserve="now", expiry=FAR, since=since, drain=WAS_DRAINED, priority="5", last_priority=""
    )
    condition = preserved_condition(message=drained_message(FAR))
    n = node(ca="true", tainted=True, condition=condition, fields=node_fields_of(m, "drained"))
    result = plan(m, n, config=MIRROR)
    # the node (its condition and its fields) and the mirror show the capped expiry, the plan wakes up then; the
    # record is not rewritten
    assert writes(result) == [
        SetPreserveExpiry(expiry=capped),
        PatchNodeAnnotations(set={v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(capped)}),
        SetPreservedCondition(
            status="True",
            reason=v.ConditionReason.PRESERVED_BY_USER,
            message=drained_message(capped),
            last_transition_time=NOW - 10 * HOUR,
        ),
    ]
    assert result.requeue_after == capped - NOW
    steady_machine, steady_node = execute(m, n, result)
    assert steady_machine.metadata.annotations[v.PRESERVED_UNTIL_ANNOTATION] == format_timestamp(FAR)
    assert plan(steady_machine, steady_node, config=MIRROR) == MachinePlan(requeue_after=capped - NOW)


@pytest.mark.parametrize(
    ("phase", "value", "ending"),
    [(FAILED, "now", "DeleteMachine"), (FAILED, "when-failed", "DeleteMachine"), (RUNNING, "now", "removed")],
)
def test_at_since_plus_the_maximum_the_preservation_ends_whatever_until_says(
    phase: str, value: str, ending: str
) -> None:
    since = NOW - HOUR
    m = machine(phase=phase, preserve=value, expiry=FAR, since=since, priority="5", last_priority="")
    n = node(ca="true", condition=preserved_condition(message=drained_message(FAR)))
    before = plan(m, n, now=since + MAX - dt.timedelta(seconds=1))
    assert not of_type(before, DeleteMachine)
    assert before.requeue_after == dt.timedelta(seconds=1)
    result = plan(m, n, now=since + MAX)
    if ending == "DeleteMachine":
        assert write_kinds(result)[-1] == "DeleteMachine"
    else:
        last = writes(result)[-1]
        assert isinstance(last, PatchMachineAnnotations)
        assert v.PRESERVED_SINCE_ANNOTATION in last.remove
        # expired: the preserve annotation goes too, so it is not preserved again
        assert v.PRESERVE_ANNOTATION in of_type(result, PatchMachineAnnotations)[0].remove
    expired = [e for e in of_type(result, RecordEvent) if e.reason == v.EventReason.PRESERVATION_EXPIRED]
    assert expired
    assert all("2026-09-19 09:00:00 +0000 UTC" in e.message for e in expired), "names the capped expiry"


def test_a_lower_maximum_ends_a_running_preservation_sooner() -> None:
    m = machine(preserve="now", expiry=NOW + 5 * HOUR, since=NOW - 3 * HOUR, priority="5", last_priority="")
    config = dataclasses.replace(CONFIG, max_preserve_timeout=2 * HOUR)
    assert write_kinds(plan(m, node(), config=config))[-1] == "PatchMachineAnnotations"
    assert not plan(m, node(), config=config).requeue_after


# --- the pool's timeout ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "pool", "max_timeout", "runs_for"),
    [
        (None, 5 * HOUR, MAX, 5 * HOUR),  # no spec timeout: the pool's
        ("1h", 5 * HOUR, MAX, HOUR),  # the Machine's own wins
        ("soon", 5 * HOUR, MAX, 5 * HOUR),  # an invalid spec value: the pool's
        (None, None, MAX, 72 * HOUR),  # neither: the configured default
        (None, 1000 * HOUR, MAX, MAX),  # capped by the maximum
        (None, 10 * HOUR, 4 * HOUR, 4 * HOUR),
    ],
)
def test_a_start_uses_the_pool_timeout_without_a_spec_timeout_capped_by_the_maximum(
    spec: str | None, pool: dt.timedelta | None, max_timeout: dt.timedelta, runs_for: dt.timedelta
) -> None:
    config = dataclasses.replace(CONFIG, max_preserve_timeout=max_timeout)
    m = machine(phase=FAILED, preserve="when-failed", timeout=spec)
    result = plan(m, node(), pool_timeout=pool, config=config)
    record = of_type(result, PatchMachineAnnotations)[0].set
    assert parse_timestamp(record[v.PRESERVED_SINCE_ANNOTATION]) == NOW
    assert parse_timestamp(record[v.PRESERVED_UNTIL_ANNOTATION]) == NOW + runs_for
    assert result.requeue_after == runs_for
    assert only(result, DrainNode).expiry == NOW + runs_for


def test_the_pool_timeout_never_moves_a_running_preservation() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=NOW + 5 * HOUR, drain=WAS_DRAINED, priority="5", last_priority="")
    condition = preserved_condition(message=drained_message(NOW + 5 * HOUR))
    n = node(ca="true", tainted=True, condition=condition, fields=node_fields_of(m, "drained"))
    assert plan(m, n, pool_timeout=HOUR) == MachinePlan(requeue_after=5 * HOUR)


# --- "being drained" -----------------------------------------------------------------------------------------


def test_the_being_drained_condition_names_the_pods_right_before_the_first_drain() -> None:
    result = plan(machine(phase=FAILED, preserve="now"), node(), pods_to_evict=("ns/b", "ns/a", "ns/a"))
    *_, drain, condition, _announced = writes(result)
    assert condition == SetPreservedCondition(
        status="False",
        reason=v.ConditionReason.PRESERVED_BY_USER,
        message=(
            "Preserved node is being drained. Machine preserved until 2026-08-23 10:00:00 +0000 UTC. "
            "Waiting for pods: ns/a, ns/b."
        ),
        last_transition_time=NOW,
    )
    assert isinstance(drain, DrainNode)
    assert drain.evict


@pytest.mark.parametrize(
    ("pods", "tail"),
    [
        ((), ""),
        (
            tuple(f"ns/p{i:02d}" for i in range(12, 0, -1)),
            f" Waiting for pods: {', '.join(f'ns/p{i:02d}' for i in range(1, 11))} and 2 more.",
        ),
    ],
)
def test_the_being_drained_message_is_bounded(pods: tuple[str, ...], tail: str) -> None:
    result = plan(machine(phase=FAILED, preserve="now"), node(), pods_to_evict=pods)
    assert only(result, SetPreservedCondition).message == (
        f"Preserved node is being drained. Machine preserved until 2026-08-23 10:00:00 +0000 UTC.{tail}"
    )


NOT_DRAINED = drain_failed_message(T, ["ns/a"])


@pytest.mark.parametrize(
    ("drain", "drain_timeout", "drains"),
    [
        (DrainRecord(v.DrainOutcome.FAILED, NOW - HOUR, NOW - HOUR), None, True),  # a retry that is due
        (DrainRecord(v.DrainOutcome.FAILED, NOW - HOUR, NOW), None, False),  # a retry that is not due yet
        (DrainRecord(v.DrainOutcome.FAILED, NOW - 3 * HOUR, NOW - HOUR), "1h", True),  # a look after giving up
        (WAS_DRAINED, None, False),
    ],
)
def test_only_the_first_drain_says_being_drained(drain: DrainRecord, drain_timeout: str | None, drains: bool) -> None:
    m = machine(
        phase=FAILED, preserve="now", expiry=T, drain=drain, drain_timeout=drain_timeout, priority="5", last_priority=""
    )
    n = node(ca="true", tainted=True, condition=preserved_condition(status="False", message=NOT_DRAINED))
    result = plan(m, n, pods_to_evict=("ns/a",))
    assert not any(c.message.startswith(v.DRAINING_MESSAGE) for c in of_type(result, SetPreservedCondition))
    assert bool(of_type(result, DrainNode)) is drains


def test_a_preserved_running_machine_is_never_being_drained() -> None:
    result = plan(machine(preserve="now"), node(), pods_to_evict=("ns/a",))
    assert only(result, SetPreservedCondition).status == "True"
    assert of_type(result, DrainNode) == []


def test_a_replan_during_the_first_drain_rewrites_the_condition_only_when_the_pods_change() -> None:
    m = machine(phase=FAILED, preserve="now", expiry=T, priority="5", last_priority="")
    draining = preserved_condition(status="False", message=draining_message(T, ["ns/a"]), transition=NOW - MINUTE)
    n = node(ca="true", tainted=True, condition=draining, fields=node_fields_of(m, "draining"))
    assert write_kinds(plan(m, n, pods_to_evict=("ns/a",))) == ["DrainNode"]
    changed = plan(m, n, pods_to_evict=("ns/a", "ns/c"))
    assert write_kinds(changed) == ["DrainNode", "SetPreservedCondition"]
    condition = only(changed, SetPreservedCondition)
    assert condition.message == draining_message(T, ["ns/a", "ns/c"])
    assert condition.last_transition_time == NOW - MINUTE  # still False: the transition time stays


def test_a_failed_first_drain_replaces_being_drained_with_the_blockers() -> None:
    m, n = machine(phase=FAILED, preserve="now"), node()
    m, after = execute(m, n, plan(m, n, pods_to_evict=("ns/a", "ns/b")), drained=False, blocking_pods=("ns/b",))
    assert after is not None
    condition = after.preserved_condition
    assert condition is not None
    assert (condition.status, condition.message) == ("False", drain_failed_message(T, ["ns/b"]))


# --- the drain record over several attempts ----------------------------------------------------------------


def test_a_failing_drain_records_failing_since_once_and_last_attempt_each_time() -> None:
    config = dataclasses.replace(CONFIG, drain_retry_interval=2 * MINUTE, drain_timeout=HOUR)
    m = machine(phase=FAILED, preserve="now")
    n: Node | None = node()
    result = plan(m, n, config=config)
    m, n = execute(m, n, result, drained=False, blocking_pods=("ns/a",))
    assert n is not None
    assert m.preservation is not None
    assert m.preservation.drain == DrainRecord(v.DrainOutcome.FAILED, failing_since=NOW, last_attempt=NOW)
    # paced: nothing until the interval since the last attempt has passed
    assert plan(m, n, config=config, now=NOW + MINUTE) == MachinePlan(requeue_after=MINUTE)
    attempts = [NOW + 2 * MINUTE, NOW + 5 * MINUTE, NOW + 30 * MINUTE]
    for attempt in attempts:
        retry = plan(m, n, config=config, now=attempt)
        assert write_kinds(retry) == ["DrainNode"]
        assert only(retry, DrainNode).evict
        m, n = execute(m, n, retry, now=attempt, drained=False, blocking_pods=("ns/a",))
        assert n is not None
        assert m.preservation is not None
        assert m.preservation.drain == DrainRecord(v.DrainOutcome.FAILED, failing_since=NOW, last_attempt=attempt)
    assert m.metadata.annotations[v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION] == "2026-08-20T10:00:00Z"
    assert m.metadata.annotations[v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION] == "2026-08-20T10:30:00Z"

    # an hour after the first failure evictions are given up: a look that records no attempt
    look = plan(m, n, config=config, now=NOW + HOUR)
    assert not only(look, DrainNode).evict
    looked, n = execute(m, n, look, now=NOW + HOUR, drained=False, blocking_pods=("ns/a",))
    assert n is not None
    assert looked.preservation == m.preservation
    # the pods went away: drained, and the failure's times with it
    m, n = execute(looked, n, plan(looked, n, config=config, now=NOW + 2 * HOUR), now=NOW + 2 * HOUR, drained=True)
    assert n is not None
    assert m.preservation is not None
    assert m.preservation.drain == WAS_DRAINED
    assert not {v.PRESERVED_DRAIN_FAILING_SINCE_ANNOTATION, v.PRESERVED_DRAIN_LAST_ATTEMPT_ANNOTATION} & set(
        m.metadata.annotations
    )
    assert writes(plan(m, n, config=config, now=NOW + 2 * HOUR)) == []
