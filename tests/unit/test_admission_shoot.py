"""Validation of the Shoot worker preservation fields (core.admission.shoot)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import validate_shoot
from machine_preservation.core.admission.verdict import Verdict

SETTINGS = AdmissionSettings()
PATH = "spec.provider.workers[{}].machineControllerManager.{}"


def worker(
    name: str = "w",
    *,
    maximum: Any = 4,
    system: bool | None = False,
    zones: list[str] | None = None,
    **mcm: Any,
) -> dict[str, Any]:
    document: dict[str, Any] = {"name": name, "minimum": 1, "maximum": maximum}
    if system is not None:
        document["systemComponents"] = {"allow": system}
    if zones is not None:
        document["zones"] = zones
    if mcm:
        document["machineControllerManager"] = mcm
    return document


def shoot(*workers: Any) -> dict[str, Any]:
    return {"metadata": {"name": "s"}, "spec": {"provider": {"type": "aws", "workers": list(workers)}}}


def check(new: dict[str, Any], old: dict[str, Any] | None = None, settings: AdmissionSettings = SETTINGS) -> Verdict:
    return validate_shoot(shoot=new, old_shoot=old, settings=settings)


def test_the_issue_example_verbatim() -> None:
    verdict = check(shoot(worker("a"), worker("b", autoPreserveFailedMachineMax=5)))
    assert not verdict.allowed
    assert verdict.code == 403
    assert verdict.message == (
        "spec.provider.workers[1].machineControllerManager.autoPreserveFailedMachineMax: Invalid value: 5: "
        "must be less than or equal to maximum (4)"
    )


@pytest.mark.parametrize(
    ("maximum", "system", "value", "detail"),
    [
        (4, False, 4, None),
        (4, False, 0, None),
        (4, None, 3, None),  # absent systemComponents counts as allowed
        (4, None, 4, "must be less than or equal to maximum - 1 (3) when the pool allows system components"),
        (4, True, 4, "must be less than or equal to maximum - 1 (3) when the pool allows system components"),
        (0, True, 1, "must be less than or equal to maximum (0)"),  # Gardener: maximum 0 falls to the plain rule
        (0, True, 0, None),
        (4, False, -1, "must be greater than or equal to 0"),
    ],
)
def test_the_max_is_bounded_by_the_pool(maximum: int, system: bool | None, value: int, detail: str | None) -> None:
    verdict = check(shoot(worker(maximum=maximum, system=system, autoPreserveFailedMachineMax=value)))
    if detail is None:
        assert verdict.allowed, verdict.message
    else:
        assert not verdict.allowed
        prefix = f"{PATH.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: {value}: {detail}"
        assert verdict.message.startswith(prefix)


@pytest.mark.parametrize(("value", "shown"), [("5", '"5"'), (1.5, "1.5"), (2.0, "2.0"), (True, "true"), ([1], "[1]")])
def test_a_max_that_is_not_an_integer_is_invalid(value: Any, shown: str) -> None:
    verdict = check(shoot(worker(autoPreserveFailedMachineMax=value)))
    assert (
        verdict.message
        == f"{PATH.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: {shown}: must be an integer"
    )


def test_an_unusable_maximum_is_reported() -> None:
    verdict = check(shoot(worker(maximum="4", autoPreserveFailedMachineMax=1)))
    assert "cannot be checked: maximum is not an integer" in verdict.message


@pytest.mark.parametrize("document", [{"name": "w"}, {"name": "w", "maximum": None}])
def test_an_absent_maximum_counts_as_zero(document: dict[str, Any]) -> None:
    denied = check(shoot({**document, "machineControllerManager": {"autoPreserveFailedMachineMax": 1}}))
    assert denied.message == (
        f"{PATH.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 1: must be less than or equal to maximum (0)"
    )
    assert check(shoot({**document, "machineControllerManager": {"autoPreserveFailedMachineMax": 0}})).allowed


@pytest.mark.parametrize("value", ["0", "-0", "0s", "1ns", "72h", "1h30m", "1.5h", "720h", "300ms"])
def test_valid_timeouts_pass(value: str) -> None:
    assert check(shoot(worker(machinePreserveTimeout=value))).allowed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1h", 'Invalid value: "-1h0m0s": must be greater than or equal to 0'),
        ("-1ns", 'Invalid value: "-1ns": must be greater than or equal to 0'),
        ("-999ns", 'Invalid value: "-999ns": must be greater than or equal to 0'),
        ("-0.5us", 'Invalid value: "-500ns": must be greater than or equal to 0'),
        ("720h0m0.000000001s", 'Invalid value: "720h0m0.000000001s": must be less than or equal to 720h0m0s'),
        ("721h", 'Invalid value: "721h0m0s": must be less than or equal to 720h0m0s'),
        ("3d", 'Invalid value: "3d": must be a duration such as "72h" (time: unknown unit "d" in duration "3d")'),
        ("", 'Invalid value: "": must be a duration such as "72h" (time: invalid duration "")'),
        ("72", 'Invalid value: "72": must be a duration such as "72h" (time: missing unit in duration "72")'),
        (72, 'Invalid value: 72: must be a duration string such as "72h"'),
    ],
)
def test_invalid_timeouts_are_denied(value: Any, message: str) -> None:
    verdict = check(shoot(worker(machinePreserveTimeout=value)))
    assert verdict.message == f"{PATH.format(0, 'machinePreserveTimeout')}: {message}"


def test_the_timeout_bound_is_configurable() -> None:
    tight = AdmissionSettings(max_preserve_timeout=dt.timedelta(hours=1))
    assert check(shoot(worker(machinePreserveTimeout="1h")), settings=tight).allowed
    assert (
        "must be less than or equal to 1h0m0s"
        in check(shoot(worker(machinePreserveTimeout="61m")), settings=tight).message
    )


def test_every_error_is_listed_at_once() -> None:
    verdict = check(
        shoot(
            worker("a", autoPreserveFailedMachineMax=9, machinePreserveTimeout="-1s"),
            worker("b"),
            worker("c", autoPreserveFailedMachineMax=-2),
        )
    )
    assert verdict.message.startswith("[")
    assert verdict.message.endswith("]")
    assert PATH.format(0, "autoPreserveFailedMachineMax") in verdict.message
    assert PATH.format(0, "machinePreserveTimeout") in verdict.message
    assert PATH.format(2, "autoPreserveFailedMachineMax") in verdict.message
    assert verdict.message.count("Invalid value") == 3


@pytest.mark.parametrize(
    ("value", "zones", "warning"),
    [
        (2, ["a", "b", "c"], "2 cannot be spread evenly over 3 zones; per zone: a=1, b=1, c=0"),
        (3, ["a", "b"], "3 cannot be spread evenly over 2 zones; per zone: a=2, b=1"),
        (4, ["a", "b"], None),
        (3, ["a"], None),
        (0, ["a", "b", "c"], None),
    ],
)
def test_uneven_spreads_are_warned_about(value: int, zones: list[str], warning: str | None) -> None:
    verdict = check(shoot(worker(maximum=10, zones=zones, autoPreserveFailedMachineMax=value)))
    assert verdict.allowed
    expected = () if warning is None else (f"{PATH.format(0, 'autoPreserveFailedMachineMax')}: {warning}",)
    assert verdict.warnings == expected


def test_warnings_come_with_denials_too() -> None:
    verdict = check(
        shoot(
            worker("a", maximum=10, zones=["x", "y"], autoPreserveFailedMachineMax=3),
            worker("b", autoPreserveFailedMachineMax=-1),
        )
    )
    assert not verdict.allowed
    assert len(verdict.warnings) == 1


def test_on_update_only_changed_workers_are_judged() -> None:
    bad = worker("a", autoPreserveFailedMachineMax=9)
    old = shoot(bad, worker("b"))
    assert check(shoot(bad, worker("b", maximum=5)), old).allowed  # "a" unchanged: not re-judged
    changed = check(shoot(bad, worker("b", autoPreserveFailedMachineMax=9)), old)
    assert not changed.allowed
    assert changed.message.startswith(PATH.format(1, "autoPreserveFailedMachineMax"))
    # a change of the pool's maximum re-judges the max against it
    assert not check(
        shoot(worker("a", maximum=3, autoPreserveFailedMachineMax=4)),
        shoot(worker("a", autoPreserveFailedMachineMax=4)),
    ).allowed
    # a renamed (new) worker is judged
    assert not check(shoot(worker("a2", autoPreserveFailedMachineMax=9)), old).allowed


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"spec": {"provider": {"workers": "x"}}}, 'spec.provider.workers: Invalid value: "x": must be a list'),
        ({"spec": {"provider": {"workers": [3]}}}, "spec.provider.workers[0]: Invalid value: 3: must be an object"),
        (
            shoot({"name": "w", "machineControllerManager": "x"}),
            'spec.provider.workers[0].machineControllerManager: Invalid value: "x": must be an object',
        ),
    ],
)
def test_malformed_worker_lists_are_field_errors(document: dict[str, Any], message: str) -> None:
    verdict = check(document)
    assert verdict.message == message


@pytest.mark.parametrize(
    "document", [{}, {"spec": {}}, {"spec": {"provider": {}}}, {"spec": 1}, shoot(), shoot(worker())]
)
def test_workerless_shoots_and_pools_without_settings_pass(document: dict[str, Any]) -> None:
    assert check(document).allowed


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
workers_strategy = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b", "c"]), "maximum": st.integers(0, 6) | json_values},
        optional={
            "zones": st.lists(st.sampled_from(["z1", "z2", "z3"]), max_size=3),
            "systemComponents": st.fixed_dictionaries({"allow": st.booleans()}),
            "machineControllerManager": st.fixed_dictionaries(
                {},
                optional={
                    "autoPreserveFailedMachineMax": st.integers(-3, 8) | json_values,
                    "machinePreserveTimeout": st.sampled_from(["1h", "-1h", "9999h", "x"]) | json_values,
                },
            )
            | json_values,
        },
    )
    | json_values,
    max_size=4,
)


@given(workers=workers_strategy, old_workers=workers_strategy)
def test_arbitrary_worker_lists_get_a_deterministic_answer(workers: list[Any], old_workers: list[Any]) -> None:
    new, old = shoot(*workers), shoot(*old_workers)
    first = check(new, old)
    assert first == check(new, old)
    if not first.allowed:
        assert first.message.startswith(("spec.provider.workers", "[spec.provider.workers"))
    names = [w.get("name") for w in workers if isinstance(w, dict)]
    if len(names) == len(workers) and len(set(names)) == len(names):
        assert check(new, new).allowed, "an UPDATE that changes no named worker judges nothing"


def _image(document: dict[str, Any], version: str) -> dict[str, Any]:
    return {**document, "machine": {"type": "m5.large", "image": {"name": "gardenlinux", "version": version}}}


def test_a_value_the_pool_already_had_never_blocks_maintenance() -> None:
    # Both values became invalid after they were set: the operator lowered maxPreserveTimeout to 24h, and the max
    # got in while the admission was down. An image update of the pool must still pass.
    lowered = AdmissionSettings(max_preserve_timeout=dt.timedelta(hours=24))
    pool = worker("a", autoPreserveFailedMachineMax=9, machinePreserveTimeout="72h")
    old = shoot(_image(pool, "1.0"), worker("b"))
    assert check(shoot(_image(pool, "1.1"), worker("b")), old, lowered).allowed
    # A changed setting of the same pool is still judged, and so is the other setting's bound.
    retimed = {
        **pool,
        "machineControllerManager": {**pool["machineControllerManager"], "machinePreserveTimeout": "48h"},
    }
    verdict = check(shoot(_image(retimed, "1.1"), worker("b")), old, lowered)
    assert not verdict.allowed
    assert verdict.message.startswith(PATH.format(0, "machinePreserveTimeout"))


@given(
    version=st.from_regex(r"[0-9]\.[0-9]{1,2}", fullmatch=True),
    value=st.integers(-3, 20),
    timeout=st.sampled_from(["1h", "-1s", "9999h", "x"]),
)
def test_maintenance_of_a_pool_is_judged_like_no_change(version: str, value: int, timeout: str) -> None:
    pool = worker("a", autoPreserveFailedMachineMax=value, machinePreserveTimeout=timeout)
    old = shoot(_image(pool, "0.1"))
    assert check(shoot(_image(pool, version)), old).allowed


def test_a_malformed_settings_block_the_pool_already_had_is_not_judged_again() -> None:
    pool = {"name": "a", "minimum": 1, "maximum": 0, "machineControllerManager": []}
    assert check(shoot(_image(pool, "1.1")), shoot(_image(pool, "1.0"))).allowed
    assert not check(shoot(_image(pool, "1.1")), shoot(worker("a"))).allowed
