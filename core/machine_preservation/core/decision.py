"""Should this machine be preserved now, until when, and why not.

| effective value | expired | not expired, phase Failed | not expired, other phases |
|---|---|---|---|
| `now` | stop, remove annotations (Failed: delete) | preserve | preserve |
| `when-failed` | stop, remove annotations (Failed: delete) | preserve | stop, keep annotations |
| auto | stop, remove annotations (Failed: delete) | preserve | stop, remove annotations |
| `false` | stop (Failed: delete) | stop (preserved: delete) | stop |
| none (`""`, absent, invalid) | stop | stop | stop |

"Stop" and "delete" act only on a machine that is preserved (it has a preservation record); otherwise they
change nothing. "Expired" needs a record whose expiry (capped at its start + the maximum timeout) is not after
now. The expiry is computed once, when preservation starts (now + the machine's spec.machinePreserveTimeout,
else the pool's setting, else the configured default; at most the maximum), and is never extended or reset
while the machine stays preserved. Because the record stays until the stop is complete (or the Failed machine
is gone), a stop interrupted by a conflict or a crash is finished, never mistaken for "not preserved" and
started again.

A Failed machine whose preservation expired or was turned off with `false` is deleted; its annotations are then
left alone: removing them first would let a crash in between turn the decision into "no preference", which neither
deletes nor prevents a new auto-preservation. After a removed annotation or `""` it is left to auto-preservation
(which may keep it) or to MCM.

Apart from the table, a machine whose shoot is being released (the extension disabled for it, or its Extension
deleted; `lifecycle.MachineContext.released`) always stops with `StopCause.RELEASED`, whatever the value and
the phase: the annotations stay and a Failed machine is not deleted but left to MCM (core.lifecycle).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.durations import duration_or_default
from machine_preservation.core.models import Machine
from machine_preservation.core.preservation_record import PreservationRecord, start_record


class StopCause(StrEnum):
    EXPIRED = "expired"
    OPTED_OUT = "opted-out"  # effective value `false`
    NO_PREFERENCE = "no-preference"  # annotation removed, `""` or invalid
    NOT_FAILED = "not-failed"  # `when-failed` or auto on a machine that is not Failed
    RELEASED = "released"  # the extension is being disabled for the machine's shoot


@dataclass(frozen=True)
class PreservationDecision:
    preserve: bool
    # When preserving: the record in force (the existing one, or a new one when `starts`) and its expiry.
    record: PreservationRecord | None = None
    expiry: dt.datetime | None = None
    starts: bool = False
    # When not preserving: why, and whether the preserve annotations go too (so it is not re-preserved).
    stop_cause: StopCause | None = None
    remove_annotations: bool = False
    # When not preserving: the machine is Failed and its preservation ended for good, so it is deleted.
    delete_machine: bool = False


RELEASED = PreservationDecision(preserve=False, stop_cause=StopCause.RELEASED)
"""The decision of every machine of a shoot being released: stop, keep the annotations, delete nothing."""


def effective_preserve_timeout(
    *, machine: Machine, config: PreservationConfig, pool_timeout: dt.timedelta | None = None
) -> dt.timedelta:
    """spec.machinePreserveTimeout when it is a valid, non-negative Go duration; else the pool's setting; else the
    configured default."""
    default = config.default_preserve_timeout if pool_timeout is None else pool_timeout
    return duration_or_default(machine.spec.machine_preserve_timeout, default=default, allow_zero=True)


def expiry_of(machine: Machine, config: PreservationConfig) -> dt.datetime | None:
    """When the machine's preservation ends (capped); None when it is not preserved."""
    record = machine.preservation
    return None if record is None else record.expiry(max_timeout=config.max_preserve_timeout)


def is_expired(expiry: dt.datetime | None, now: dt.datetime) -> bool:
    return expiry is not None and expiry <= now


def decide_preservation(
    *,
    machine: Machine,
    value: v.PreserveValue,
    phase: str,
    config: PreservationConfig,
    now: dt.datetime,
    pool_timeout: dt.timedelta | None = None,
) -> PreservationDecision:
    """The decision for `machine` with effective `value` in `phase` (which may differ from the machine's
    phase when the plan also moves it); `pool_timeout` is the pool's machinePreserveTimeout, if it has one."""
    record = machine.preservation
    expiry = expiry_of(machine, config)
    failed = phase == v.MachinePhase.FAILED
    if failed and expiry is not None:
        if value == v.PreserveValue.FALSE:
            return PreservationDecision(preserve=False, stop_cause=StopCause.OPTED_OUT, delete_machine=True)
        if value != v.PreserveValue.NONE and is_expired(expiry, now):
            return PreservationDecision(preserve=False, stop_cause=StopCause.EXPIRED, delete_machine=True)
    if value in (v.PreserveValue.NOW, v.PreserveValue.WHEN_FAILED, v.PreserveValue.AUTO) and is_expired(expiry, now):
        return PreservationDecision(preserve=False, stop_cause=StopCause.EXPIRED, remove_annotations=True)
    if value == v.PreserveValue.NOW or (value in (v.PreserveValue.WHEN_FAILED, v.PreserveValue.AUTO) and failed):
        if record is not None and expiry is not None:
            return PreservationDecision(preserve=True, record=record, expiry=expiry)
        started = start_record(
            now=now,
            timeout=effective_preserve_timeout(machine=machine, config=config, pool_timeout=pool_timeout),
            max_timeout=config.max_preserve_timeout,
            by=v.PreservedBy.AUTO if value == v.PreserveValue.AUTO else v.PreservedBy.USER,
        )
        return PreservationDecision(
            preserve=True, record=started, expiry=started.expiry(max_timeout=config.max_preserve_timeout), starts=True
        )
    if value == v.PreserveValue.WHEN_FAILED:
        return PreservationDecision(preserve=False, stop_cause=StopCause.NOT_FAILED)
    if value == v.PreserveValue.AUTO:
        return PreservationDecision(preserve=False, stop_cause=StopCause.NOT_FAILED, remove_annotations=True)
    if value == v.PreserveValue.FALSE:
        return PreservationDecision(preserve=False, stop_cause=StopCause.OPTED_OUT)
    if not failed and record is not None and not record.damaged and is_expired(expiry, now):
        # A stop at expiry interrupted after the preserve annotation went (a crash, or a conflict on removing
        # the record): the expiry still ends it, and says so.
        return PreservationDecision(preserve=False, stop_cause=StopCause.EXPIRED)
    return PreservationDecision(preserve=False, stop_cause=StopCause.NO_PREFERENCE)
