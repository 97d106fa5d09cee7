"""The objects the extension puts into each shoot (core.shoot_resources) say what the standalone chart says:
the node annotation policy, the controller's RBAC on the target cluster and the node webhooks, rendered by
helm for the same identities."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from machine_preservation.core.gardener import shoot_resources as sr
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration.chart import find, template
from tests.webhook.configurations import registration_problems

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
URL = "https://mp-webhook.extension-mp.svc:443"


@pytest.fixture(scope="module")
def chart(toolchain: Toolchain) -> list[dict[str, Any]]:
    """The standalone chart registering node webhooks in a target cluster reached from elsewhere, with the
    extension's identities in the shoot."""
    return template(
        toolchain.helm,
        {
            "webhook.controllerUsername": f'"{sr.CONTROLLER_USERNAME}"',
            "webhook.mcmUsernames": f'["{sr.MCM_USERNAME}"]',
            "rbac.remoteIdentities.controller": f'"{sr.CONTROLLER_USERNAME}"',
            "webhooks.clientConfig.url": f'"{URL}"',
            "certificates.mode": '"provided"',
            "certificates.provided.secretName": '"tls"',
            "certificates.provided.caBundle": f'"{base64.b64encode(CA).decode()}"',
        },
    )


def test_node_annotation_policy_matches_the_chart(chart: list[dict[str, Any]]) -> None:
    policy, binding = sr.node_annotation_policy()
    rendered_policy = find(chart, "ValidatingAdmissionPolicy")
    rendered_binding = find(chart, "ValidatingAdmissionPolicyBinding")
    assert policy["spec"] == rendered_policy["spec"]
    assert binding["spec"]["validationActions"] == rendered_binding["spec"]["validationActions"]


def test_controller_rbac_matches_the_charts_remote_access(chart: list[dict[str, Any]]) -> None:
    objects = sr.rbac_objects()
    remote_role = next(d for d in chart if d["kind"] == "ClusterRole" and "-remote-controller" in d["metadata"]["name"])
    remote_events = next(
        d for d in chart if d["kind"] == "Role" and "-remote-controller-node-events" in d["metadata"]["name"]
    )
    remote_evidence = next(
        d for d in chart if d["kind"] == "Role" and "-remote-controller-evidence" in d["metadata"]["name"]
    )
    roles = {d["metadata"]["namespace"]: d for d in objects if d["kind"] == "Role"}
    assert find(objects, "ClusterRole")["rules"] == remote_role["rules"]
    assert roles[remote_events["metadata"]["namespace"]]["rules"] == remote_events["rules"]
    assert roles[remote_evidence["metadata"]["namespace"]]["rules"] == remote_evidence["rules"]
    assert set(roles) == {remote_events["metadata"]["namespace"], remote_evidence["metadata"]["namespace"]}


def test_node_webhooks_match_the_chart(chart: list[dict[str, Any]]) -> None:
    validating, mutating = sr.node_webhook_configurations(ca_bundle=CA, url=URL)
    assert registration_problems([validating, mutating]) == []
    # As every shoot's kube-apiserver calls them when one server serves the seed's shoots.
    per_shoot = sr.node_webhook_configurations(ca_bundle=CA, url=f"{URL}/shoots/shoot--p--s")
    assert registration_problems(per_shoot) == []
    ours = {hook["name"]: hook for config in (validating, mutating) for hook in config["webhooks"]}
    rendered = {
        hook["name"]: hook
        for config in chart
        if config["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
        for hook in config["webhooks"]
        if hook["name"] in ours
    }
    assert set(rendered) == set(ours)
    for name, hook in ours.items():
        assert hook == rendered[name], name
