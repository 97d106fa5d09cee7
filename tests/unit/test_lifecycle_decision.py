"""Preserve or stop, until when, and why (reference §3 step 6, §5.3 as adapted by DESIGN.md §3)."""

from __future__ import annotations

import datetime as dt

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.decision import (
    PreservationDecision,
    StopCause,
    decide_preservation,
    effective_preserve_timeout,
)
from machine_preservation.core.preserve_value import Preference

from .preservation_objects import HOUR, NOW, machine

P = Preference
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


def decide(value: Preference, phase: str, expiry: dt.datetime | None) -> PreservationDecision:
    return decide_preservation(
        machine=machine(phase=phase, expiry=expiry), value=value, phase=phase, config=CONFIG, now=NOW
    )


def preserve(expiry: dt.datetime, *, starts: bool) -> PreservationDecision:
    return PreservationDecision(preserve=True, expiry=expiry, starts=starts)


def stop(cause: StopCause, *, remove: bool = False) -> PreservationDecision:
    return PreservationDecision(preserve=False, stop_cause=cause, remove_annotations=remove)


def delete(cause: StopCause) -> PreservationDecision:
    """A Failed machine's preservation ends for good: deleted, its annotations left as they are."""
    return PreservationDecision(preserve=False, stop_cause=cause, delete_machine=True)


# §5.3: new effective value × (Running|Failed) × (not preserved|preserved), plus expiry and other phases.
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
        (P.WHEN_FAILED, UNKNOWN, KEPT, stop(StopCause.NOT_FAILED)),  # only Failed preserves (§4.5 Q1)
        (P.WHEN_FAILED, FAILED, None, preserve(NEW, starts=True)),
        (P.WHEN_FAILED, FAILED, KEPT, preserve(KEPT, starts=False)),
        (P.WHEN_FAILED, FAILED, PAST, delete(StopCause.EXPIRED)),
        (P.WHEN_FAILED, RUNNING, PAST, stop(StopCause.EXPIRED, remove=True)),
        (P.AUTO, RUNNING, None, stop(StopCause.NOT_FAILED, remove=True)),
        (P.AUTO, RUNNING, KEPT, stop(StopCause.NOT_FAILED, remove=True)),
        (P.AUTO, FAILED, None, preserve(NEW, starts=True)),
        (P.AUTO, FAILED, KEPT, preserve(KEPT, starts=False)),
        (P.AUTO, FAILED, PAST, delete(StopCause.EXPIRED)),
        (P.AUTO, RUNNING, PAST, stop(StopCause.EXPIRED, remove=True)),
        (P.FALSE, RUNNING, None, stop(StopCause.OPTED_OUT)),
        (P.FALSE, RUNNING, KEPT, stop(StopCause.OPTED_OUT)),
        (P.FALSE, FAILED, None, stop(StopCause.OPTED_OUT)),  # never preserved: MCM's to replace
        (P.FALSE, FAILED, KEPT, delete(StopCause.OPTED_OUT)),
        (P.FALSE, FAILED, PAST, delete(StopCause.OPTED_OUT)),
        (P.FALSE, RUNNING, PAST, stop(StopCause.OPTED_OUT)),  # §4.2 #15: no annotation removal
        (P.NONE, RUNNING, KEPT, stop(StopCause.NO_PREFERENCE)),
        (P.NONE, FAILED, None, stop(StopCause.NO_PREFERENCE)),
        (P.NONE, FAILED, PAST, stop(StopCause.NO_PREFERENCE)),  # left to auto-preservation or MCM
    ],
)
def test_decision_matrix(
    value: Preference, phase: str, expiry: dt.datetime | None, expected: PreservationDecision
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
