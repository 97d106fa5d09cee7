"""The extension's providerConfig (core.provider_config): strict decoding with Kubernetes field errors, and
finding the enabled `machine-preservation` entry of a Shoot's `spec.extensions`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.field_errors import FieldError, root
from machine_preservation.core.gardener.provider_config import (
    API_VERSION,
    KIND,
    InvalidPreservationConfig,
    PreservationConfig,
    PreservationExtension,
    parse_preservation_config,
    preservation_extension,
)

BASE = root("spec", "extensions").index(2).child("providerConfig")
P = str(BASE)
KNOWN_WORKER_FIELDS = "known fields: name, autoPreserveFailedMachineMax, machinePreserveTimeout"


def document(*workers: Any, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "workers": list(workers), **extra}


def parse(raw: Any) -> PreservationConfig:
    return parse_preservation_config(raw, path=BASE)


def errors_of(raw: Any) -> list[str]:
    with pytest.raises(InvalidPreservationConfig) as caught:
        parse(raw)
    return [error.render() for error in caught.value.errors]


# --- Decoding ----------------------------------------------------------------------------------------------


def test_the_issue_example_decodes() -> None:
    config = parse(document({"name": "worker1", "autoPreserveFailedMachineMax": 1, "machinePreserveTimeout": "72h"}))
    worker = config.worker("worker1")
    assert worker is not None
    assert (worker.auto_preserve_failed_machine_max, worker.machine_preserve_timeout) == (1, "72h")
    assert config.worker("worker2") is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"apiVersion": API_VERSION, "kind": KIND}, []),
        (document(), []),
        ({**document(), "workers": None}, []),  # null is "not set", as Kubernetes decodes it
        (document({"name": "a"}), [("a", None, None)]),
        (
            document({"name": "a", "autoPreserveFailedMachineMax": None, "machinePreserveTimeout": None}),
            [("a", None, None)],
        ),
        (document({"name": "a", "autoPreserveFailedMachineMax": 0}), [("a", 0, None)]),
        # Values are judged against the Shoot later, not here: negative, huge, not a duration.
        (document({"name": "a", "autoPreserveFailedMachineMax": -1}), [("a", -1, None)]),
        (document({"name": "a", "autoPreserveFailedMachineMax": 2**40}), [("a", 2**40, None)]),
        (document({"name": "a", "machinePreserveTimeout": "3d"}), [("a", None, "3d")]),
        (
            document({"name": "a"}, {"name": "b", "machinePreserveTimeout": "1h"}),
            [("a", None, None), ("b", None, "1h")],
        ),
    ],
)
def test_valid_documents(raw: dict[str, Any], expected: list[tuple[str, int | None, str | None]]) -> None:
    config = parse(raw)
    assert [(w.name, w.auto_preserve_failed_machine_max, w.machine_preserve_timeout) for w in config.workers] == (
        expected
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("workers: []", [f'{P}: Invalid value: "workers: []": must be an object']),
        ([], [f"{P}: Invalid value: []: must be an object"]),
        ({}, [f"{P}.apiVersion: Required value", f"{P}.kind: Required value"]),
        (
            {"apiVersion": "machine-preservation.extensions.gardener.cloud/v1", "kind": KIND},
            [
                f'{P}.apiVersion: Unsupported value: "machine-preservation.extensions.gardener.cloud/v1": '
                f'supported values: "{API_VERSION}"'
            ],
        ),
        (
            {"apiVersion": API_VERSION, "kind": "Preservation"},
            [f'{P}.kind: Unsupported value: "Preservation": supported values: "PreservationConfig"'],
        ),
        (
            {"apiVersion": API_VERSION, "kind": 1},
            [f'{P}.kind: Unsupported value: 1: supported values: "PreservationConfig"'],
        ),
        (
            document(pools=[]),
            [f"{P}.pools: Forbidden: unknown field (known fields: apiVersion, kind, workers)"],
        ),
        ({**document(), "workers": {"name": "a"}}, [f'{P}.workers: Invalid value: {{"name":"a"}}: must be a list']),
        (document("a"), [f'{P}.workers[0]: Invalid value: "a": must be an object']),
        (document(None), [f"{P}.workers[0]: Invalid value: null: must be an object"]),
        (document({}), [f"{P}.workers[0].name: Required value"]),
        (document({"name": ""}), [f"{P}.workers[0].name: Required value"]),
        (document({"name": 7}), [f"{P}.workers[0].name: Invalid value: 7: must be a string"]),
        (
            document({"name": "a", "autoPreserveFailedMachinesMax": 1}),
            [f"{P}.workers[0].autoPreserveFailedMachinesMax: Forbidden: unknown field ({KNOWN_WORKER_FIELDS})"],
        ),
        (  # the Python name is no alias
            document({"name": "a", "auto_preserve_failed_machine_max": 1}),
            [f"{P}.workers[0].auto_preserve_failed_machine_max: Forbidden: unknown field ({KNOWN_WORKER_FIELDS})"],
        ),
        (
            document({"name": "a", "autoPreserveFailedMachineMax": "1"}),
            [f'{P}.workers[0].autoPreserveFailedMachineMax: Invalid value: "1": must be an integer'],
        ),
        (
            document({"name": "a", "autoPreserveFailedMachineMax": 1.0}),
            [f"{P}.workers[0].autoPreserveFailedMachineMax: Invalid value: 1.0: must be an integer"],
        ),
        (
            document({"name": "a", "autoPreserveFailedMachineMax": True}),
            [f"{P}.workers[0].autoPreserveFailedMachineMax: Invalid value: true: must be an integer"],
        ),
        (
            document({"name": "a", "machinePreserveTimeout": 72}),
            [f'{P}.workers[0].machinePreserveTimeout: Invalid value: 72: must be a duration string such as "72h"'],
        ),
        (
            document({"name": "a"}, {"name": "b"}, {"name": "a"}, {"name": "a"}),
            [f'{P}.workers[2].name: Duplicate value: "a"', f'{P}.workers[3].name: Duplicate value: "a"'],
        ),
    ],
)
def test_invalid_documents_name_every_bad_field(raw: Any, expected: list[str]) -> None:
    assert errors_of(raw) == expected


def test_every_error_at_once_and_the_message_aggregates_them() -> None:
    raw = {
        "apiVersion": API_VERSION,
        "kind": "Other",
        "workers": [{"name": "a", "machinePreserveTimeout": 1}, {"name": "a", "x": 1}],
    }
    with pytest.raises(InvalidPreservationConfig) as caught:
        parse(raw)
    assert str(caught.value) == (
        f'[{P}.kind: Unsupported value: "Other": supported values: "PreservationConfig", '
        f'{P}.workers[0].machinePreserveTimeout: Invalid value: 1: must be a duration string such as "72h", '
        f"{P}.workers[1].x: Forbidden: unknown field ({KNOWN_WORKER_FIELDS}), "
        f'{P}.workers[1].name: Duplicate value: "a"]'
    )


def test_absurd_nesting_is_an_error_not_a_crash() -> None:
    deep: Any = "x"
    for _ in range(30_000):  # far deeper than Python recurses, and within the document's bound of 64 KiB
        deep = [deep]
    assert errors_of(document({"name": "a", "machinePreserveTimeout": deep}))[0].startswith(
        f"{P}.workers[0].machinePreserveTimeout: Invalid value: "
    )
    for _ in range(70_000):  # beyond the bound: not decoded at all
        deep = [deep]
    assert errors_of(document({"name": "a", "machinePreserveTimeout": deep})) == [
        f"{P}: Too long: may not be more than 65536 bytes"
    ]


# --- Properties --------------------------------------------------------------------------------------------

names = st.text(alphabet="abc-1", min_size=1, max_size=4)
valid_workers = st.lists(
    st.builds(
        lambda name, maximum, timeout: {
            "name": name,
            **({} if maximum is None else {"autoPreserveFailedMachineMax": maximum}),
            **({} if timeout is None else {"machinePreserveTimeout": timeout}),
        },
        names,
        st.none() | st.integers(),
        st.none() | st.text(max_size=6),
    ),
    max_size=5,
    unique_by=lambda worker: worker["name"],
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=12,
)


@given(valid_workers)
def test_a_valid_document_keeps_every_value_as_written(workers: list[dict[str, Any]]) -> None:
    config = parse(document(*workers))
    assert [w.model_dump(by_alias=True, exclude_none=True) for w in config.workers] == workers


@given(st.lists(names, max_size=8))
def test_every_repeated_name_is_one_duplicate_error(pool_names: list[str]) -> None:
    raw = document(*({"name": name} for name in pool_names))
    repeats = len(pool_names) - len(set(pool_names))
    if not repeats:
        assert [w.name for w in parse(raw).workers] == pool_names
        return
    errors = errors_of(raw)
    assert len(errors) == repeats
    assert all(error.startswith(f"{P}.workers[") and "Duplicate value" in error for error in errors)


@given(
    json_values
    | st.fixed_dictionaries(
        {"apiVersion": st.sampled_from([API_VERSION, "v1"]), "kind": st.sampled_from([KIND, "X"])},
        optional={
            "workers": st.lists(st.dictionaries(st.sampled_from(["name", "x", "machinePreserveTimeout"]), json_values))
        },
    )
)
def test_any_json_decodes_or_fails_with_errors_under_the_path(raw: Any) -> None:
    errors: tuple[FieldError, ...] = ()
    try:
        parse(raw)
    except InvalidPreservationConfig as error:
        errors = error.errors
        assert errors, "a failure names at least one field"
    assert all(str(e.path).startswith(P) for e in errors)


# --- The Shoot's entry -------------------------------------------------------------------------------------


def shoot_with(extensions: Any) -> dict[str, Any]:
    return {"metadata": {"name": "s"}, "spec": {"extensions": extensions}}


CONFIG = document({"name": "a"})


@pytest.mark.parametrize(
    ("shoot", "expected"),
    [
        ({}, None),
        ("shoot", None),
        ({"spec": None}, None),
        (shoot_with(None), None),
        (shoot_with({"type": "machine-preservation"}), None),  # not a list
        (shoot_with([]), None),
        (shoot_with([{"type": "shoot-dns-service", "providerConfig": CONFIG}]), None),
        (shoot_with([{"type": "machine-preservation", "disabled": True, "providerConfig": CONFIG}]), None),
        (shoot_with([{"type": "machine-preservation"}]), PreservationExtension(0, None)),
        (shoot_with([{"type": "machine-preservation", "disabled": False}]), PreservationExtension(0, None)),
        (
            shoot_with(["x", {"type": "dns"}, {"type": "machine-preservation", "providerConfig": CONFIG}]),
            PreservationExtension(2, CONFIG),
        ),
        (  # the first enabled entry (Gardener allows one per type)
            shoot_with(
                [
                    {"type": "machine-preservation", "disabled": True, "providerConfig": {"old": 1}},
                    {"type": "machine-preservation", "providerConfig": CONFIG},
                    {"type": "machine-preservation", "providerConfig": {"later": 1}},
                ]
            ),
            PreservationExtension(1, CONFIG),
        ),
        # A non-boolean `disabled` is not `true`: the entry is enabled (the API server rejects it before us).
        (shoot_with([{"type": "machine-preservation", "disabled": "true"}]), PreservationExtension(0, None)),
    ],
)
def test_the_enabled_entry_of_the_shoot(shoot: Any, expected: PreservationExtension | None) -> None:
    assert preservation_extension(shoot) == expected


def test_the_entry_names_its_path() -> None:
    assert str(PreservationExtension(3, None).path) == "spec.extensions[3].providerConfig"
