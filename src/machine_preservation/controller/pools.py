"""Each machine's pool settings (machinePreserveTimeout, autoPreserveFailedMachineMax), read from the caches in
the order `core.pool_settings` decides: the MachineSet, its MachineDeployment, the Shoot in Gardener's `Cluster`
resource of the control namespace, else the controller's flags."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from machine_preservation.controller.reconcile import Caches, key_of, owner_name
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.core.pool_settings import (
    PoolDefaults,
    resolve_auto_preserve_max,
    resolve_preserve_timeout,
)

logger = logging.getLogger(__name__)


@dataclass
class PoolSettingsReader:
    caches: Caches
    namespace: str
    defaults: PoolDefaults
    _noted: set[str] = field(default_factory=set)  # notes already logged

    def preserve_timeout(self, machine: Machine) -> dt.timedelta | None:
        """The pool's timeout for the machine (its own spec.machinePreserveTimeout is applied by the core)."""
        machine_set = self._machine_set_of(machine)
        notes: list[str] = []
        setting = resolve_preserve_timeout(
            machine=None,
            machine_set=machine_set,
            machine_deployment=self._deployment_of(machine_set),
            cluster=self.caches.cluster(self.namespace),
            defaults=self.defaults,
            notes=notes,
        )
        self._log(notes)
        return setting.value

    def auto_preserve_max(self, machine_set: MachineSet) -> int | None:
        notes: list[str] = []
        setting = resolve_auto_preserve_max(
            machine_set=machine_set,
            machine_deployment=self._deployment_of(machine_set),
            cluster=self.caches.cluster(self.namespace),
            defaults=self.defaults,
            notes=notes,
        )
        self._log(notes)
        return setting.value

    def _machine_set_of(self, machine: Machine) -> MachineSet | None:
        owners = owner_name("MachineSet")(machine)
        return self.caches.machine_sets.get(key_of(self.namespace, owners[0])) if owners else None

    def _deployment_of(self, machine_set: MachineSet | None) -> MachineDeployment | None:
        owners = owner_name("MachineDeployment")(machine_set) if machine_set is not None else []
        return self.caches.machine_deployments.get(key_of(self.namespace, owners[0])) if owners else None

    def _log(self, notes: list[str]) -> None:
        """Each distinct note once: a typo in a pool setting is worth one warning, not one per reconcile."""
        for note in notes:
            if note not in self._noted:
                self._noted.add(note)
                logger.warning("pool settings: %s", note)
