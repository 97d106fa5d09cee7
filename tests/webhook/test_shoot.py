"""POST /validate-shoot: worker preservation fields, field-error style, warnings, UPDATE scope."""

from __future__ import annotations

from typing import Any

import pytest

from machine_preservation.core.admission.verdict import deny
from machine_preservation.core.gardener.provider_config import API_VERSION, EXTENSION_TYPE, KIND
from tests.webhook.conftest import Webhook
from tests.webhook.reviews import SHOOT_KIND, review, shoot

PATH = "/validate-shoot"


def worker(name: str, maximum: int = 4, **mcm: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"name": name, "minimum": 1, "maximum": maximum, "systemComponents": {"allow": False}}
    if mcm:
        document["machineControllerManager"] = mcm
    return document


async def test_the_issue_example(webhook: Webhook) -> None:
    body = review(
        kind=SHOOT_KIND, operation="CREATE", obj=shoot(worker("a"), worker("b", autoPreserveFailedMachineMax=5))
    )
    response = await webhook.review(PATH, body)
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 403,
        "reason": "Forbidden",
        "message": "spec.provider.workers[1].machineControllerManager.autoPreserveFailedMachineMax: "
        "Invalid value: 5: must be less than or equal to maximum (4)",
    }


async def test_valid_settings_pass_and_uneven_zone_spreads_warn(webhook: Webhook) -> None:
    pool = {
        **worker("a", 10, autoPreserveFailedMachineMax=2, machinePreserveTimeout="48h"),
        "zones": ["z1", "z2", "z3"],
    }
    response = await webhook.review(PATH, review(kind=SHOOT_KIND, operation="CREATE", obj=shoot(pool)))
    assert response["allowed"] is True
    assert response["warnings"] == [
        "spec.provider.workers[0].machineControllerManager.autoPreserveFailedMachineMax: "
        "2 cannot be spread evenly over 3 zones; per zone: z1=1, z2=1, z3=0"
    ]


async def test_every_error_at_once(webhook: Webhook) -> None:
    obj = shoot(
        worker("a", autoPreserveFailedMachineMax=-1, machinePreserveTimeout="5d"),
        worker("b", machinePreserveTimeout="800h"),
    )
    response = await webhook.review(PATH, review(kind=SHOOT_KIND, operation="CREATE", obj=obj))
    message = response["status"]["message"]
    assert message.count("Invalid value") == 3
    assert "workers[0].machineControllerManager.autoPreserveFailedMachineMax: Invalid value: -1" in message
    assert 'workers[0].machineControllerManager.machinePreserveTimeout: Invalid value: "5d"' in message
    assert 'workers[1].machineControllerManager.machinePreserveTimeout: Invalid value: "800h0m0s"' in message


async def test_only_changed_workers_are_judged_on_update(webhook: Webhook) -> None:
    legacy = worker("a", autoPreserveFailedMachineMax=9)
    old = shoot(legacy, worker("b"))
    untouched = review(kind=SHOOT_KIND, operation="UPDATE", obj=shoot(legacy, worker("b", 6)), old=old)
    assert (await webhook.review(PATH, untouched))["allowed"] is True
    touched = review(kind=SHOOT_KIND, operation="UPDATE", obj=shoot({**legacy, "maximum": 5}, worker("b")), old=old)
    assert (await webhook.review(PATH, touched))["allowed"] is False


async def test_workerless_shoots_pass(webhook: Webhook) -> None:
    obj = {"apiVersion": "core.gardener.cloud/v1beta1", "kind": "Shoot", "metadata": {"name": "s"}, "spec": {}}
    assert (await webhook.review(PATH, review(kind=SHOOT_KIND, operation="CREATE", obj=obj)))["allowed"] is True


async def test_gardener_edge_cases_over_the_wire(webhook: Webhook) -> None:
    obj = shoot(
        worker("a", machinePreserveTimeout="-1ns"),
        worker("b", autoPreserveFailedMachineMax=2.0),
        {"name": "c", "machineControllerManager": {"autoPreserveFailedMachineMax": 1}},  # no maximum: 0
    )
    response = await webhook.review(PATH, review(kind=SHOOT_KIND, operation="CREATE", obj=obj))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        '[spec.provider.workers[0].machineControllerManager.machinePreserveTimeout: Invalid value: "-1ns": '
        "must be greater than or equal to 0, "
        "spec.provider.workers[1].machineControllerManager.autoPreserveFailedMachineMax: Invalid value: 2.0: "
        "must be an integer, "
        "spec.provider.workers[2].machineControllerManager.autoPreserveFailedMachineMax: Invalid value: 1: "
        "must be less than or equal to maximum (0)]"
    )


async def test_the_extension_provider_config_over_the_wire(webhook: Webhook) -> None:
    old = shoot(worker("a"))
    new = shoot(worker("a"))
    settings = {"apiVersion": API_VERSION, "kind": KIND, "workers": [{"name": "b", "machinePreserveTimeout": "1h"}]}
    new["spec"]["extensions"] = [{"type": EXTENSION_TYPE, "providerConfig": settings}]
    response = await webhook.review(PATH, review(kind=SHOOT_KIND, operation="UPDATE", obj=new, old=old))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        'spec.extensions[0].providerConfig.workers[0].name: Invalid value: "b": must name a worker pool of '
        "spec.provider.workers (pools: a)"
    )


async def test_a_provider_config_with_hundreds_of_errors_is_denied_and_logged_within_2_kib(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="machine_preservation.webhook.app")
    new = shoot(worker("a"))
    entry = {"name": "a", **{f"unknown{i}": "v" * 20 for i in range(300)}}
    new["spec"]["extensions"] = [
        {"type": EXTENSION_TYPE, "providerConfig": {"apiVersion": API_VERSION, "kind": KIND, "workers": [entry]}}
    ]
    body = review(kind=SHOOT_KIND, operation="CREATE", obj=new, uid="big")
    response = await webhook.review(PATH, body)
    message = response["status"]["message"]
    assert message.startswith("[spec.extensions[0].providerConfig.workers[0].unknown0: Forbidden: unknown field ")
    assert message.endswith(", ... and 290 more errors]")
    assert len(message.encode()) <= 2048
    [record] = caplog.records
    assert record.getMessage() == f"validate-shoot denied request big: {message}"


async def test_a_logged_denial_is_cut_to_2_kib_whatever_its_source(
    webhook: Webhook, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level("INFO", logger="machine_preservation.webhook.app")
    long = "spec.x: Forbidden: " + "y" * 100_000
    monkeypatch.setattr("machine_preservation.webhook.app.validate_shoot", lambda **_: deny(long))
    body = review(kind=SHOOT_KIND, operation="CREATE", obj=shoot(worker("a")), uid="long")
    response = await webhook.review(PATH, body)
    assert response["status"]["message"] == long  # the answer is the rule's; only the log is ours to bound
    [record] = caplog.records
    logged = record.getMessage().removeprefix("validate-shoot denied request long: ")
    assert len(logged.encode()) <= 2048
    assert logged.startswith("spec.x: Forbidden: yyy")
    assert logged.endswith("...[truncated]")
