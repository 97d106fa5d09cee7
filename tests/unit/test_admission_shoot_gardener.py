"""Shoot validation against Gardener's own expectations for the preservation fields.

Every case of Gardener's unit tests for `machinePreserveTimeout` and `autoPreserveFailedMachineMax`
(its worker validation, "machine controller manager settings validation") is a row here, with what Gardener
expects: accepted, or the error type, field path and detail it asserts. Rows of the second table apply
Gardener's rules to inputs its tests do not cover (sub-microsecond negatives, an absent `maximum`).

Where we differ from Gardener on purpose, the row says both:
- field paths use the JSON key `machineControllerManager` (what users write), where Gardener's use its Go name
  `machineControllerManagerSettings`; both sit under `spec.provider.workers[i]`;
- details are worded for users and name the bound ("must be less than or equal to maximum (4)"); the
  verdict (accept or the error type on that field, with the same bad value) is Gardener's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import validate_shoot

GARDENER_PREFIX = "workers[0].machineControllerManagerSettings."
OUR_PREFIX = "spec.provider.workers[0].machineControllerManager."


@dataclass(frozen=True)
class GardenerError:
    type: str  # as rendered, e.g. "Invalid value"
    field: str  # Gardener's field path
    bad_value: str  # the bad value as Gardener renders it
    detail: str  # Gardener's detail


@dataclass(frozen=True)
class Case:
    name: str
    maximum: int | None  # None: the worker has no `maximum`
    system_components: bool | None  # None: no `systemComponents` (Gardener: allowed)
    settings: dict[str, Any] | None  # the worker's `machineControllerManager`; None: absent
    gardener: GardenerError | None  # None: Gardener accepts
    our_detail: str | None = None  # our wording of the same error


def _worker(case: Case) -> dict[str, Any]:
    worker: dict[str, Any] = {"name": "worker-1", "minimum": 0}
    if case.maximum is not None:
        worker["maximum"] = case.maximum
    if case.system_components is not None:
        worker["systemComponents"] = {"allow": case.system_components}
    if case.settings is not None:
        worker["machineControllerManager"] = case.settings
    return worker


def _our_path(gardener_field: str) -> str:
    assert gardener_field.startswith(GARDENER_PREFIX)
    return OUR_PREFIX + gardener_field.removeprefix(GARDENER_PREFIX)


MAX = GARDENER_PREFIX + "autoPreserveFailedMachineMax"
TIMEOUT = GARDENER_PREFIX + "machinePreserveTimeout"
NON_NEGATIVE = "must be non-negative"
OUR_NON_NEGATIVE = "must be greater than or equal to 0"
OVER_MAXIMUM = "must not be greater than maximum value"
OVER_MAXIMUM_MINUS_ONE = (
    "must not be greater than maximum-1 value when system components are allowed, "
    "need at least one machine to run system components"
)
OUR_OVER_MAXIMUM_MINUS_ONE = (
    "must be less than or equal to maximum - 1 (3) when the pool allows system components "
    "(one machine must stay to run them)"
)

# Gardener's worker validation tests start from a worker with neither `maximum` nor `systemComponents` set.
GARDENER_TESTS = [
    Case("succeeds without machine controller manager settings", None, None, None, None),
    Case(
        "forbids a negative machinePreserveTimeout (-2m)",
        None,
        None,
        {"machinePreserveTimeout": "-2m0s"},
        GardenerError("Invalid value", TIMEOUT, '"-2m0s"', NON_NEGATIVE),
        OUR_NON_NEGATIVE,
    ),
    Case(
        "allows autoPreserveFailedMachineMax = maximum when system components are not allowed",
        4,
        False,
        {"autoPreserveFailedMachineMax": 4},
        None,
    ),
    Case(
        "allows autoPreserveFailedMachineMax = maximum-1 when system components are allowed",
        4,
        True,
        {"autoPreserveFailedMachineMax": 3},
        None,
    ),
    Case(
        "forbids autoPreserveFailedMachineMax > maximum when system components are not allowed",
        4,
        False,
        {"autoPreserveFailedMachineMax": 5},
        GardenerError("Invalid value", MAX, "5", OVER_MAXIMUM),
        "must be less than or equal to maximum (4)",
    ),
    Case(
        "forbids autoPreserveFailedMachineMax > maximum-1 when system components are allowed",
        4,
        True,
        {"autoPreserveFailedMachineMax": 5},
        GardenerError("Invalid value", MAX, "5", OVER_MAXIMUM_MINUS_ONE),
        OUR_OVER_MAXIMUM_MINUS_ONE,
    ),
    Case("allows autoPreserveFailedMachineMax = 0", 4, True, {"autoPreserveFailedMachineMax": 0}, None),
    Case(
        "forbids a negative autoPreserveFailedMachineMax",
        4,
        True,
        {"autoPreserveFailedMachineMax": -1},
        GardenerError("Invalid value", MAX, "-1", "must not be negative"),
        OUR_NON_NEGATIVE,
    ),
]

# Gardener's rules (non-negative durations compared as int64 nanoseconds; `maximum` an int32 that is 0 when
# absent; a nil `systemComponents` counts as allowed) applied where its tests have no case.
GARDENER_RULES = [
    Case(
        "forbids -1ns (negative, though below a microsecond)",
        None,
        None,
        {"machinePreserveTimeout": "-1ns"},
        GardenerError("Invalid value", TIMEOUT, '"-1ns"', NON_NEGATIVE),
        OUR_NON_NEGATIVE,
    ),
    Case(
        "forbids -999ns",
        None,
        None,
        {"machinePreserveTimeout": "-999ns"},
        GardenerError("Invalid value", TIMEOUT, '"-999ns"', NON_NEGATIVE),
        OUR_NON_NEGATIVE,
    ),
    Case(
        "forbids -1.5µs, shown as Go prints it",
        None,
        None,
        {"machinePreserveTimeout": "-1500ns"},
        GardenerError("Invalid value", TIMEOUT, '"-1.5µs"', NON_NEGATIVE),
        OUR_NON_NEGATIVE,
    ),
    Case("allows a zero machinePreserveTimeout", None, None, {"machinePreserveTimeout": "0s"}, None),
    Case("allows -0 (zero)", None, None, {"machinePreserveTimeout": "-0"}, None),
    Case("allows 1ns", None, None, {"machinePreserveTimeout": "1ns"}, None),
    Case(
        "counts an absent maximum as 0: any positive max is over it",
        None,
        None,
        {"autoPreserveFailedMachineMax": 1},
        GardenerError("Invalid value", MAX, "1", OVER_MAXIMUM),
        "must be less than or equal to maximum (0)",
    ),
    Case(
        "counts an absent maximum as 0: also without system components",
        None,
        False,
        {"autoPreserveFailedMachineMax": 1},
        GardenerError("Invalid value", MAX, "1", OVER_MAXIMUM),
        "must be less than or equal to maximum (0)",
    ),
    Case("allows max 0 with an absent maximum", None, None, {"autoPreserveFailedMachineMax": 0}, None),
    Case(
        "maximum 0 with system components allowed falls to the plain maximum rule",
        0,
        True,
        {"autoPreserveFailedMachineMax": 1},
        GardenerError("Invalid value", MAX, "1", OVER_MAXIMUM),
        "must be less than or equal to maximum (0)",
    ),
    Case(
        "an absent systemComponents counts as allowed (maximum-1 rule)",
        4,
        None,
        {"autoPreserveFailedMachineMax": 4},
        GardenerError(
            "Invalid value",
            MAX,
            "4",
            OVER_MAXIMUM_MINUS_ONE,
        ),
        "must be less than or equal to maximum - 1 (3) when the pool allows system components "
        "(one machine must stay to run them)",
    ),
    Case(
        "a negative max is reported as negative first, whatever the maximum",
        0,
        True,
        {"autoPreserveFailedMachineMax": -3},
        GardenerError("Invalid value", MAX, "-3", "must not be negative"),
        OUR_NON_NEGATIVE,
    ),
]


@pytest.mark.parametrize("case", GARDENER_TESTS + GARDENER_RULES, ids=lambda case: case.name)
def test_we_agree_with_gardener(case: Case) -> None:
    shoot = {"metadata": {"name": "shoot"}, "spec": {"provider": {"type": "test", "workers": [_worker(case)]}}}
    verdict = validate_shoot(shoot=shoot, old_shoot=None, settings=AdmissionSettings())
    if case.gardener is None:
        assert verdict.allowed, verdict.message
        return
    assert not verdict.allowed
    expected = f"{_our_path(case.gardener.field)}: {case.gardener.type}: {case.gardener.bad_value}: {case.our_detail}"
    assert verdict.message == expected


def test_every_gardener_test_case_is_in_the_table() -> None:
    # Gardener's suite has eight cases for these fields (one without settings, one for the timeout, six for the
    # max); a row lost in an edit would silently shrink the comparison.
    assert len(GARDENER_TESTS) == 8
    assert len({case.name for case in GARDENER_TESTS + GARDENER_RULES}) == len(GARDENER_TESTS + GARDENER_RULES)
