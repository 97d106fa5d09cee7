"""Validation of the extension's providerConfig in a Shoot (core.admission.shoot): decoding errors, the pool
rules shared with the worker fields, conflicts between the two places, and what UPDATE judges."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.field_errors import root
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import provider_config_errors, validate_shoot
from machine_preservation.core.admission.verdict import Verdict
from machine_preservation.core.gardener.provider_config import (
    API_VERSION,
    EXTENSION_TYPE,
    KIND,
    InvalidPreservationConfig,
    parse_preservation_config,
)

SETTINGS = AdmissionSettings()
CONFIG = "spec.extensions[1].providerConfig"
WORKER = "spec.provider.workers[{}].machineControllerManager.{}"
ENTRY = CONFIG + ".workers[{}].{}"


def worker(name: str = "w", *, maximum: Any = 4, system: bool | None = False, **mcm: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"name": name, "minimum": 1, "maximum": maximum}
    if system is not None:
        document["systemComponents"] = {"allow": system}
    if mcm:
        document["machineControllerManager"] = mcm
    return document


def entry(name: str = "w", **settings: Any) -> dict[str, Any]:
    return {"name": name, **settings}


def config(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "workers": list(entries)}


def shoot(*workers: Any, provider_config: Any = None, disabled: bool | None = None) -> dict[str, Any]:
    """A Shoot with `workers` and the extension (second in spec.extensions) carrying `provider_config`."""
    ours: dict[str, Any] = {"type": EXTENSION_TYPE}
    if provider_config is not None:
        ours["providerConfig"] = provider_config
    if disabled is not None:
        ours["disabled"] = disabled
    spec = {"provider": {"type": "aws", "workers": list(workers)}, "extensions": [{"type": "shoot-dns-service"}, ours]}
    return {"metadata": {"name": "s"}, "spec": spec}


def check(new: dict[str, Any], old: dict[str, Any] | None = None, settings: AdmissionSettings = SETTINGS) -> Verdict:
    return validate_shoot(shoot=new, old_shoot=old, settings=settings)


def test_the_issue_example_passes() -> None:
    verdict = check(
        shoot(
            worker("worker1"),
            provider_config=config(entry("worker1", autoPreserveFailedMachineMax=1, machinePreserveTimeout="72h")),
        )
    )
    assert verdict.allowed, verdict.message
    assert verdict.warnings == ()


# --- Decoding ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider_config", "message"),
    [
        (
            config(entry("w", machinePreserveTimeout=72)),
            f'{ENTRY.format(0, "machinePreserveTimeout")}: Invalid value: 72: must be a duration string such as "72h"',
        ),
        (
            config(entry("w"), entry("w", autoPreserveFailedMachineMax=1)),
            f'{ENTRY.format(1, "name")}: Duplicate value: "w"',
        ),
        (
            {**config(), "kind": "WorkerConfig"},
            f'{CONFIG}.kind: Unsupported value: "WorkerConfig": supported values: "PreservationConfig"',
        ),
        (
            config(entry("w", preserveTimeout="1h")),
            f"{ENTRY.format(0, 'preserveTimeout')}: Forbidden: unknown field (known fields: name, "
            "autoPreserveFailedMachineMax, machinePreserveTimeout)",
        ),
        ("72h", f'{CONFIG}: Invalid value: "72h": must be an object'),
    ],
)
def test_a_provider_config_that_does_not_decode_is_denied_by_field_path(provider_config: Any, message: str) -> None:
    verdict = check(shoot(worker(), provider_config=provider_config))
    assert (verdict.allowed, verdict.code, verdict.message) == (False, 403, message)


def test_decoding_errors_come_with_the_worker_fields_errors() -> None:
    verdict = check(
        shoot(
            worker(autoPreserveFailedMachineMax=9),
            provider_config=config(entry("w", machinePreserveTimeout=1), entry("w")),
        )
    )
    assert verdict.message == (
        f"[{WORKER.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 9: must be less than or equal to "
        f"maximum (4), {ENTRY.format(0, 'machinePreserveTimeout')}: Invalid value: 1: must be a duration string "
        f'such as "72h", {ENTRY.format(1, "name")}: Duplicate value: "w"]'
    )


# --- The pool rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        (
            [worker("a"), worker("b")],
            f'{ENTRY.format(0, "name")}: Invalid value: "w": must name a worker pool of '
            "spec.provider.workers (pools: a, b)",
        ),
        (
            [],
            f'{ENTRY.format(0, "name")}: Invalid value: "w": must name a worker pool of spec.provider.workers '
            "(pools: none)",
        ),
    ],
)
def test_every_entry_must_name_a_pool_of_the_shoot(workers: list[dict[str, Any]], message: str) -> None:
    verdict = check(shoot(*workers, provider_config=config(entry("w", autoPreserveFailedMachineMax=1))))
    assert verdict.message == message


def test_a_workerless_shoot_without_entries_passes() -> None:
    assert check(shoot(provider_config=config())).allowed


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        (
            {"autoPreserveFailedMachineMax": 5},
            "autoPreserveFailedMachineMax",
            "Invalid value: 5: must be less than or equal to maximum (4)",
        ),
        (
            {"autoPreserveFailedMachineMax": -1},
            "autoPreserveFailedMachineMax",
            "Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            {"machinePreserveTimeout": "-1ns"},
            "machinePreserveTimeout",
            'Invalid value: "-1ns": must be greater than or equal to 0',
        ),
        (
            {"machinePreserveTimeout": "721h"},
            "machinePreserveTimeout",
            'Invalid value: "721h0m0s": must be less than or equal to 720h0m0s',
        ),
        (
            {"machinePreserveTimeout": "3d"},
            "machinePreserveTimeout",
            'Invalid value: "3d": must be a duration such as "72h" (time: unknown unit "d" in duration "3d")',
        ),
    ],
)
def test_the_values_follow_the_worker_field_rules(settings: dict[str, Any], field: str, message: str) -> None:
    in_config = check(shoot(worker(), provider_config=config(entry("w", **settings))))
    assert in_config.message == f"{ENTRY.format(0, field)}: {message}"
    in_worker = check(shoot(worker(**settings)))
    assert in_worker.message == f"{WORKER.format(0, field)}: {message}"


def test_the_timeout_bound_is_the_configured_one() -> None:
    tight = AdmissionSettings(max_preserve_timeout=dt.timedelta(hours=1))
    assert check(shoot(worker(), provider_config=config(entry(machinePreserveTimeout="1h"))), settings=tight).allowed
    denied = check(shoot(worker(), provider_config=config(entry(machinePreserveTimeout="61m"))), settings=tight)
    assert denied.message.endswith("must be less than or equal to 1h0m0s")


def test_the_max_is_judged_against_its_own_pool_with_system_components_and_zones() -> None:
    pools = [worker("a", maximum=2, system=None), {**worker("b", maximum=9), "zones": ["z1", "z2"]}]
    verdict = check(
        shoot(
            *pools,
            provider_config=config(
                entry("b", autoPreserveFailedMachineMax=3), entry("a", autoPreserveFailedMachineMax=2)
            ),
        )
    )
    assert verdict.message == (
        f"{ENTRY.format(1, 'autoPreserveFailedMachineMax')}: Invalid value: 2: must be less than or equal to "
        "maximum - 1 (1) when the pool allows system components (one machine must stay to run them)"
    )
    assert verdict.warnings == (
        f"{ENTRY.format(0, 'autoPreserveFailedMachineMax')}: 3 cannot be spread evenly over 2 zones; per zone: "
        "z1=2, z2=1",
    )


# --- Both places -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("own", "configured", "message"),
    [
        (
            {"autoPreserveFailedMachineMax": 1},
            {"autoPreserveFailedMachineMax": 2},
            f"{ENTRY.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 2: differs from "
            f"{WORKER.format(1, 'autoPreserveFailedMachineMax')} (1): set the pool's autoPreserveFailedMachineMax "
            "in one place only",
        ),
        (
            {"machinePreserveTimeout": "72h"},
            {"machinePreserveTimeout": "48h"},
            f'{ENTRY.format(0, "machinePreserveTimeout")}: Invalid value: "48h": differs from '
            f'{WORKER.format(1, "machinePreserveTimeout")} ("72h"): set the pool\'s machinePreserveTimeout in one '
            "place only",
        ),
        (
            {"autoPreserveFailedMachineMax": 0},
            {"autoPreserveFailedMachineMax": 1},
            f"{ENTRY.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 1: differs from "
            f"{WORKER.format(1, 'autoPreserveFailedMachineMax')} (0): set the pool's autoPreserveFailedMachineMax "
            "in one place only",
        ),
    ],
)
def test_a_pool_set_in_both_places_differently_is_denied_naming_both(
    own: dict[str, Any], configured: dict[str, Any], message: str
) -> None:
    verdict = check(shoot(worker("x"), worker("w", **own), provider_config=config(entry("w", **configured))))
    assert verdict.message == message


@pytest.mark.parametrize(
    ("own", "configured"),
    [
        ({"autoPreserveFailedMachineMax": 1}, {"autoPreserveFailedMachineMax": 1}),
        ({"machinePreserveTimeout": "72h"}, {"machinePreserveTimeout": "4320m"}),  # the same duration
        ({"machinePreserveTimeout": "0"}, {"machinePreserveTimeout": "0s"}),
        ({"autoPreserveFailedMachineMax": 1}, {"machinePreserveTimeout": "1h"}),  # different settings
        ({"machinePreserveTimeout": "1h"}, {"autoPreserveFailedMachineMax": 2}),
        ({}, {"autoPreserveFailedMachineMax": 2, "machinePreserveTimeout": "2h"}),
    ],
)
def test_equal_values_or_different_settings_in_both_places_pass(
    own: dict[str, Any], configured: dict[str, Any]
) -> None:
    verdict = check(shoot(worker(**own), provider_config=config(entry("w", **configured))))
    assert verdict.allowed, verdict.message


def test_a_value_that_is_no_duration_is_reported_alone_not_as_a_conflict() -> None:
    verdict = check(
        shoot(
            worker(autoPreserveFailedMachineMax=9, machinePreserveTimeout="3d"),
            provider_config=config(entry("w", autoPreserveFailedMachineMax=1, machinePreserveTimeout="1h")),
        )
    )
    # 9 is out of range, but a number all the same: that it differs from 1 is worth saying too.
    assert verdict.message == (
        f"[{WORKER.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 9: must be less than or equal to "
        f'maximum (4), {WORKER.format(0, "machinePreserveTimeout")}: Invalid value: "3d": must be a duration such '
        'as "72h" (time: unknown unit "d" in duration "3d"), '
        f"{ENTRY.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 1: differs from "
        f"{WORKER.format(0, 'autoPreserveFailedMachineMax')} (9): set the pool's autoPreserveFailedMachineMax in "
        "one place only]"
    )


# --- Which entry, and UPDATE -------------------------------------------------------------------------------


def test_a_disabled_extension_or_one_without_provider_config_is_not_judged() -> None:
    bad = config(entry("missing", autoPreserveFailedMachineMax=-1))
    assert check(shoot(worker(), provider_config=bad, disabled=True)).allowed
    assert check(shoot(worker())).allowed
    assert not check(shoot(worker(), provider_config=bad, disabled=False)).allowed


def test_only_what_changed_is_judged_on_update() -> None:
    legacy = config(entry("w", autoPreserveFailedMachineMax=9), entry("gone", machinePreserveTimeout="1h"))
    old = shoot(worker(), worker("other"), provider_config=legacy)
    # Another pool changed: the providerConfig's entries of unchanged pools are not judged again.
    assert check(shoot(worker(), worker("other", maximum=7), provider_config=legacy), old).allowed
    # Its pool changed: the entry is judged against the new pool.
    touched = check(shoot(worker(maximum=5), worker("other"), provider_config=legacy), old)
    assert touched.message == (
        f"{ENTRY.format(0, 'autoPreserveFailedMachineMax')}: Invalid value: 9: must be less than or equal to "
        "maximum (5)"
    )
    # The document changed: all of it is judged.
    changed = config(entry("w", autoPreserveFailedMachineMax=9), entry("gone", machinePreserveTimeout="2h"))
    verdict = check(shoot(worker(), worker("other"), provider_config=changed), old)
    assert verdict.message.count("Invalid value") == 2
    assert f'{ENTRY.format(1, "name")}: Invalid value: "gone"' in verdict.message


def test_removing_a_pool_the_provider_config_still_names_is_denied() -> None:
    settings = config(entry("w", autoPreserveFailedMachineMax=1), entry("other", autoPreserveFailedMachineMax=1))
    old = shoot(worker(), worker("other"), provider_config=settings)
    verdict = check(shoot(worker(), provider_config=settings), old)
    assert verdict.message == (
        f'{ENTRY.format(1, "name")}: Invalid value: "other": must name a worker pool of spec.provider.workers '
        "(pools: w)"
    )


def test_a_conflict_made_by_changing_the_worker_fields_is_denied() -> None:
    settings = config(entry("w", autoPreserveFailedMachineMax=1))
    old = shoot(worker(), provider_config=settings)
    verdict = check(shoot(worker(autoPreserveFailedMachineMax=2), provider_config=settings), old)
    assert "differs from spec.provider.workers[0].machineControllerManager.autoPreserveFailedMachineMax" in (
        verdict.message
    )


def test_an_undecodable_provider_config_is_judged_only_when_it_changes() -> None:
    broken = config(entry("w", machinePreserveTimeout=1))
    old = shoot(worker(), worker("other"), provider_config=broken)
    assert check(shoot(worker(maximum=6), worker("other"), provider_config=broken), old).allowed
    moved = {**shoot(worker(), worker("other"), provider_config=broken)}
    moved["spec"]["extensions"] = list(reversed(moved["spec"]["extensions"]))  # same document, other index
    assert check(moved, old).allowed
    assert not check(shoot(worker(), provider_config=config(entry("w", machinePreserveTimeout=2))), old).allowed


def test_enabling_the_extension_judges_its_provider_config() -> None:
    bad = config(entry("w", autoPreserveFailedMachineMax=-1))
    old = shoot(worker(), provider_config=bad, disabled=True)
    assert not check(shoot(worker(), provider_config=bad), old).allowed


# --- Properties --------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
pools = st.fixed_dictionaries(
    {"name": st.just("w"), "maximum": st.integers(0, 6)},
    optional={
        "zones": st.lists(st.sampled_from(["z1", "z2", "z3"]), max_size=3, unique=True),
        "systemComponents": st.fixed_dictionaries({"allow": st.booleans()}),
    },
)
values = st.fixed_dictionaries(
    {},
    optional={
        "autoPreserveFailedMachineMax": st.integers(-3, 8) | json_values,
        "machinePreserveTimeout": st.sampled_from(["1h", "-1h", "0", "9999h", "3d", "1h30m"]) | json_values,
    },
)


@given(pool=pools, settings=values)
def test_the_provider_config_is_judged_with_the_worker_fields_messages(
    pool: dict[str, Any], settings: dict[str, Any]
) -> None:
    """The same values in the pool's worker fields or in its providerConfig entry: the same verdict, the same
    messages and warnings but for the field path. A value of the wrong type stops the document's decoding
    first (as in Gardener): then its errors are among the worker fields' ones."""
    in_worker = check(shoot({**pool, "machineControllerManager": settings}))
    in_config = check(shoot(pool, provider_config=config(entry("w", **settings))))

    def placed(text: str) -> str:
        return text.replace(f"{CONFIG}.workers[0].", "spec.provider.workers[0].machineControllerManager.")

    try:
        parse_preservation_config(
            config(entry("w", **settings)), path=root("spec", "extensions").index(1).child("providerConfig")
        )
    except InvalidPreservationConfig as error:
        decoding_errors = [placed(e.render()) for e in error.errors]
    else:
        decoding_errors = []
    if decoding_errors:
        assert not in_config.allowed
        assert not in_worker.allowed
        assert all(e in in_worker.message for e in decoding_errors)
        return
    assert in_config.allowed == in_worker.allowed
    assert placed(in_config.message) == in_worker.message
    assert tuple(placed(w) for w in in_config.warnings) == in_worker.warnings


