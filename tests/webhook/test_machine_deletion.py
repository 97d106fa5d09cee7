"""POST /validate-machine-deletion: MCM may not delete preserved (or about to be) Failed machines."""

from __future__ import annotations

from machine_preservation.core import vocabulary as v
from tests.webhook.conftest import Webhook
from tests.webhook.reviews import ADMIN, CONTROLLER, MACHINE_KIND, MCM, machine, machine_set, review

PATH = "/validate-machine-deletion"
FUTURE = "2026-11-21T15:00:00Z"
PAST = "2026-11-21T11:00:00Z"


def delete(obj: dict[str, object], username: str = MCM) -> dict[str, object]:
    return review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=username)


async def test_mcm_is_denied_an_actively_preserved_failed_machine(webhook: Webhook) -> None:
    response = await webhook.review(PATH, delete(machine(phase="Failed", expiry=FUTURE)))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith('machine "m1" is Failed and preserved until 2026-11-21T15:00:00Z')
    assert f"annotate the machine (or its node) with {v.PRESERVE_ANNOTATION}=false" in message


async def test_users_and_the_controller_always_pass(webhook: Webhook) -> None:
    for username in (ADMIN, CONTROLLER):
        response = await webhook.review(PATH, delete(machine(phase="Failed", expiry=FUTURE), username))
        assert response["allowed"] is True


async def test_expired_or_healthy_machines_may_go(webhook: Webhook) -> None:
    assert (await webhook.review(PATH, delete(machine(phase="Failed", expiry=PAST))))["allowed"]
    assert (await webhook.review(PATH, delete(machine(phase="Running", expiry=FUTURE))))["allowed"]
    assert webhook.machine_sets.reads == []


async def test_pending_by_annotation_is_denied_without_reading(webhook: Webhook) -> None:
    for values in ({v.PRESERVE_ANNOTATION: "when-failed"}, {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now"}):
        response = await webhook.review(PATH, delete(machine("m1", values, phase="Failed")))
        assert response["allowed"] is False
        assert "about to be preserved" in response["status"]["message"]
    assert webhook.machine_sets.reads == []


async def test_pending_by_budget_reads_the_machine_set(webhook: Webhook) -> None:
    failed = machine(phase="Failed")
    webhook.machine_sets.machine_sets = [machine_set(max_=1)]
    webhook.machine_sets.machines = [failed, machine("m2")]
    response = await webhook.review(PATH, delete(failed))
    assert response["allowed"] is False
    assert 'about to be auto-preserved (MachineSet "ms" has room' in response["status"]["message"]
    assert webhook.machine_sets.reads == [("shoot--p--s", "ms")]


async def test_a_full_budget_or_no_machine_set_lets_mcm_delete(webhook: Webhook) -> None:
    failed = machine(phase="Failed")
    holder = machine("m0", {v.PRESERVE_ANNOTATION: "auto-preserve"}, phase="Failed", expiry=FUTURE)
    webhook.machine_sets.machine_sets = [machine_set(max_=1)]
    webhook.machine_sets.machines = [failed, holder]
    assert (await webhook.review(PATH, delete(failed)))["allowed"]
    webhook.machine_sets.machine_sets = []
    assert (await webhook.review(PATH, delete(failed)))["allowed"]


async def test_an_unreadable_machine_set_denies_mcm_with_503_and_counts_an_error(webhook: Webhook) -> None:
    webhook.machine_sets.failure = "connection refused"
    response = await webhook.review(PATH, delete(machine(phase="Failed")))
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert response["status"]["reason"] == "ServiceUnavailable"
    assert "connection refused; retry later" in response["status"]["message"]
    assert (
        webhook.sample(
            "machine_preservation_webhook_errors_total", endpoint="validate-machine-deletion", kind="upstream"
        )
        == 1
    )
    assert (await webhook.review(PATH, delete(machine(phase="Failed"), ADMIN)))["allowed"]


async def test_dry_run_deletes_are_judged_alike(webhook: Webhook) -> None:
    obj = machine(phase="Failed", expiry=FUTURE)
    real = review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=MCM, uid="u")
    dry = review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=MCM, uid="u", dry_run=True)
    assert await webhook.review(PATH, real) == await webhook.review(PATH, dry)


async def test_an_internal_error_is_a_500_so_that_the_failure_policy_applies(webhook: Webhook) -> None:
    webhook.machine_sets.crash = True
    body = delete(machine(phase="Failed"))
    status, answer = await webhook.post(PATH, body)
    assert (status, answer["reason"]) == (500, "InternalError")
    labels = {"endpoint": "validate-machine-deletion", "kind": "internal"}
    assert webhook.sample("machine_preservation_webhook_errors_total", **labels) == 1
