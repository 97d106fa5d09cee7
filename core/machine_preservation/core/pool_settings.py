"""A worker pool's preservation settings, from wherever they are carried.

MCM v0.61 neither copies `machinePreserveTimeout`/`autoPreserveFailedMachineMax` from a MachineDeployment to its
MachineSets and Machines, nor keeps them in its CRDs. So each setting is read from the first of these sources
that carries a valid value:

| # | source | preserve timeout | auto-preservation max |
|---|---|---|---|
| 1 | the Machine | `spec.machinePreserveTimeout` | — |
| 2 | its MachineSet | `spec.template.spec.machinePreserveTimeout` | `spec.autoPreserveFailedMachineMax` |
| 3 | the MachineSet's MachineDeployment | (same as the MachineSet) | (same as the MachineSet) |
| 4 | the Shoot in Gardener's `Cluster` | the pool's `machineControllerManager` | the same, this zone's share |
| 5 | the same Shoot's extension `providerConfig` | the pool's entry in `workers` | the same, this zone's share |
| 6 | the controller's flags | `--machine-preserve-timeout` | 0 (auto-preservation off) |

A source that does not carry the field is skipped silently; one that carries an invalid value (not a Go
duration, negative, not an integer) is skipped with a note, so a typo falls back to the next source instead of
to the flags. The MachineDeployment (3) comes after the MachineSet, because MCM copies its max only to the
newest MachineSet and each MachineSet enforces its own; it comes before the Shoot, because its value is
already the share of its zone, as the provider extension computed it.

The Shoot (4): the `Cluster` resource (extensions.gardener.cloud/v1alpha1, cluster-scoped, named after the control
namespace) holds it in `spec.shoot`. The pool is the worker named by the label `worker.gardener.cloud/pool` on the
MachineDeployment (else on its or the MachineSet's node template); MachineDeployment names are chosen by each
provider and never parsed. The max is read from `machineControllerManager.autoPreserveFailedMachineMax` (the
released API), else from the worker's own `autoPreserveFailedMachineMax` (an earlier iteration of the API), and
spread over the pool's zones as Gardener's provider extensions do: `total // zones` each, one more for each of the
first `total % zones` zones. This MachineDeployment's zone is the first of: the zone the caller passes (e.g. a
MachineClass's `nodeTemplate.zone`), else a zone label (`topology.kubernetes.io/zone`, the deprecated
`failure-domain.beta.kubernetes.io/zone`, or a CSI driver's `<driver>/zone`) on the MachineDeployment, its node
template or the MachineSet's node template, whose value is one of the pool's zones (or ends with `-<zone>`, as
Azure's `<region>-<zone>`). When the zone cannot be told and the shares differ, the smallest share is used: it
never lets a zone keep more failed machines than Gardener would give it.

The providerConfig (5): the `PreservationConfig` of the Shoot's `machine-preservation` extension (provider_config.py),
for Gardener versions whose Shoot API has no preservation fields; its entry for the pool counts only where the
pool is one of the Shoot's workers (admission demands it; the zones come from there), and its max is the pool's
total, spread over the zones as (4). A document that does not decode is skipped as a whole, with a note naming
its bad fields; the Shoot's worker fields are not affected.

A pool's max from (4) or (5) is clamped, with a note, to the bound Gardener's admission puts on it (the pool's
`maximum`, less one where the pool allows system components): where the garden admission is not installed,
nothing else stops a max that would keep every machine of a failing pool preserved.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Generic, TypeVar

from machine_preservation.core.durations import InvalidDuration, format_go_duration, parse_go_duration_nanoseconds
from machine_preservation.core.gardener.cluster import (
    DEPRECATED_ZONE_LABEL,
    WORKER_POOL_LABEL,
    ZONE_LABEL,
    ClusterView,
    ShootWorker,
    zone_share,
)
from machine_preservation.core.gardener.provider_config import (
    WorkerPreservation,
)
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet

_INT32_MAX: Final = 2**31 - 1
_MAX_KEY: Final = "autoPreserveFailedMachineMax"
_TIMEOUT_KEY: Final = "machinePreserveTimeout"

T = TypeVar("T")


class SettingOrigin(StrEnum):
    """Where a resolved setting was found."""

    MACHINE = "Machine"
    MACHINE_SET = "MachineSet"
    MACHINE_DEPLOYMENT = "MachineDeployment"
    SHOOT = "Shoot"
    PROVIDER_CONFIG = "providerConfig"
    FLAGS = "flags"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One resolved setting: its value, the source it came from, and where exactly (for logs and Events)."""

    value: T
    source: SettingOrigin
    detail: str