@given(
    pool=pools,
    own=st.fixed_dictionaries(
        {},
        optional={
            "autoPreserveFailedMachineMax": st.integers(0, 3),
            "machinePreserveTimeout": st.sampled_from(["1h", "60m", "2h"]),
        },
    ),
    configured=st.fixed_dictionaries(
        {},
        optional={
            "autoPreserveFailedMachineMax": st.integers(0, 3),
            "machinePreserveTimeout": st.sampled_from(["1h", "60m", "2h"]),
        },
    ),
)
def test_a_conflict_is_reported_exactly_for_each_setting_with_two_different_values(
    pool: dict[str, Any], own: dict[str, Any], configured: dict[str, Any]
) -> None:
    verdict = check(
        shoot({**pool, "maximum": 9, "machineControllerManager": own}, provider_config=config(entry("w", **configured)))
    )
    hours = {"1h": 1, "60m": 1, "2h": 2}
    expected = {
        key
        for key in own.keys() & configured.keys()
        if (hours.get(own[key], own[key]) != hours.get(configured[key], configured[key]))
    }
    reported = {
        key
        for key in ("autoPreserveFailedMachineMax", "machinePreserveTimeout")
        if re.search(rf"providerConfig\.workers\[0\]\.{key}: Invalid value: [^,]*: differs from ", verdict.message)
    }
    assert reported == expected
    assert verdict.allowed == (not expected)


