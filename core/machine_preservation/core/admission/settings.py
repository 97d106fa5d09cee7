"""What the admission decisions are configured with (command-line flags, Helm values)."""

from __future__ import annotations

import datetime as dt
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from machine_preservation.core.config import DEFAULT_MAX_PRESERVE_TIMEOUT

# The chart's service account for the controller, and MCM's identity in a Gardener shoot.
DEFAULT_CONTROLLER_USERNAME: Final = "system:serviceaccount:machine-preservation:machine-preservation-controller"
DEFAULT_MCM_USERNAMES: Final = ("system:serviceaccount:kube-system:machine-controller-manager",)


class AdmissionSettings(BaseModel):
    """Identities and bounds the decisions depend on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    controller_username: str = DEFAULT_CONTROLLER_USERNAME
    mcm_usernames: frozenset[str] = Field(default_factory=lambda: frozenset(DEFAULT_MCM_USERNAMES))
    max_preserve_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT
    # The cluster's MCM preserves machines itself (v0.62+): it may write its own auto value and last-applied
    # record on Machines, and the deletion guard only covers preservations our controller still holds.
    mcm_native_preservation: bool = False

    @field_validator("max_preserve_timeout")
    @classmethod
    def _non_negative(cls, value: dt.timedelta) -> dt.timedelta:
        if value < dt.timedelta(0):
            raise ValueError("the maximum preserve timeout must not be negative")
        return value

    def is_controller(self, username: str) -> bool:
        return username == self.controller_username

    def is_mcm(self, username: str) -> bool:
        return username in self.mcm_usernames