@dataclass(frozen=True)
class PoolDefaults:
    """The controller's flags: what applies when no object carries a setting."""

    preserve_timeout: dt.timedelta
    auto_preserve_failed_machine_max: int = 0


# --- The bits of Gardener's Cluster resource and Shoot that are read --------------------------------------


# --- Reading one source ------------------------------------------------------------------------------------


def _timeout(raw: Any, where: str, notes: list[str]) -> dt.timedelta | None:
    """A valid, non-negative Go duration; None when absent, or (with a note) when invalid."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        notes.append(f"{where} is not a duration string ({_shown(raw)}): ignored")
        return None
    try:
        nanoseconds = parse_go_duration_nanoseconds(raw)
    except InvalidDuration as error:
        notes.append(f"{where} {_shown(raw)} is not a duration ({error}): ignored")
        return None
    if nanoseconds < 0:
        notes.append(f"{where} {_shown(raw)} is negative: ignored")
        return None
    return dt.timedelta(microseconds=nanoseconds // 1000)


def _max(raw: Any, where: str, notes: list[str]) -> int | None:
    """An integer in 0..2^31-1 (Gardener's and MCM's int32); None when absent, or (with a note) when invalid."""
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= _INT32_MAX:
        notes.append(f"{where} {_shown(raw)} is not an integer from 0 to {_INT32_MAX}: ignored")
        return None
    return raw


def _shown(raw: Any) -> str:
    text = json.dumps(raw, default=str) if not isinstance(raw, str) else json.dumps(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def _path(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def carries_max(obj: MachineSet | MachineDeployment | None) -> bool:
    """Whether the object's spec carries `autoPreserveFailedMachineMax` at all (a CRD without the field prunes
    it, and the model then shows its default 0): an absent field is not a 0."""
    return obj is not None and "auto_preserve_failed_machine_max" in obj.spec.model_fields_set


def _template_timeout(obj: MachineSet | MachineDeployment | None) -> Any:
    return None if obj is None else _path(obj.spec.template, "spec", "machinePreserveTimeout")


def _node_template_labels(obj: MachineSet | MachineDeployment | None) -> Mapping[str, Any]:
    labels = None if obj is None else _path(obj.spec.template, "spec", "nodeTemplate", "metadata", "labels")
    return labels if isinstance(labels, Mapping) else {}


# --- Pool and zone -----------------------------------------------------------------------------------------


def pool_name(*, machine_set: MachineSet | None, machine_deployment: MachineDeployment | None) -> str | None:
    """The Gardener worker pool: label `worker.gardener.cloud/pool` of the MachineDeployment, else of its or the
    MachineSet's node template (Gardener puts the pool's labels on its nodes)."""
    candidates: list[Any] = []
    if machine_deployment is not None:
        candidates.append(machine_deployment.metadata.labels.get(WORKER_POOL_LABEL))
        candidates.append(_node_template_labels(machine_deployment).get(WORKER_POOL_LABEL))
    candidates.append(_node_template_labels(machine_set).get(WORKER_POOL_LABEL))
    return next((c for c in candidates if isinstance(c, str) and c), None)


def _zone_label_values(labels: Mapping[str, Any]) -> Iterable[str]:
    for key, value in labels.items():
        if isinstance(value, str) and (key in (ZONE_LABEL, DEPRECATED_ZONE_LABEL) or key.endswith("/zone")):
            yield value


def _zone_index(value: str, zones: Sequence[str]) -> int | None:
    if value in zones:
        return zones.index(value)
    suffixed = [index for index, zone in enumerate(zones) if value.endswith(f"-{zone}")]
    return suffixed[0] if len(suffixed) == 1 else None


@dataclass(frozen=True)
class ZoneMatch:
    index: int | None  # position in the pool's `zones`; None when it cannot be told
    how: str


def zone_of(
    *,
    zones: Sequence[str],
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    zone: str | None = None,
) -> ZoneMatch:
    """Which of the pool's `zones` the MachineDeployment serves (see the module's docstring)."""
    if zone is not None:
        index = _zone_index(zone, zones)
        if index is not None:
            return ZoneMatch(index, f"zone {zones[index]} (given)")
    found: dict[int, str] = {}
    labelled = (
        ("MachineDeployment", machine_deployment.metadata.labels if machine_deployment is not None else {}),
        ("MachineDeployment node template", _node_template_labels(machine_deployment)),
        ("MachineSet node template", _node_template_labels(machine_set)),
    )
    for where, labels in labelled:
        for value in _zone_label_values(labels):
            index = _zone_index(value, zones)
            if index is not None:
                found.setdefault(index, f"zone {zones[index]} (label on the {where})")
    if len(found) == 1:
        index, how = next(iter(found.items()))
        return ZoneMatch(index, how)
    if len(found) > 1:
        named = ", ".join(zones[index] for index in sorted(found))
        return ZoneMatch(None, f"the labels name several of the pool's zones ({named})")
    return ZoneMatch(None, "no zone label names one of the pool's zones")


# --- Resolution --------------------------------------------------------------------------------------------


def resolve_preserve_timeout(
    *,
    machine: Machine | None,
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    cluster: ClusterView | None,
    defaults: PoolDefaults,
    notes: list[str] | None = None,
) -> Setting[dt.timedelta]:
    """The preservation timeout for `machine` (or, without a machine, for new machines of the MachineSet)."""
    notes = [] if notes is None else notes
    for source, where, raw in _timeout_candidates(machine, machine_set, machine_deployment, cluster, notes):
        value = _timeout(raw, where, notes)
        if value is not None:
            return Setting(value, source, f"{where}: {format_go_duration(value)}")
    value = defaults.preserve_timeout
    return Setting(value, SettingOrigin.FLAGS, f"--machine-preserve-timeout: {format_go_duration(value)}")


def _timeout_candidates(
    machine: Machine | None,
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    cluster: ClusterView | None,
    notes: list[str],
) -> Iterator[tuple[SettingOrigin, str, Any]]:
    """Each source's raw timeout, in order; the providerConfig is looked at only when reached."""
    if machine is not None:
        where = f"Machine {machine.metadata.name} spec.{_TIMEOUT_KEY}"
        yield SettingOrigin.MACHINE, where, machine.spec.machine_preserve_timeout
    for source, obj in (
        (SettingOrigin.MACHINE_SET, machine_set),
        (SettingOrigin.MACHINE_DEPLOYMENT, machine_deployment),
    ):
        if obj is not None:
            yield source, f"{source} {obj.metadata.name} spec.template.spec.{_TIMEOUT_KEY}", _template_timeout(obj)
    shoot_worker = _shoot_worker(machine_set, machine_deployment, cluster, notes)
    if shoot_worker is None or cluster is None:
        return
    worker, where = shoot_worker
    settings = worker.machine_controller_manager or {}
    field = f"{where}.machineControllerManager.{_TIMEOUT_KEY}"
    yield SettingOrigin.SHOOT, field, settings.get(_TIMEOUT_KEY)
    configured = _configured_worker(cluster, worker.name, notes)
    if configured is not None:
        entry, where = configured
        yield SettingOrigin.PROVIDER_CONFIG, f"{where}.{_TIMEOUT_KEY}", entry.machine_preserve_timeout