# --- the seed's look at an Extension's providerConfig (provider_config_errors) -------------------------------


def _seed_errors(document: Any, the_shoot: dict[str, Any] | None) -> list[str]:
    return [
        error.render() for error in provider_config_errors(shoot=the_shoot, provider_config=document, settings=SETTINGS)
    ]


def test_the_seed_finds_what_the_admission_would_have_denied_named_by_the_shoots_fields() -> None:
    the_shoot = shoot(worker("w", maximum=4))
    assert (
        _seed_errors(config(entry("w", autoPreserveFailedMachineMax=1, machinePreserveTimeout="72h")), the_shoot) == []
    )
    [unknown] = _seed_errors(config(entry("x")), the_shoot)
    assert unknown.startswith(ENTRY.format(0, "name"))
    assert "pools: w" in unknown
    [timeout] = _seed_errors(config(entry("w", machinePreserveTimeout="three days")), the_shoot)
    assert timeout.startswith(ENTRY.format(0, "machinePreserveTimeout"))
    [maximum] = _seed_errors(config(entry("w", autoPreserveFailedMachineMax=9)), the_shoot)
    assert maximum.startswith(ENTRY.format(0, "autoPreserveFailedMachineMax"))
    [decoding] = _seed_errors({"apiVersion": API_VERSION, "kind": KIND, "workers": "w"}, the_shoot)
    assert decoding.startswith(f"{CONFIG}.workers")


def test_without_our_entry_in_the_shoot_the_paths_name_position_zero() -> None:
    # Auto-enabled: no entry in spec.extensions; the Shoot's pools still judge the document.
    auto_enabled = {"spec": {"provider": {"workers": [worker("w")]}}}
    assert _seed_errors(config(entry("w", machinePreserveTimeout="1h")), auto_enabled) == []
    [unknown] = _seed_errors(config(entry("x")), auto_enabled)
    assert unknown.startswith("spec.extensions[0].providerConfig.workers[0].name")
    # No Shoot in the Cluster: no pool is known.
    [unknown] = _seed_errors(config(entry("w")), None)
    assert "pools: none" in unknown
