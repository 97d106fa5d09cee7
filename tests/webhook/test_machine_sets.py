"""Turning the API server's MachineSet, Machine and MachineDeployment lists into the deletion guard's view."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.webhook import machine_sets
from machine_preservation.webhook.machine_sets import (
    BUSY_ATTEMPTS,
    BUSY_WAIT_MAX_SECONDS,
    SourceUnavailable,
    _patiently,
    view_from_lists,
)
from tests.webhook.reviews import machine, machine_set


def test_the_named_machine_set_with_all_machines_and_siblings() -> None:
    view = view_from_lists(
        name="ms",
        machine_sets=[machine_set("other"), machine_set("ms", max_=2)],
        machines=[machine("m1"), machine("m2")],
        machine_deployments=[{"metadata": {"name": "md"}, "spec": {"replicas": 4}}],
    )
    assert view is not None
    assert view.machine_set.metadata.name == "ms"
    assert view.machine_set.spec.auto_preserve_failed_machine_max == 2
    assert [m.metadata.name for m in view.machines] == ["m1", "m2"]
    assert [s.metadata.name for s in view.siblings] == ["other", "ms"]
    assert [(d.metadata.name, d.spec.replicas) for d in view.machine_deployments] == [("md", 4)]


def test_a_missing_machine_set_gives_no_view() -> None:
    assert view_from_lists(name="gone", machine_sets=[machine_set("ms")], machines=[]) is None


def test_objects_that_do_not_fit_the_models_are_reported_not_raised() -> None:
    broken = machine_set("ms")
    broken["spec"]["autoPreserveFailedMachineMax"] = "many"
    with pytest.raises(SourceUnavailable, match="unexpected object from the API server"):
        view_from_lists(name="ms", machine_sets=[broken], machines=[])
    with pytest.raises(SourceUnavailable, match="unexpected object from the API server"):
        view_from_lists(
            name="ms", machine_sets=[machine_set("ms")], machines=[], machine_deployments=[{"spec": {"replicas": "x"}}]
        )


def _busy(retry_after: str | None) -> ApiException:
    error = ApiException(status=429, reason="Too Many Requests")
    error.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return error


async def test_a_busy_api_server_is_asked_again_after_its_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(machine_sets.asyncio, "sleep", sleep)
    answers: list[object] = [_busy("0.5"), _busy("30"), {"items": []}, _busy("zero"), {"items": [1]}]
    calls = 0

    async def call() -> object:
        nonlocal calls
        calls += 1
        answer = answers.pop(0)
        if isinstance(answer, ApiException):
            raise answer
        return answer

    assert await _patiently(call) == {"items": []}
    assert await _patiently(call) == {"items": [1]}
    assert calls == 5
    # As asked, but never longer than the maximum; an unreadable Retry-After as the maximum.
    assert waits == [0.5, BUSY_WAIT_MAX_SECONDS, BUSY_WAIT_MAX_SECONDS]


async def test_a_busy_api_server_is_not_asked_forever_and_other_errors_not_again() -> None:
    calls = 0

    async def busy() -> object:
        nonlocal calls
        calls += 1
        raise _busy("0")

    with pytest.raises(ApiException):
        await _patiently(busy)
    assert calls == BUSY_ATTEMPTS

    async def forbidden() -> object:
        nonlocal calls
        calls += 1
        raise ApiException(status=403, reason="Forbidden")

    calls = 0
    with pytest.raises(ApiException):
        await _patiently(forbidden)
    assert calls == 1


def _not_found(body: str | None) -> ApiException:
    return ApiException(status=404, reason="Not Found", body=body)


def test_a_missing_extension_is_told_apart_from_a_missing_extension_kind() -> None:
    missing = (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"extensions.extensions.gardener'
        '.cloud \\"machine-preservation\\" not found","reason":"NotFound","details":{"name":"machine-preservation",'
        '"group":"extensions.gardener.cloud","kind":"extensions"},"code":404}'
    )
    assert machine_sets._object_missing(_not_found(missing))
    for no_kind in ("404 page not found\n", None, "[]", '{"details": "x"}', missing.replace('"extensions"}', '"x"}')):
        assert not machine_sets._object_missing(_not_found(no_kind))


async def test_outside_gardeners_extension_mode_no_extension_is_read(tmp_path: Path) -> None:
    source = machine_sets.KubernetesMachineSets(kubeconfig=tmp_path / "absent")  # any read would fail
    assert await source.read_extension(namespace="shoot--p--s") is None
    await source.close()