def resolve_auto_preserve_max(
    *,
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    cluster: ClusterView | None,
    defaults: PoolDefaults,
    zone: str | None = None,
    notes: list[str] | None = None,
) -> Setting[int]:
    """The MachineSet's `autoPreserveFailedMachineMax`. `zone`: this MachineDeployment's zone where the caller
    knows it from elsewhere (e.g. its MachineClass's `nodeTemplate.zone`)."""
    notes = [] if notes is None else notes
    for source, obj in (
        (SettingOrigin.MACHINE_SET, machine_set),
        (SettingOrigin.MACHINE_DEPLOYMENT, machine_deployment),
    ):
        if obj is not None and carries_max(obj):
            where = f"{source} {obj.metadata.name} spec.autoPreserveFailedMachineMax"
            value = _max(obj.spec.auto_preserve_failed_machine_max, where, notes)
            if value is not None:
                return Setting(value, source, f"{where}: {value}")
    shoot_worker = _shoot_worker(machine_set, machine_deployment, cluster, notes)
    if shoot_worker is not None and cluster is not None:
        worker, where = shoot_worker
        for source, field, raw in _pool_max_candidates(worker, where, cluster, notes):
            total = _max(raw, field, notes)
            if total is not None:
                return _pool_share(
                    total=_clamped(total, worker, field, notes),
                    source=source,
                    field=field,
                    worker=worker,
                    machine_set=machine_set,
                    machine_deployment=machine_deployment,
                    zone=zone,
                    notes=notes,
                )
    value = defaults.auto_preserve_failed_machine_max
    return Setting(value, SettingOrigin.FLAGS, f"default: {value}")


