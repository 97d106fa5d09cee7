"""What the admission decisions are configured with (command-line flags, Helm values)."""

from __future__ import annotations

import datetime as dt
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from machine_preservation.core.config import DEFAULT_MAX_PRESERVE_TIMEOUT

# The chart's service account for the controller, and MCM's identity in a Gardener shoot.
DEFAULT_CONTROLLER_USERNAME: Final = "system:serviceaccount:machine-preservation:machine-preservation-controller"
DEFAULT_MCM_USERNAMES: Final = ("system:serviceaccount:kube-system:machine-controller-manager",)
SERVICE_ACCOUNT_PREFIX: Final = "system:serviceaccount:"


def service_account_username(namespace: str, name: str) -> str:
    """The username the API server gives the ServiceAccount `namespace/name`."""
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


class AdmissionSettings(BaseModel):
    """Identities and bounds the decisions depend on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The controller's identity, the one named in denials; `more_controller_usernames`: further identities of the
    # same controller (in Gardener it writes Machines in the seed and Nodes in each shoot under different names).
    controller_username: str = DEFAULT_CONTROLLER_USERNAME
    more_controller_usernames: frozenset[str] = frozenset()
    mcm_usernames: frozenset[str] = Field(default_factory=lambda: frozenset(DEFAULT_MCM_USERNAMES))
    # ServiceAccount names MCM runs as in the namespace of the Machines it manages (Gardener: one MCM per shoot
    # namespace, `system:serviceaccount:<shoot namespace>:machine-controller-manager`). Counted only for objects
    # of that namespace: the same username on another namespace's Machine is not MCM's.
    mcm_service_accounts: frozenset[str] = frozenset()
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

    @property
    def controller_usernames(self) -> frozenset[str]:
        return self.more_controller_usernames | {self.controller_username}

    @property
    def controller_shown(self) -> str:
        """The controller's identities as a denial names them."""
        others = sorted(self.more_controller_usernames - {self.controller_username})
        return ", ".join((self.controller_username, *others))

    def is_controller(self, username: str) -> bool:
        return username == self.controller_username or username in self.more_controller_usernames

    def is_mcm(self, username: str, *, namespace: str | None) -> bool:
        """Whether `username` is MCM's for an object in `namespace` (None: a cluster-scoped object, e.g. a Node)."""
        if username in self.mcm_usernames:
            return True
        if not namespace or not self.mcm_service_accounts:
            return False
        prefix = f"{SERVICE_ACCOUNT_PREFIX}{namespace}:"
        return username.startswith(prefix) and username[len(prefix) :] in self.mcm_service_accounts
