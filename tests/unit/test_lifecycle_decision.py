"""Preserve or stop, until when, and why: the decision for every effective value, phase and expiry."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.decision import (
    PreservationDecision,
    StopCause,
    decide_preservation,
    effective_preserve_timeout,
)
from machine_preservation.core.models import Machine
from machine_preservation.core.preservation_record import PreservationRecord

from .preservation_objects import HOUR, NOW, machine

P = v.PreserveValue
RUNNING, FAILED, UNKNOWN, PENDING = (
    v.MachinePhase.RUNNING,
    v.MachinePhase.FAILED,
    v.MachinePhase.UNKNOWN,
    v.MachinePhase.PENDING,
)
CONFIG = PreservationConfig()
NEW = NOW + 72 * HOUR  # a start now with the default timeout
KEPT = NOW + 5 * HOUR  # an existing, active expiry
PAST = NOW - HOUR


def decide(value: v.PreserveValue, phase: str, expiry: dt.datetime | None) -> PreservationDecision:
    return decide_preservation(
        machine=machine(phase=phase, expiry=expiry), value=value, phase=phase, config=CONFIG, now=NOW
    )


def preserve(expiry: dt.datetime, *, starts: bool, by: v.PreservedBy = v.PreservedBy.USER) -> PreservationDecision:
    """A started preservation runs from now; a kept one is the builder's record (a 72h one ending at `expiry`)."""
    since = NOW if starts else expiry - 72 * HOUR
    record = PreservationRecord(since=since, until=expiry, by=by)
    return PreservationDecision(preserve=True, record=record, expiry=expiry, starts=starts)


def stop(cause: StopCause, *, remove: bool = False) -> PreservationDecision:
    return PreservationDecision(preserve=False, stop_cause=cause, remove_annotations=remove)


def delete(cause: StopCause) -> PreservationDecision:
    """A Failed machine's preservation ends for good: deleted, its annotations left as they are."""
    return PreservationDecision(preserve=False, stop_cause=cause, delete_machine=True)


# Effective value × (Running|Failed) × (not preserved|preserved), plus expiry and other phases.
@pytest.mark.parametrize(
    ("value", "phase", "expiry", "expected"),
    [
        (P.NOW, RUNNING, None, preserve(NEW, starts=True)),
        (P.NOW, RUNNING, KEPT, preserve(KEPT, starts=False)),
        (P.NOW, FAILED, None, preserve(NEW, starts=True)),
        (P.NOW, FAILED, KEPT, preserve(KEPT, starts=False)),
        (P.NOW, UNKNOWN, None, preserve(NEW, starts=True)),
        (P.NOW, PENDING, None, preserve(NEW, starts=True)),
        (P.NOW, "", None, preserve(NEW, starts=True)),
        (P.NOW, RUNNING, PAST, stop(StopCause.EXPIRED, remove=True)),
        (P.NOW, RUNNING, NOW, stop(StopCause.EXPIRED, remove=True)),  # "expired" includes exactly now
        (P.NOW, FAILED, NOW, delete(StopCause.EXPIRED)),
        (P.WHEN_FAILED, RUNNING, None, stop(StopCause.NOT_FAILED)),
        (P.WHEN_FAILED, RUNNING, KEPT, stop(StopCause.NOT_FAILED)),
        (P.WHEN_FAILED, UNKNOWN, KEPT, stop(StopCause.NOT_FAILED)),  # only Failed preserves
        (P.WHEN_FAILED, FAILED, None, preserve(NEW, starts=True)),
        (P.WHEN_FAILED, FAILED, KEPT, preserve(KEPT, starts=False)),
        (P.WHEN_FAILED, FAILED, PAST, delete(StopCause.EXPIRED)),
        (P.WHEN_FAILED, RUNNING, PAST, stop(StopCause.EXPIRED, remove=True)),
        (P.AUTO, RUNNING, None, stop(StopCause.NOT_FAILED, remove=True)),
        (P.AUTO, RUNNING, KEPT, stop(StopCause.NOT_FAILED, remove=True)),
        (P.AUTO, FAILED, None, preserve(NEW, starts=True, by=v.PreservedBy.AUTO)),
        (P.AUTO, FAILED, KEPT, preserve(KEPT, starts=False)),
        (P.AUTO, FAILED, PAST, delete(StopCause.EXPIRED)),
        (P.AUTO, RUNNING, PAST, stop(StopCause.EXPIRED, remove=True)),
        (P.FALSE, RUNNING, None, stop(StopCause.OPTED_OUT)),
        (P.FALSE, RUNNING, KEPT, stop(StopCause.OPTED_OUT)),
        (P.FALSE, FAILED, None, stop(StopCause.OPTED_OUT)),  # never preserved: MCM's to replace
        (P.FALSE, FAILED, KEPT, delete(StopCause.OPTED_OUT)),
        (P.FALSE, FAILED, PAST, delete(StopCause.OPTED_OUT)),
        (P.FALSE, RUNNING, PAST, stop(StopCause.OPTED_OUT)),  # expired `false`: no annotation removal
        (P.NONE, RUNNING, KEPT, stop(StopCause.NO_PREFERENCE)),
        # The annotation went with a stop at expiry that did not finish: still the expiry's stop.
        (P.NONE, RUNNING, PAST, stop(StopCause.EXPIRED)),
        (P.NONE, FAILED, None, stop(StopCause.NO_PREFERENCE)),
        (P.NONE, FAILED, PAST, stop(StopCause.NO_PREFERENCE)),  # left to auto-preservation or MCM
    ],
)
def test_decision_matrix(
    value: v.PreserveValue, phase: str, expiry: dt.datetime | None, expected: PreservationDecision
) -> None:
    assert decide(value, phase, expiry) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, 72 * HOUR),
        ("1h30m", 90 * dt.timedelta(minutes=1)),
        ("0s", dt.timedelta(0)),
        ("96h", 96 * HOUR),
        ("3d", 72 * HOUR),  # not a Go duration: the default
        ("-1h", 72 * HOUR),  # negative: the default
    ],
)
def test_effective_timeout_prefers_the_machine_spec(spec: str | None, expected: dt.timedelta) -> None:
    assert effective_preserve_timeout(machine=machine(timeout=spec), config=CONFIG) == expected