def _pool_max_candidates(
    worker: ShootWorker, where: str, cluster: ClusterView, notes: list[str]
) -> Iterator[tuple[SettingOrigin, str, Any]]:
    """The pool's raw total max from the Shoot, then from the providerConfig (looked at only when reached)."""
    settings = worker.machine_controller_manager or {}
    # The released API first; the worker-level field of an earlier iteration only where it is not set.
    yield SettingOrigin.SHOOT, f"{where}.machineControllerManager.{_MAX_KEY}", settings.get(_MAX_KEY)
    yield SettingOrigin.SHOOT, f"{where}.{_MAX_KEY}", worker.auto_preserve_failed_machine_max
    configured = _configured_worker(cluster, worker.name, notes)
    if configured is not None:
        entry, where = configured
        yield SettingOrigin.PROVIDER_CONFIG, f"{where}.{_MAX_KEY}", entry.auto_preserve_failed_machine_max


def _clamped(total: int, worker: ShootWorker, field: str, notes: list[str]) -> int:
    """`total` within the bound Gardener's admission puts on the pool's max: without the garden admission a Shoot
    can carry a max above its pool's `maximum`, which would keep every machine of a failing pool."""
    bound = worker.auto_preserve_bound()
    if bound is None or total <= bound:
        return total
    notes.append(f"{field} {total} is above what the pool's maximum allows: {bound} is used")
    return bound


def _pool_share(
    *,
    total: int,
    source: SettingOrigin,
    field: str,
    worker: ShootWorker,
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    zone: str | None,
    notes: list[str],
) -> Setting[int]:
    """This MachineDeployment's share of the pool's `total` (from the Shoot or its providerConfig)."""
    zones = worker.zones
    if zones is None:
        # Without the zones neither their number nor this one's place is known: no share can be trusted.
        notes.append(f"{field}: the pool's zones are not a list of names; auto-preservation is off for it")
        return Setting(0, source, f"{field}: {total}, zones unreadable: 0")
    if len(zones) <= 1:
        return Setting(total, source, f"{field}: {total}")
    match = zone_of(zones=zones, machine_set=machine_set, machine_deployment=machine_deployment, zone=zone)
    share = zone_share(total=total, zone_count=len(zones), index=match.index)
    spread = f"{total} over {len(zones)} zones"
    if match.index is not None:
        return Setting(share, source, f"{field}: {spread}, {match.how}: {share}")
    if total % len(zones):
        notes.append(f"{field}: the MachineDeployment's zone is not known ({match.how}); the smallest share is used")
    return Setting(share, source, f"{field}: {spread}, zone not known: {share}")


def _configured_worker(cluster: ClusterView, pool: str, notes: list[str]) -> tuple[WorkerPreservation, str] | None:
    """The pool's entry in the Shoot's providerConfig, with the path naming it; None (with a note when the
    providerConfig does not decode) otherwise."""
    if cluster.provider_config_problem is not None:
        _note(notes, cluster.provider_config_problem)
        return None
    entry = cluster.provider_config.worker(pool) if cluster.provider_config is not None else None
    if entry is None or cluster.shoot is None:
        return None
    return entry, f"Shoot {cluster.shoot.metadata.name} {cluster.provider_config_path}.workers[name={pool}]"


def _shoot_worker(
    machine_set: MachineSet | None,
    machine_deployment: MachineDeployment | None,
    cluster: ClusterView | None,
    notes: list[str],
) -> tuple[ShootWorker, str] | None:
    """The pool's worker in the Cluster's Shoot, with the path naming it; None (with a note where something is
    wrong rather than simply absent) otherwise."""
    if cluster is None:
        return None
    if cluster.shoot is None:
        if cluster.problem is not None:
            _note(notes, cluster.problem)
        return None
    pool = pool_name(machine_set=machine_set, machine_deployment=machine_deployment)
    if pool is None:
        owner = machine_deployment or machine_set
        named = f"{type(owner).__name__} {owner.metadata.name}" if owner is not None else "the MachineSet"
        _note(notes, f"{named} has no label {WORKER_POOL_LABEL}: the Shoot's pools do not apply")
        return None
    worker = cluster.shoot.worker(pool)
    if worker is None:
        _note(notes, f"the Shoot in Cluster {cluster.name} has no worker pool {pool!r}")
        return None
    return worker, f"Shoot {cluster.shoot.metadata.name} spec.provider.workers[name={pool}]"


def _note(notes: list[str], note: str) -> None:
    # Both settings look at the same Shoot: say what is wrong with it once.
    if note not in notes:
        notes.append(note)
