"""The controller's preservation settings, as the decision functions take them."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from machine_preservation.core import vocabulary as v

DEFAULT_PRESERVE_TIMEOUT = dt.timedelta(hours=72)  # upstream MCM's default is 96h
DEFAULT_DRAIN_TIMEOUT = dt.timedelta(hours=2)  # upstream --machine-drain-timeout
DEFAULT_DRAIN_RETRY_INTERVAL = dt.timedelta(minutes=1)
# No preservation lasts longer, whoever asked: the cap on every expiry (and the Shoot webhook's bound).
DEFAULT_MAX_PRESERVE_TIMEOUT = dt.timedelta(hours=720)


@dataclass(frozen=True)
class PreservationConfig:
    # `--machine-preserve-timeout`; a machine's spec.machinePreserveTimeout overrides it.
    default_preserve_timeout: dt.timedelta = DEFAULT_PRESERVE_TIMEOUT
    # The value auto-preservation writes; upstream's `auto-preserved` is still read as the same.
    auto_value: str = v.PreserveValue.AUTO.value
    # How long evictions are retried, counted from the first failed drain; past it the node is only looked at
    # (it counts as drained once the blocking pods are gone). A machine's spec.drainTimeout overrides it.
    drain_timeout: dt.timedelta = DEFAULT_DRAIN_TIMEOUT
    # Pause after a failed drain before the next attempt.
    drain_retry_interval: dt.timedelta = DEFAULT_DRAIN_RETRY_INTERVAL
    # Every expiry is capped at its start + this, whoever wrote it.
    max_preserve_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT
    # Whether MCM's CRDs keep the preservation status fields (Machine status.currentStatus.preserveExpiryTime,
    # MachineSet/MachineDeployment counters), so they are mirrored there; v0.61's CRDs prune them.
    mirror_status: bool = False
    # Node conditions that, when True, keep a Failed machine Failed even though its node is Ready.
    unhealthy_node_conditions: tuple[str, ...] = v.DEFAULT_UNHEALTHY_NODE_CONDITIONS

    def __post_init__(self) -> None:
        if self.default_preserve_timeout < dt.timedelta(0):
            raise ValueError(f"default_preserve_timeout must not be negative, got {self.default_preserve_timeout}")
        if self.max_preserve_timeout < dt.timedelta(0):
            raise ValueError(f"max_preserve_timeout must not be negative, got {self.max_preserve_timeout}")
        if self.auto_value not in v.AUTO_PRESERVE_VALUES:
            raise ValueError(f"auto_value must be one of {v.AUTO_PRESERVE_VALUES}, got {self.auto_value!r}")
        if self.drain_timeout <= dt.timedelta(0):
            raise ValueError(f"drain_timeout must be positive, got {self.drain_timeout}")
        if self.drain_retry_interval <= dt.timedelta(0):
            raise ValueError(f"drain_retry_interval must be positive, got {self.drain_retry_interval}")
