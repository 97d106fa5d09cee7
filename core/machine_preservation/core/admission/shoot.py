"""Validation of the preservation fields of a Shoot's worker pools.

For every `spec.provider.workers[i].machineControllerManager`:
- `autoPreserveFailedMachineMax`: an integer ≥ 0 and ≤ `maximum` (≤ `maximum - 1` when the pool allows
  system components and `maximum > 0`: one machine must stay for them; Gardener's rule). An absent
  `maximum` counts as 0, as in Gardener's types;
- `machinePreserveTimeout`: a Go duration ≥ 0 and ≤ the configured bound, judged on its exact value in
  nanoseconds (so "-1ns" is negative, as Gardener sees it).
All errors are reported at once, in Kubernetes field-error style with full paths; the denial names the first 10
within 2 KiB, values cut to about 80 characters, and counts the rest (field_errors.aggregate). Field paths use the JSON
key `machineControllerManager` (what users write), not Gardener's Go name `machineControllerManagerSettings`.
A max that cannot be spread evenly over the pool's zones earns a warning saying what each zone gets.
On UPDATE only the settings that changed are judged (compared by pool name with the old Shoot; a max also when its
pool's `maximum` or `systemComponents` changed): a value a pool already had never blocks an image or version
update, even where a bound was lowered since (the controller clamps a max to the pool's bound, pool_settings.py).

The extension's `providerConfig` (`spec.extensions[i].providerConfig` of the enabled `machine-preservation`
entry, provider_config.py) is judged as well:
- one that does not decode is denied with every bad field's path; one beyond the bounds (compact JSON over 64 KiB,
  more than 256 `workers`; provider_config.py) is denied for that alone, without being decoded;
- each entry of its `workers` must name a pool of `spec.provider.workers`; its max and timeout follow the rules
  above, against that pool, under the entry's own path;
- a setting of a pool in both its `machineControllerManager` and the providerConfig with different values (the
  timeouts compared as durations) is denied naming both paths: which one counts would otherwise be a surprise.
On UPDATE the document is judged when it changed; else only its entries whose pool changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from machine_preservation.core.admission.field_errors import (
    FieldError,
    FieldPath,
    aggregate,
    invalid,
    render_value,
    root,
)
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import Verdict, allow, deny
from machine_preservation.core.durations import (
    NOT_A_DURATION_STRING,
    InvalidDuration,
    format_go_duration_nanoseconds,
    parse_go_duration_nanoseconds,
    timedelta_nanoseconds,
)
from machine_preservation.core.gardener.cluster import auto_preserve_bound, distribute_over_zones
from machine_preservation.core.gardener.provider_config import (
    InvalidPreservationConfig,
    PreservationExtension,
    WorkerPreservation,
    parse_preservation_config,
    preservation_extension,
)

WORKERS_PATH = root("spec", "provider", "workers")
MCM_KEY = "machineControllerManager"
MAX_KEY = "autoPreserveFailedMachineMax"
TIMEOUT_KEY = "machinePreserveTimeout"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _workers(shoot: Mapping[str, Any] | None) -> Any:
    spec = shoot.get("spec") if isinstance(shoot, Mapping) else None
    provider = spec.get("provider") if isinstance(spec, Mapping) else None
    return provider.get("workers") if isinstance(provider, Mapping) else None


def _max_errors(*, worker: Mapping[str, Any], path: FieldPath, value: Any, warnings: list[str]) -> list[FieldError]:
    if not _is_int(value):
        return [invalid(path, value, "must be an integer")]
    if value < 0:
        return [invalid(path, value, "must be greater than or equal to 0")]
    # Gardener's `maximum` is a plain int32: a worker without it has maximum 0.
    maximum = worker.get("maximum")
    if maximum is None:
        maximum = 0
    if not _is_int(maximum):
        return [invalid(path, value, f"cannot be checked: maximum is not an integer ({render_value(maximum)})")]
    bound = auto_preserve_bound(maximum=maximum, system_components=worker.get("systemComponents"))
    if bound < maximum and value > bound:
        return [
            invalid(
                path,
                value,
                f"must be less than or equal to maximum - 1 ({bound}) when the pool allows system "
                "components (one machine must stay to run them)",
            )
        ]
    if value > maximum:
        return [invalid(path, value, f"must be less than or equal to maximum ({maximum})")]
    zones = worker.get("zones")
    if isinstance(zones, list) and len(zones) > 1 and value % len(zones):
        shares = distribute_over_zones(total=value, zone_count=len(zones))
        spread = ", ".join(f"{zone}={share}" for zone, share in zip(zones, shares, strict=True))
        warnings.append(f"{path}: {value} cannot be spread evenly over {len(zones)} zones; per zone: {spread}")
    return []


def _timeout_errors(*, path: FieldPath, value: Any, settings: AdmissionSettings) -> list[FieldError]:
    if not isinstance(value, str):
        return [invalid(path, value, NOT_A_DURATION_STRING)]
    try:
        nanoseconds = parse_go_duration_nanoseconds(value)
    except InvalidDuration as error:
        return [invalid(path, value, f'must be a duration such as "72h" ({error})')]
    shown = format_go_duration_nanoseconds(nanoseconds)
    if nanoseconds < 0:
        return [invalid(path, shown, "must be greater than or equal to 0")]
    bound = timedelta_nanoseconds(settings.max_preserve_timeout)
    if nanoseconds > bound:
        return [invalid(path, shown, f"must be less than or equal to {format_go_duration_nanoseconds(bound)}")]
    return []


_ABSENT = object()


def _setting(worker: Any, key: str) -> Any:
    """The pool's preservation setting `key` as written; _ABSENT without a pool or a settings block."""
    block = worker.get(MCM_KEY) if isinstance(worker, Mapping) else None
    return block.get(key, _ABSENT) if isinstance(block, Mapping) else _ABSENT


