"""Each machine's pool settings (machinePreserveTimeout, autoPreserveFailedMachineMax), read from the caches in
the order `core.pool_settings` decides: the MachineSet, its MachineDeployment, the Shoot in Gardener's `Cluster`
resource of the control namespace, that Shoot's extension providerConfig, else the controller's flags."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from machine_preservation.controller.preservation.reader import CacheReader, key_of, owner_name
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.core.pool_settings import (
    PoolDefaults,
    Setting,
    resolve_auto_preserve_max,
    resolve_preserve_timeout,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class PoolSettingsReader:
    caches: CacheReader
    namespace: str
    defaults: PoolDefaults
    _noted: set[str] = field(default_factory=set)  # notes already logged

    def preserve_timeout(self, machine: Machine) -> dt.timedelta | None:
        """The pool's timeout for the machine (its own spec.machinePreserveTimeout is applied by the core)."""
        return self._resolve(resolve_preserve_timeout, self._machine_set_of(machine), machine=None)

    def auto_preserve_max(self, machine_set: MachineSet) -> int | None:
        return self._resolve(resolve_auto_preserve_max, machine_set)

    def _resolve(self, resolve: Callable[..., Setting[T]], machine_set: MachineSet | None, **extra: Any) -> T:
        """One setting of the MachineSet's pool, from the first source that carries it."""
        notes: list[str] = []
        setting = resolve(
            machine_set=machine_set,
            machine_deployment=self._deployment_of(machine_set),
            cluster=self.caches.cluster(self.namespace),
            defaults=self.defaults,
            notes=notes,
            **extra,
        )
        for note in notes:  # each distinct note once: a typo is worth one warning, not one per reconcile
            if note not in self._noted:
                self._noted.add(note)
                logger.warning("pool settings: %s", note)
        return setting.value

    def _machine_set_of(self, machine: Machine) -> MachineSet | None:
        owners = owner_name("MachineSet")(machine)
        return self.caches.machine_sets.get(key_of(self.namespace, owners[0])) if owners else None

    def _deployment_of(self, machine_set: MachineSet | None) -> MachineDeployment | None:
        owners = owner_name("MachineDeployment")(machine_set) if machine_set is not None else []
        return self.caches.machine_deployments.get(key_of(self.namespace, owners[0])) if owners else None