def test_configured_default_applies_without_machine_spec() -> None:
    config = PreservationConfig(default_preserve_timeout=4 * HOUR)
    assert effective_preserve_timeout(machine=machine(), config=config) == 4 * HOUR


def test_new_expiry_is_whole_seconds_so_the_stored_value_matches_the_message() -> None:
    now = NOW + dt.timedelta(microseconds=999_999)
    decision = decide_preservation(
        machine=machine(phase=FAILED, timeout="1h"), value=P.NOW, phase=FAILED, config=CONFIG, now=now
    )
    assert decision.expiry == NOW + HOUR


def test_zero_timeout_starts_an_already_expired_preservation() -> None:
    decision = decide_preservation(machine=machine(timeout="0s"), value=P.NOW, phase=RUNNING, config=CONFIG, now=NOW)
    assert decision == preserve(NOW, starts=True)


def test_the_phase_argument_wins_over_the_machine_phase() -> None:
    # The plan may move a recovered machine to Running first and decide on that phase.
    decision = decide_preservation(
        machine=machine(phase=FAILED, expiry=KEPT), value=P.WHEN_FAILED, phase=RUNNING, config=CONFIG, now=NOW
    )
    assert decision == stop(StopCause.NOT_FAILED)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"default_preserve_timeout": -HOUR},
        {"max_preserve_timeout": -HOUR},
        {"auto_value": "now"},
        {"drain_timeout": dt.timedelta(0)},
        {"drain_retry_interval": dt.timedelta(0)},
    ],
)
def test_config_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must"):
        PreservationConfig(**kwargs)  # type: ignore[arg-type]


def test_config_defaults() -> None:
    assert (CONFIG.default_preserve_timeout, CONFIG.auto_value, CONFIG.drain_timeout) == (
        72 * HOUR,
        "auto-preserve",
        2 * HOUR,
    )
    assert PreservationConfig(auto_value="auto-preserved").auto_value == "auto-preserved"
    # 30 days at most, and no status mirror unless the CRDs are known to keep it (v0.61's prune it).
    assert (CONFIG.max_preserve_timeout, CONFIG.mirror_status) == (720 * HOUR, False)


MAX = 720 * HOUR


@pytest.mark.parametrize(
    ("spec", "pool", "max_timeout", "runs_for"),
    [
        (None, None, MAX, 72 * HOUR),  # neither: the configured default
        (None, 5 * HOUR, MAX, 5 * HOUR),  # no spec timeout: the pool's
        ("1h", 5 * HOUR, MAX, HOUR),  # the Machine's own wins over the pool's
        ("3d", 5 * HOUR, MAX, 5 * HOUR),  # an invalid spec value falls back to the pool's, not the default
        ("0s", 5 * HOUR, MAX, dt.timedelta(0)),  # zero is a valid spec value
        (None, 1000 * HOUR, MAX, MAX),  # the pool's is capped by the maximum
        ("2000h", None, MAX, MAX),  # and so is the Machine's
        (None, 10 * HOUR, 4 * HOUR, 4 * HOUR),  # a lower configured maximum caps the pool's too
        (None, None, HOUR, HOUR),  # and the default
    ],
)
def test_a_start_runs_for_the_spec_else_the_pool_timeout_at_most_the_maximum(
    spec: str | None, pool: dt.timedelta | None, max_timeout: dt.timedelta, runs_for: dt.timedelta
) -> None:
    config = PreservationConfig(max_preserve_timeout=max_timeout)
    decision = decide_preservation(
        machine=machine(phase=FAILED, timeout=spec),
        value=P.WHEN_FAILED,
        phase=FAILED,
        config=config,
        now=NOW,
        pool_timeout=pool,
    )
    assert decision == PreservationDecision(
        preserve=True,
        record=PreservationRecord(since=NOW, until=NOW + runs_for, by=v.PreservedBy.USER),
        expiry=NOW + runs_for,
        starts=True,
    )


