"""POST /validate-preserve-annotation: every rule, positive and negative, over HTTP."""

from __future__ import annotations

import pytest

from machine_preservation.core import vocabulary as v
from tests.webhook.conftest import Webhook
from tests.webhook.reviews import ADMIN, CONTROLLER, MACHINE_KIND, MCM, NODE_KIND, machine, node, review

PATH = "/validate-preserve-annotation"
P = v.PRESERVE_ANNOTATION
SUPPORTED = 'supported values: "", "now", "when-failed", "false"'


@pytest.mark.parametrize("value", ["", "now", "when-failed", "false"])
@pytest.mark.parametrize("kind", ["node", "machine"])
async def test_user_values_are_allowed_on_nodes_and_machines(webhook: Webhook, value: str, kind: str) -> None:
    make, gvk = (node, NODE_KIND) if kind == "node" else (machine, MACHINE_KIND)
    for operation, old in (("CREATE", None), ("UPDATE", make())):
        body = review(kind=gvk, operation=operation, obj=make(annotations={P: value}), old=old)
        response = await webhook.review(PATH, body)
        assert response["allowed"] is True
        assert "status" not in response


@pytest.mark.parametrize(("kind", "shown"), [("node", 'Node "n1"'), ("machine", 'Machine "m1"')])
async def test_bad_values_are_denied_naming_object_annotation_value_and_allowed_values(
    webhook: Webhook, kind: str, shown: str
) -> None:
    make, gvk = (node, NODE_KIND) if kind == "node" else (machine, MACHINE_KIND)
    body = review(kind=gvk, operation="UPDATE", obj=make(annotations={P: "Now "}), old=make())
    response = await webhook.review(PATH, body)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    assert (
        response["status"]["message"] == f'{shown}: metadata.annotations[{P}]: Unsupported value: "Now ": {SUPPORTED}'
    )


@pytest.mark.parametrize("value", ["auto-preserve", "auto-preserved"])
async def test_the_auto_value_only_from_the_controller(webhook: Webhook, value: str) -> None:
    for username, allowed in ((CONTROLLER, True), (ADMIN, False), (MCM, False)):
        body = review(
            kind=MACHINE_KIND, operation="UPDATE", obj=machine(annotations={P: value}), old=machine(), username=username
        )
        response = await webhook.review(PATH, body)
        assert response["allowed"] is allowed, username
        if not allowed:
            assert (
                f'the value "{value}" is reserved for the preservation controller ({CONTROLLER})'
                in (response["status"]["message"])
            )


@pytest.mark.parametrize("key", v.CONTROLLER_OWNED_ANNOTATIONS)
async def test_controller_markers_only_from_the_controller(webhook: Webhook, key: str) -> None:
    for username, allowed in ((CONTROLLER, True), (ADMIN, False)):
        body = review(
            kind=NODE_KIND, operation="UPDATE", obj=node(annotations={key: "x"}), old=node(), username=username
        )
        assert (await webhook.review(PATH, body))["allowed"] is allowed
    removal = review(kind=NODE_KIND, operation="UPDATE", obj=node(), old=node(annotations={key: "x"}))
    response = await webhook.review(PATH, removal)
    assert response["allowed"] is False
    assert f"metadata.annotations[{key}]: Forbidden: only the preservation controller" in response["status"]["message"]


async def test_mcm_may_write_its_own_ca_marker(webhook: Webhook) -> None:
    marker = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    body = review(kind=NODE_KIND, operation="UPDATE", obj=node(annotations={marker: "true"}), old=node(), username=MCM)
    assert (await webhook.review(PATH, body))["allowed"] is True


async def test_only_the_controller_writes_our_ca_marker(webhook: Webhook) -> None:
    marker = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    for username, allowed in ((MCM, False), ("alice", False), (CONTROLLER, True)):
        body = review(
            kind=NODE_KIND, operation="UPDATE", obj=node(annotations={marker: "true"}), old=node(), username=username
        )
        assert (await webhook.review(PATH, body))["allowed"] is allowed, username


async def test_an_object_with_a_bad_value_can_still_be_updated_otherwise(webhook: Webhook) -> None:
    old = node(annotations={P: "garbage"})
    new = node(annotations={P: "garbage", "team": "sre"})
    assert (await webhook.review(PATH, review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old)))["allowed"]


async def test_every_broken_rule_is_listed(webhook: Webhook) -> None:
    new = node(annotations={P: "forever", v.LAST_MACHINE_PRIORITY_ANNOTATION: "3"})
    response = await webhook.review(PATH, review(kind=NODE_KIND, operation="UPDATE", obj=new, old=node()))
    message = response["status"]["message"]
    assert message.startswith('Node "n1": [')
    assert f"metadata.annotations[{P}]: Unsupported value" in message
    assert f"metadata.annotations[{v.LAST_MACHINE_PRIORITY_ANNOTATION}]: Forbidden" in message


async def test_dry_run_is_answered_exactly_like_a_real_request(webhook: Webhook) -> None:
    for value in ("now", "nope"):
        real = review(kind=NODE_KIND, operation="UPDATE", obj=node(annotations={P: value}), old=node(), uid="same")
        dry = review(
            kind=NODE_KIND, operation="UPDATE", obj=node(annotations={P: value}), old=node(), uid="same", dry_run=True
        )
        assert await webhook.review(PATH, real) == await webhook.review(PATH, dry)


async def test_status_subresource_updates_are_judged_the_same(webhook: Webhook) -> None:
    body = review(kind=NODE_KIND, operation="UPDATE", obj=node(annotations={P: "x"}), old=node(), sub_resource="status")
    assert (await webhook.review(PATH, body))["allowed"] is False


async def test_generated_names_are_shown_as_such(webhook: Webhook) -> None:
    new = machine(annotations={P: "x"})
    new["metadata"]["name"] = ""
    new["metadata"]["generateName"] = "pool-"
    response = await webhook.review(PATH, review(kind=MACHINE_KIND, operation="CREATE", obj=new))
    assert response["status"]["message"].startswith('Machine "pool-<generated>": ')


async def test_deletes_have_nothing_to_judge(webhook: Webhook) -> None:
    body = review(kind=NODE_KIND, operation="DELETE", old=node(annotations={P: "x"}))
    assert (await webhook.review(PATH, body))["allowed"] is True


async def test_denials_are_counted(webhook: Webhook) -> None:
    endpoint = PATH.lstrip("/")
    await webhook.review(PATH, review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={P: "x"})))
    await webhook.review(PATH, review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={P: "now"})))
    assert webhook.sample("machine_preservation_webhook_requests_total", endpoint=endpoint) == 2
    assert webhook.sample("machine_preservation_webhook_denials_total", endpoint=endpoint) == 1
    assert webhook.sample("machine_preservation_webhook_request_duration_seconds_count", endpoint=endpoint) == 2


async def test_denials_are_logged_with_uid_and_reason(webhook: Webhook, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="machine_preservation.webhook.app")
    body = review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={P: "x"}), uid="log-me")
    await webhook.review(PATH, body)
    await webhook.review(PATH, review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={P: "now"})))
    [record] = caplog.records
    assert record.getMessage().startswith('validate-preserve-annotation denied request log-me: Node "n1": ')
