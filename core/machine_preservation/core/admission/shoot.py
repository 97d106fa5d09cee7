"""Validation of the preservation fields of a Shoot's worker pools.

For every `spec.provider.workers[i].machineControllerManager`:
- `autoPreserveFailedMachineMax`: an integer ≥ 0 and ≤ `maximum` (≤ `maximum - 1` when the pool allows
  system components and `maximum > 0`: one machine must stay for them; Gardener's rule). An absent
  `maximum` counts as 0, as in Gardener's types;
- `machinePreserveTimeout`: a Go duration ≥ 0 and ≤ the configured bound, judged on its exact value in
  nanoseconds (so "-1ns" is negative, as Gardener sees it).
All errors are reported at once, in Kubernetes field-error style with full paths. Field paths use the JSON
key `machineControllerManager` (what users write), not Gardener's Go name `machineControllerManagerSettings`.
A max that cannot be spread evenly over the pool's zones earns a warning saying what each zone gets.
On UPDATE only workers that changed (compared by name with the old Shoot) are judged.
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
from machine_preservation.core.admission.zones import distribute_over_zones
from machine_preservation.core.durations import (
    InvalidDuration,
    format_go_duration_nanoseconds,
    parse_go_duration_nanoseconds,
    timedelta_nanoseconds,
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


def _system_components_allowed(worker: Mapping[str, Any]) -> bool:
    # Gardener: a nil systemComponents counts as allowed; otherwise its `allow` flag decides.
    components = worker.get("systemComponents")
    return components is None or (isinstance(components, Mapping) and components.get("allow") is True)


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
    if _system_components_allowed(worker) and maximum > 0 and value > maximum - 1:
        return [
            invalid(
                path,
                value,
                f"must be less than or equal to maximum - 1 ({maximum - 1}) when the pool allows system "
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
        return [invalid(path, value, 'must be a duration string such as "72h"')]
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


def _worker_errors(
    *, worker: Any, path: FieldPath, settings: AdmissionSettings, warnings: list[str]
) -> list[FieldError]:
    if not isinstance(worker, Mapping):
        return [invalid(path, worker, "must be an object")]
    settings_block = worker.get(MCM_KEY)
    if settings_block is None:
        return []
    mcm_path = path.child(MCM_KEY)
    if not isinstance(settings_block, Mapping):
        return [invalid(mcm_path, settings_block, "must be an object")]
    errors: list[FieldError] = []
    if (max_value := settings_block.get(MAX_KEY)) is not None:
        errors += _max_errors(worker=worker, path=mcm_path.child(MAX_KEY), value=max_value, warnings=warnings)
    if (timeout := settings_block.get(TIMEOUT_KEY)) is not None:
        errors += _timeout_errors(path=mcm_path.child(TIMEOUT_KEY), value=timeout, settings=settings)
    return errors


def validate_shoot(
    *, shoot: Mapping[str, Any], old_shoot: Mapping[str, Any] | None, settings: AdmissionSettings
) -> Verdict:
    """Allow (with zone-spread warnings) or deny listing every field error of the judged workers."""
    workers = _workers(shoot)
    if workers is None:
        return allow()
    if not isinstance(workers, list):
        return deny(aggregate([invalid(WORKERS_PATH, workers, "must be a list")]))
    old_workers = _workers(old_shoot) if old_shoot is not None else None
    unchanged = {
        worker["name"]: worker
        for worker in (old_workers if isinstance(old_workers, list) else [])
        if isinstance(worker, Mapping) and isinstance(worker.get("name"), str)
    }
    errors: list[FieldError] = []
    warnings: list[str] = []
    for index, worker in enumerate(workers):
        name = worker.get("name") if isinstance(worker, Mapping) else None
        if isinstance(name, str) and unchanged.get(name) == worker:
            continue
        errors += _worker_errors(worker=worker, path=WORKERS_PATH.index(index), settings=settings, warnings=warnings)
    if errors:
        return deny(aggregate(errors), warnings=tuple(warnings))
    return allow(warnings=tuple(warnings))