def _max_inputs(worker: Any) -> tuple[Any, ...]:
    """What a pool's max is judged on: the max and the pool's bound."""
    if not isinstance(worker, Mapping):
        return (_setting(worker, MAX_KEY),)
    return _setting(worker, MAX_KEY), worker.get("maximum", _ABSENT), worker.get("systemComponents", _ABSENT)


def _judged_fields(worker: Any) -> tuple[Any, ...]:
    return *_max_inputs(worker), _setting(worker, TIMEOUT_KEY)


def _worker_errors(
    *, worker: Any, old_worker: Any, path: FieldPath, settings: AdmissionSettings, warnings: list[str]
) -> list[FieldError]:
    """The errors of the pool's settings that changed from `old_worker` (all of them for a new pool); the max also
    when its bound (`maximum`, `systemComponents`) changed. A value the pool already had never blocks another
    change (an image or version update; a lowered `maxPreserveTimeout`): the controller clamps a max to the pool's
    bound and ignores an invalid value."""
    if not isinstance(worker, Mapping):
        return [invalid(path, worker, "must be an object")]
    settings_block = worker.get(MCM_KEY)
    if settings_block is None:
        return []
    mcm_path = path.child(MCM_KEY)
    if not isinstance(settings_block, Mapping):
        unchanged = isinstance(old_worker, Mapping) and old_worker.get(MCM_KEY) == settings_block
        return [] if unchanged else [invalid(mcm_path, settings_block, "must be an object")]
    errors: list[FieldError] = []
    max_value = settings_block.get(MAX_KEY)
    if max_value is not None and (old_worker is None or _max_inputs(worker) != _max_inputs(old_worker)):
        errors += _max_errors(worker=worker, path=mcm_path.child(MAX_KEY), value=max_value, warnings=warnings)
    timeout = settings_block.get(TIMEOUT_KEY)
    if timeout is not None and (old_worker is None or timeout != _setting(old_worker, TIMEOUT_KEY)):
        errors += _timeout_errors(path=mcm_path.child(TIMEOUT_KEY), value=timeout, settings=settings)
    return errors


def _comparable(key: str, value: Any) -> int | None:
    """A setting as compared between the two places: the max as it is, the timeout in nanoseconds; None when it
    is invalid (then it is reported on its own)."""
    if key == MAX_KEY:
        return value if _is_int(value) else None
    try:
        return parse_go_duration_nanoseconds(value) if isinstance(value, str) else None
    except InvalidDuration:
        return None


def _conflicts(
    *, entry: WorkerPreservation, path: FieldPath, worker: Mapping[str, Any], worker_path: FieldPath
) -> list[FieldError]:
    """The pool's settings set in both places with different values."""
    settings_block = worker.get(MCM_KEY)
    if not isinstance(settings_block, Mapping):
        return []
    errors: list[FieldError] = []
    for key, configured in (
        (MAX_KEY, entry.auto_preserve_failed_machine_max),
        (TIMEOUT_KEY, entry.machine_preserve_timeout),
    ):
        own = settings_block.get(key)
        ours, theirs = _comparable(key, configured), _comparable(key, own)
        if ours is not None and theirs is not None and ours != theirs:
            other = worker_path.child(MCM_KEY).child(key)
            detail = f"differs from {other} ({render_value(own)}): set the pool's {key} in one place only"
            errors.append(invalid(path.child(key), configured, detail))
    return errors


_LISTED_POOLS = 20


def _listed(names: list[str]) -> str:
    """The pools a providerConfig entry may name, the first 20 of many and how many there are."""
    if not names:
        return "none"
    if len(names) <= _LISTED_POOLS:
        return ", ".join(names)
    return f"{', '.join(names[:_LISTED_POOLS])}, ... ({len(names)} pools)"


