"""The webhook-configuration builders: node rules narrowed and fail-open, the others as specified.

What the CEL expressions select is proven against the real API server in tests/integration/test_webhook.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.webhook_configurations import REGISTRY, shoot_path
from tests.webhook import configurations as c

CLIENT = c.ClientConfig(ca_bundle=b"CA", url="https://127.0.0.1:9443/")
SERVICE = c.ClientConfig(ca_bundle=b"CA", service_namespace="mp", service_name="webhook", service_port=443)
CONTROLLER = "system:serviceaccount:mp:controller"
MCM = ("system:serviceaccount:kube-system:machine-controller-manager",)


def test_client_config_by_url_or_service() -> None:
    assert CLIENT.for_path("/validate-shoot") == {"caBundle": "Q0E=", "url": "https://127.0.0.1:9443/validate-shoot"}
    assert SERVICE.for_path("/x") == {
        "caBundle": "Q0E=",
        "service": {"namespace": "mp", "name": "webhook", "port": 443, "path": "/x"},
    }


@pytest.mark.parametrize("builder", [c.node_preserve_annotation_webhook, c.node_ca_annotation_webhook])
def test_node_webhooks_never_block_nodes(builder: Callable[..., dict[str, Any]]) -> None:
    webhook = builder(client=CLIENT, controller_username=CONTROLLER, mcm_usernames=MCM)
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] <= 5
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"][0]["resources"] == ["nodes", "nodes/status"]
    names = [condition["name"] for condition in webhook["matchConditions"]]
    assert {"not-a-kubelet", "not-mcm-or-controller"} <= set(names)
    exclusion = next(m for m in webhook["matchConditions"] if m["name"] == "not-mcm-or-controller")["expression"]
    assert CONTROLLER in exclusion
    assert MCM[0] in exclusion
    with pytest.raises(ValueError, match="timeoutSeconds"):
        builder(client=CLIENT, controller_username=CONTROLLER, mcm_usernames=MCM, timeout_seconds=6)


def test_annotation_rules_watch_every_preserve_related_key() -> None:
    webhook = c.node_preserve_annotation_webhook(client=CLIENT, controller_username=CONTROLLER, mcm_usernames=MCM)
    expression = webhook["matchConditions"][0]["expression"]
    for key in (v.PRESERVE_ANNOTATION, *v.CONTROLLER_OWNED_ANNOTATIONS):
        assert f"'{key}'" in expression
    assert webhook["rules"][0]["operations"] == ["CREATE", "UPDATE"]


def test_machine_and_shoot_webhooks_fail_closed_by_default() -> None:
    machine = c.machine_preserve_annotation_webhook(client=SERVICE, controller_username=CONTROLLER)
    deletion = c.machine_deletion_webhook(client=SERVICE, mcm_usernames=MCM)
    shoot = c.shoot_webhook(client=SERVICE)
    assert [w["failurePolicy"] for w in (machine, deletion, shoot)] == ["Fail", "Fail", "Fail"]
    assert deletion["rules"][0]["operations"] == ["DELETE"]
    assert deletion["matchConditions"][0] == {
        "name": "deleted-by-mcm",
        "expression": f"request.userInfo.username in ['{MCM[0]}']",
    }
    # Only Failed machines and those carrying our record reach the guard: an outage never blocks MCM's deletes of
    # the healthy machines nobody preserves.
    failed = deletion["matchConditions"][1]
    assert failed["name"] == "machine-failed-or-preserved"
    assert "oldObject.status.currentStatus.phase == 'Failed'" in failed["expression"]
    for key in v.PRESERVATION_RECORD_ANNOTATIONS:
        assert f"'{key}' in oldObject.metadata.annotations" in failed["expression"]
    # Nor a machine Gardener marked for forced deletion (hibernation, shoot deletion): an outage never blocks those.
    assert deletion["matchConditions"][2] == {
        "name": "not-force-deletion",
        "expression": "!(oldObject != null && has(oldObject.metadata.labels) && 'force-deletion' in "
        "oldObject.metadata.labels && oldObject.metadata.labels['force-deletion'] == 'True')",
    }
    assert shoot["rules"][0]["apiGroups"] == ["core.gardener.cloud"]
    assert c.shoot_webhook(client=SERVICE, failure_policy="Ignore")["failurePolicy"] == "Ignore"


def test_cel_strings_are_quoted() -> None:
    expression = c.annotation_changed("it's")
    assert "'it\\'s'" in expression
    assert "'it's'" not in expression


def test_configurations_wrap_the_webhooks() -> None:
    webhook = c.shoot_webhook(client=CLIENT, namespace_selector={"matchLabels": {"a": "b"}})
    config = c.validating_configuration(name="mp", webhooks=[webhook], labels={"app": "mp"})
    assert config["kind"] == "ValidatingWebhookConfiguration"
    assert config["metadata"] == {"name": "mp", "labels": {"app": "mp"}}
    assert config["webhooks"][0]["namespaceSelector"] == {"matchLabels": {"a": "b"}}
    assert c.mutating_configuration(name="mp", webhooks=[])["kind"] == "MutatingWebhookConfiguration"


def _every_webhook(client: c.ClientConfig = SERVICE) -> list[dict[str, Any]]:
    """The six webhooks as the builders build them, in their configurations."""
    validating = c.validating_configuration(
        name="mp",
        webhooks=[
            c.node_preserve_annotation_webhook(client=client, controller_username=CONTROLLER, mcm_usernames=MCM),
            c.machine_preserve_annotation_webhook(client=client, controller_username=CONTROLLER),
            c.machine_deletion_webhook(client=client, mcm_usernames=MCM),
            c.shoot_webhook(client=client),
        ],
    )
    mutating = c.mutating_configuration(
        name="mp",
        webhooks=[
            c.node_ca_annotation_webhook(client=client, controller_username=CONTROLLER, mcm_usernames=MCM),
            c.node_mcm_marker_webhook(client=client, mcm_usernames=MCM),
        ],
    )
    return [validating, mutating]


def test_the_builders_build_every_registered_webhook_as_registered() -> None:
    documents = _every_webhook()
    assert c.registration_problems(documents) == []
    assert sorted(w["name"] for d in documents for w in d["webhooks"]) == sorted(r.name for r in REGISTRY)
    # A shoot's node webhooks call its own path prefix.
    shoot_client = c.ClientConfig(ca_bundle=b"CA", url=f"https://seed:443{shoot_path('shoot--p--s')}")
    node = c.node_preserve_annotation_webhook(client=shoot_client, controller_username=CONTROLLER, mcm_usernames=MCM)
    assert c.registration_problems([c.validating_configuration(name="mp", webhooks=[node])]) == []


def _changed(name: str, change: Callable[[dict[str, Any]], object], kind: str = "") -> list[dict[str, Any]]:
    documents = _every_webhook()
    for document in documents:
        for webhook in document["webhooks"]:
            if webhook["name"] == name:
                change(webhook)
                if kind:
                    document["kind"] = kind
    return documents


@pytest.mark.parametrize(
    ("name", "change", "problem"),
    [
        pytest.param(
            c.MACHINE_DELETION_WEBHOOK,
            lambda w: w["clientConfig"]["service"].update(path="/validate-machine"),
            "path '/validate-machine', registered '/validate-machine-deletion'",
            id="path",
        ),
        pytest.param(
            c.MACHINE_DELETION_WEBHOOK,
            lambda w: w["clientConfig"]["service"].update(path=shoot_path("ns", "/validate-machine-deletion")),
            "path '/shoots/ns/validate-machine-deletion'",
            id="a-machine-webhook-is-not-served-per-shoot",
        ),
        pytest.param(
            c.NODE_CA_WEBHOOK,
            lambda w: w.update(failurePolicy="Fail"),
            "failurePolicy 'Fail', registered 'Ignore'",
            id="policy",
        ),
        pytest.param(
            c.MACHINE_PRESERVE_WEBHOOK,
            lambda w: w["rules"][0].update(operations=["CREATE", "UPDATE", "DELETE"]),
            "rules",
            id="operations",
        ),
        pytest.param(
            c.NODE_PRESERVE_WEBHOOK,
            lambda w: w["rules"][0].update(resources=["nodes"]),
            "rules",
            id="resources",
        ),
        pytest.param(c.SHOOT_WEBHOOK, lambda w: w.update(timeoutSeconds=30), "timeoutSeconds 30", id="timeout"),
        pytest.param(c.SHOOT_WEBHOOK, lambda w: w.update(sideEffects="Some"), "sideEffects 'Some'", id="side-effects"),
        pytest.param(c.NODE_CA_WEBHOOK, lambda w: w.pop("reinvocationPolicy"), "reinvocationPolicy", id="reinvocation"),
        pytest.param(c.SHOOT_WEBHOOK, lambda w: w.update(name="other.example.com"), "not in the registry", id="name"),
    ],
)
def test_the_oracle_finds_every_difference_from_the_registry(
    name: str, change: Callable[[dict[str, Any]], object], problem: str
) -> None:
    problems = c.registration_problems(_changed(name, change))
    assert len(problems) == 1
    assert problem in problems[0]


def test_the_oracle_knows_validating_from_mutating_and_what_an_operator_may_choose() -> None:
    documents = _every_webhook()
    documents[0]["kind"] = "MutatingWebhookConfiguration"
    assert len(c.registration_problems(documents)) == 4
    ignored = _changed(c.MACHINE_DELETION_WEBHOOK, lambda w: w.update(failurePolicy="Ignore", timeoutSeconds=3))
    chosen = {c.MACHINE_DELETION_WEBHOOK: {"failurePolicy": "Ignore", "timeoutSeconds": 3}}
    assert c.registration_problems(ignored, chosen=chosen) == []
    never = {c.NODE_PRESERVE_WEBHOOK: {"failurePolicy": "Ignore"}}
    assert c.registration_problems(_every_webhook(), chosen=never) == [
        f"{c.NODE_PRESERVE_WEBHOOK}: a node webhook's failurePolicy is never the operator's to choose"
    ]
