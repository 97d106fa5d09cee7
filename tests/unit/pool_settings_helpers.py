"""Both pool settings at once, for the tests: production resolves each setting where it is needed."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from machine_preservation.core.gardener.cluster import ClusterView
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.core.pool_settings import (
    PoolDefaults,
    Setting,
    resolve_auto_preserve_max,
    resolve_preserve_timeout,
)


@dataclass(frozen=True)
class PoolSettings:
    preserve_timeout: Setting[dt.timedelta]
    auto_preserve_failed_machine_max: Setting[int]
    # Why sources before the one used were passed over although they said something (invalid values, a
    # malformed Cluster, a pool missing from the Shoot, an undetermined zone); empty when nothing is wrong.
    notes: tuple[str, ...] = ()


def resolve_pool_settings(
    *,
    machine: Machine | None = None,
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    cluster: ClusterView | None,
    defaults: PoolDefaults,
    zone: str | None = None,
) -> PoolSettings:
    """Both settings and where each came from (see core.pool_settings' docstring for the order)."""
    notes: list[str] = []
    timeout = resolve_preserve_timeout(
        machine=machine,
        machine_set=machine_set,
        machine_deployment=machine_deployment,
        cluster=cluster,
        defaults=defaults,
        notes=notes,
    )
    maximum = resolve_auto_preserve_max(
        machine_set=machine_set,
        machine_deployment=machine_deployment,
        cluster=cluster,
        defaults=defaults,
        zone=zone,
        notes=notes,
    )
    return PoolSettings(preserve_timeout=timeout, auto_preserve_failed_machine_max=maximum, notes=tuple(notes))
