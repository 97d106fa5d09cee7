"""An internal error is answered as the endpoint's failure policy says: Node requests are allowed with a
warning (node rules must never block kubelets); Machine and Shoot requests get HTTP 500, so that the API
server applies the rule's failurePolicy (Fail by default) instead of the webhook letting them through."""

from __future__ import annotations

from typing import Any

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core import webhook_configurations as registry
from machine_preservation.core.webhook_configurations import (
    CA_ANNOTATION_PATH,
    MACHINE_DELETION_PATH,
    PRESERVE_ANNOTATION_PATH,
    SHOOT_PATH,
)
from machine_preservation.webhook.app import (
    FAILURE_POLICIES,
    INTERNAL_ERROR_MESSAGE,
    INTERNAL_ERROR_WARNING,
    NODE,
    Endpoints,
    WebhookConfig,
    build_app,
    failure_policy,
)
from machine_preservation.webhook.metrics import WebhookMetrics
from machine_preservation.webhook.wire import AdmissionRequest
from tests.webhook import configurations as wc
from tests.webhook.conftest import NOW, SETTINGS, AiohttpClient, StaticMachineSets, Webhook
from tests.webhook.reviews import MACHINE_KIND, MCM, NODE_KIND, SHOOT_KIND, machine, node, review, shoot

P = v.PRESERVE_ANNOTATION
MACHINE, SHOOT = registry.MACHINE_DELETION.group_kind, registry.SHOOT.group_kind
CA_KEY = v.CA_SCALE_DOWN_DISABLED_ANNOTATION


async def _crash(_self: Endpoints, _request: AdmissionRequest) -> Any:
    raise RuntimeError("a bug")


@pytest.fixture
async def broken(aiohttp_client: AiohttpClient, monkeypatch: pytest.MonkeyPatch) -> Webhook:
    """The real app, with every endpoint's decision raising as a bug would."""
    for method in ("preserve_annotation", "ca_annotation", "machine_deletion", "shoot"):
        monkeypatch.setattr(Endpoints, method, _crash)
    machine_sets, metrics, readiness = StaticMachineSets(), WebhookMetrics(), [True]
    config = WebhookConfig(
        settings=SETTINGS, machine_sets=machine_sets, ready=lambda: True, metrics=metrics, clock=lambda: NOW
    )
    return Webhook(await aiohttp_client(build_app(config)), machine_sets, metrics, readiness)


NODE_REQUESTS = {
    "node preserve annotation": (
        PRESERVE_ANNOTATION_PATH,
        review(kind=NODE_KIND, operation="UPDATE", obj=node(annotations={P: "now"}), old=node()),
    ),
    "node CA annotation": (
        CA_ANNOTATION_PATH,
        review(
            kind=NODE_KIND,
            operation="UPDATE",
            obj=node(annotations={CA_KEY: "false"}, preserved="True"),
            old=node(annotations={CA_KEY: "true"}, preserved="True"),
        ),
    ),
}

FAILING_REQUESTS = {
    "machine preserve annotation": (
        PRESERVE_ANNOTATION_PATH,
        review(kind=MACHINE_KIND, operation="UPDATE", obj=machine(annotations={P: "now"}), old=machine()),
    ),
    "machine deletion": (
        MACHINE_DELETION_PATH,
        review(kind=MACHINE_KIND, operation="DELETE", old=machine(phase="Failed"), username=MCM),
    ),
    "shoot": (SHOOT_PATH, review(kind=SHOOT_KIND, operation="CREATE", obj=shoot())),
}


@pytest.mark.parametrize("case", NODE_REQUESTS)
async def test_a_node_request_is_allowed_with_a_warning(broken: Webhook, case: str) -> None:
    path, body = NODE_REQUESTS[case]
    response = await broken.review(path, body)
    assert response["allowed"] is True
    assert response["warnings"] == [INTERNAL_ERROR_WARNING]
    assert "patch" not in response
    assert broken.sample("machine_preservation_webhook_errors_total", endpoint=path[1:], kind="internal") == 1


@pytest.mark.parametrize("case", FAILING_REQUESTS)
async def test_a_machine_or_shoot_request_gets_a_500_so_that_the_failure_policy_applies(
    broken: Webhook, case: str
) -> None:
    path, body = FAILING_REQUESTS[case]
    status, answer = await broken.post(path, body)
    assert status == 500
    assert answer == {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": INTERNAL_ERROR_MESSAGE,
        "reason": "InternalError",
        "code": 500,
    }
    assert broken.sample("machine_preservation_webhook_errors_total", endpoint=path[1:], kind="internal") == 1
    assert broken.sample("machine_preservation_webhook_denials_total", endpoint=path[1:]) == 0


async def test_bad_input_is_still_a_400_not_an_internal_error(broken: Webhook) -> None:
    status, answer = await broken.post(SHOOT_PATH, {"kind": "AdmissionReview"})
    assert status == 400
    assert answer["response"]["allowed"] is False
    assert broken.sample("machine_preservation_webhook_errors_total", endpoint="validate-shoot", kind="internal") == 0


def test_an_unknown_kind_counts_as_a_node_where_nodes_are_served() -> None:
    assert failure_policy(PRESERVE_ANNOTATION_PATH, None) == "Ignore"
    assert failure_policy(CA_ANNOTATION_PATH, ("", "Pod")) == "Ignore"
    assert failure_policy(MACHINE_DELETION_PATH, None) == "Fail"
    assert failure_policy(SHOOT_PATH, ("", "Node")) == "Fail"
    assert failure_policy(PRESERVE_ANNOTATION_PATH, MACHINE) == "Fail"


def test_the_table_matches_the_registered_webhooks() -> None:
    """Each (path, kind) a webhook configuration sends here, with the failurePolicy it is registered with by
    default, is exactly the table the app answers internal errors by."""
    client = wc.ClientConfig(ca_bundle=b"ca", url="https://webhook")
    webhooks: list[dict[str, Any]] = [
        wc.node_preserve_annotation_webhook(client=client, controller_username="c", mcm_usernames=["m"]),
        wc.node_ca_annotation_webhook(client=client, controller_username="c", mcm_usernames=["m"]),
        wc.node_mcm_marker_webhook(client=client, mcm_usernames=["m"]),
        wc.machine_preserve_annotation_webhook(client=client, controller_username="c"),
        wc.machine_deletion_webhook(client=client, mcm_usernames=["m"]),
        wc.shoot_webhook(client=client),
    ]
    kinds = {("", "nodes"): NODE, (v.MACHINE_API_GROUP, "machines"): MACHINE, (v.SHOOT_API_GROUP, "shoots"): SHOOT}
    registered = {}
    for webhook in webhooks:
        path = webhook["clientConfig"]["url"].removeprefix("https://webhook")
        for rule in webhook["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    kind = kinds[(group, resource.split("/")[0])]
                    registered[(path, kind)] = webhook["failurePolicy"]
    assert registered == dict(FAILURE_POLICIES)