def test_the_pool_timeout_never_changes_a_running_preservation() -> None:
    decision = decide_preservation(
        machine=machine(phase=FAILED, expiry=KEPT), value=P.NOW, phase=FAILED, config=CONFIG, now=NOW, pool_timeout=HOUR
    )
    assert (decision.preserve, decision.starts, decision.expiry) == (True, False, KEPT)


FAR = NOW + 10_000 * HOUR  # an expiry someone wrote by hand (or an older version without the cap)


@pytest.mark.parametrize(
    ("since", "value", "phase", "expected"),
    [
        # since + max is still ahead: preserved until then, not until the far expiry
        (NOW - HOUR, P.NOW, RUNNING, NOW - HOUR + MAX),
        (NOW - HOUR, P.WHEN_FAILED, FAILED, NOW - HOUR + MAX),
        (NOW - 719 * HOUR, P.AUTO, FAILED, NOW + HOUR),
        # since + max has passed: expired like any other preservation
        (NOW - MAX, P.NOW, RUNNING, stop(StopCause.EXPIRED, remove=True)),
        (NOW - MAX, P.WHEN_FAILED, FAILED, delete(StopCause.EXPIRED)),
        (NOW - 1000 * HOUR, P.AUTO, FAILED, delete(StopCause.EXPIRED)),
        (NOW - 1000 * HOUR, P.WHEN_FAILED, RUNNING, stop(StopCause.EXPIRED, remove=True)),
    ],
)
def test_an_expiry_far_in_the_future_counts_as_since_plus_the_maximum(
    since: dt.datetime, value: v.PreserveValue, phase: str, expected: dt.datetime | PreservationDecision
) -> None:
    m = machine(phase=phase, expiry=FAR, since=since)
    decision = decide_preservation(machine=m, value=value, phase=phase, config=CONFIG, now=NOW)
    if isinstance(expected, PreservationDecision):
        assert decision == expected
    else:
        assert decision == PreservationDecision(preserve=True, record=m.preservation, expiry=expected)


def with_raw_annotations(m: Machine, annotations: dict[str, str]) -> Machine:
    metadata = m.metadata.model_copy(update={"annotations": {**m.metadata.annotations, **annotations}})
    return m.model_copy(update={"metadata": metadata})


@pytest.mark.parametrize(
    "damage",
    [
        {v.PRESERVED_UNTIL_ANNOTATION: "tomorrow"},  # since missing, until unreadable
        {v.PRESERVED_SINCE_ANNOTATION: "2026-08-20T09:00:00Z", v.PRESERVED_UNTIL_ANNOTATION: "2026-08-21T09:00:00"},
        {v.PRESERVED_BY_ANNOTATION: "user"},  # only a stray key of the record
        {v.PRESERVED_DRAIN_ANNOTATION: "drained"},
    ],
)
@pytest.mark.parametrize(
    ("value", "phase", "expected"),
    [
        (P.NOW, RUNNING, stop(StopCause.EXPIRED, remove=True)),
        (P.NOW, FAILED, delete(StopCause.EXPIRED)),
        (P.AUTO, FAILED, delete(StopCause.EXPIRED)),
        (P.FALSE, FAILED, delete(StopCause.OPTED_OUT)),
        (P.NONE, RUNNING, stop(StopCause.NO_PREFERENCE)),
    ],
)
def test_a_damaged_record_ends_the_preservation_like_an_expired_one(
    damage: dict[str, str], value: v.PreserveValue, phase: str, expected: PreservationDecision
) -> None:
    m = with_raw_annotations(machine(phase=phase), damage)
    assert m.preservation is not None
    assert m.preservation.damaged
    assert decide_preservation(machine=m, value=value, phase=phase, config=CONFIG, now=NOW) == expected


@given(
    since_ago=st.integers(0, 3000),
    until_after_since=st.integers(-10, 30_000),
    max_hours=st.integers(0, 3000),
    value=st.sampled_from([P.NOW, P.WHEN_FAILED, P.AUTO]),
)
def test_a_kept_preservation_ends_at_until_capped_at_since_plus_the_maximum(
    since_ago: int, until_after_since: int, max_hours: int, value: v.PreserveValue
) -> None:
    since = NOW - since_ago * HOUR
    until = since + until_after_since * HOUR
    config = PreservationConfig(max_preserve_timeout=max_hours * HOUR)
    decision = decide_preservation(
        machine=machine(phase=FAILED, expiry=until, since=since), value=value, phase=FAILED, config=config, now=NOW
    )
    ends = min(until, since + max_hours * HOUR)
    if ends > NOW:
        assert (decision.preserve, decision.starts, decision.expiry) == (True, False, ends)
    else:
        assert decision == delete(StopCause.EXPIRED)