def _provider_config_errors(
    *,
    extension: PreservationExtension,
    old_extension: PreservationExtension | None,
    workers: list[Any],
    changed_pools: set[str],
    settings: AdmissionSettings,
    warnings: list[str],
) -> list[FieldError]:
    """The providerConfig's errors: all of them when it changed, else those of entries whose pool changed."""
    document_changed = old_extension is None or old_extension.provider_config != extension.provider_config
    try:
        config = parse_preservation_config(extension.provider_config, path=extension.path)
    except InvalidPreservationConfig as error:
        return list(error.errors) if document_changed else []
    pools = _by_name(workers)
    # Each pool's position, the last of a name as in `pools` (looked up once: a Shoot may have hundreds of pools).
    positions = {id(worker): index for index, worker in enumerate(workers)}
    known = _listed(list(pools))
    errors: list[FieldError] = []
    for position, entry in enumerate(config.workers):
        if not document_changed and entry.name not in changed_pools:
            continue
        path = extension.path.child("workers").index(position)
        if entry.name not in pools:
            detail = f"must name a worker pool of {WORKERS_PATH} (pools: {known})"
            errors.append(invalid(path.child("name"), entry.name, detail))
            continue
        worker = pools[entry.name]
        index = positions[id(worker)]
        if entry.auto_preserve_failed_machine_max is not None:
            value = entry.auto_preserve_failed_machine_max
            errors += _max_errors(worker=worker, path=path.child(MAX_KEY), value=value, warnings=warnings)
        if entry.machine_preserve_timeout is not None:
            errors += _timeout_errors(
                path=path.child(TIMEOUT_KEY), value=entry.machine_preserve_timeout, settings=settings
            )
        errors += _conflicts(entry=entry, path=path, worker=worker, worker_path=WORKERS_PATH.index(index))
    return errors


def provider_config_errors(
    *, shoot: Mapping[str, Any] | None, provider_config: Any, settings: AdmissionSettings
) -> list[FieldError]:
    """Every error of the extension's providerConfig judged against the Shoot's pools, as the Shoot admission
    judges it, named by the Shoot's field paths (the Shoot owner fixes them there). For the seed: a providerConfig
    that reached it without passing the garden admission."""
    entry = preservation_extension(shoot) if shoot is not None else None
    workers = _workers(shoot)
    return _provider_config_errors(
        extension=PreservationExtension(index=entry.index if entry is not None else 0, provider_config=provider_config),
        old_extension=None,
        workers=workers if isinstance(workers, list) else [],
        changed_pools=set(),
        settings=settings,
        warnings=[],
    )


def _by_name(workers: Any) -> dict[str, Mapping[str, Any]]:
    """The named workers by name (Gardener denies duplicate names; the last one counts here)."""
    return {
        worker["name"]: worker
        for worker in (workers if isinstance(workers, list) else [])
        if isinstance(worker, Mapping) and isinstance(worker.get("name"), str)
    }


def validate_shoot(
    *, shoot: Mapping[str, Any], old_shoot: Mapping[str, Any] | None, settings: AdmissionSettings
) -> Verdict:
    """Allow (with zone-spread warnings) or deny listing every field error of the judged workers and of the
    providerConfig."""
    workers = _workers(shoot)
    if workers is not None and not isinstance(workers, list):
        return deny(aggregate([invalid(WORKERS_PATH, workers, "must be a list")]))
    workers = workers or []
    old = _by_name(_workers(old_shoot)) if old_shoot is not None else {}
    new = _by_name(workers)
    # Pools added or removed, or whose settings changed (a removed pool may be named by the providerConfig).
    changed_pools = {
        name
        for name in new.keys() | old.keys()
        if name not in new or name not in old or _judged_fields(new[name]) != _judged_fields(old[name])
    }
    errors: list[FieldError] = []
    warnings: list[str] = []
    for index, worker in enumerate(workers):
        name = worker.get("name") if isinstance(worker, Mapping) else None
        old_worker = old.get(name) if isinstance(name, str) else None
        path = WORKERS_PATH.index(index)
        errors += _worker_errors(worker=worker, old_worker=old_worker, path=path, settings=settings, warnings=warnings)
    extension = preservation_extension(shoot)
    if extension is not None and extension.provider_config is not None:
        errors += _provider_config_errors(
            extension=extension,
            old_extension=preservation_extension(old_shoot) if old_shoot is not None else None,
            workers=workers,
            changed_pools=changed_pools,
            settings=settings,
            warnings=warnings,
        )
    if errors:
        return deny(aggregate(errors), warnings=tuple(warnings))
    return allow(warnings=tuple(warnings))
