"""The Helm chart rendered with helm v4: lint, schema, the registration rules (identical to the webhook's
own builder), RBAC, security settings, certificate modes, the three-cluster values, the seed setup (several
releases side by side, NetworkPolicies), and the Dockerfile."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from machine_preservation.cli.main import build_parser
from machine_preservation.core import vocabulary
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration.chart import CHART, NAMESPACE, find, helm, kinds, set_args, template, webhooks_by_name
from tests.webhook import configurations as builder

WEBHOOK = "mp-machine-preservation-webhook"
CONTROLLER = "mp-machine-preservation-controller"
CERTS = "mp-machine-preservation-certs"
CONTROLLER_USERNAME = f"system:serviceaccount:{NAMESPACE}:{CONTROLLER}"
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
SEED_MCM = "system:serviceaccount:shoot--p--s:machine-controller-manager"
CONFIGURATION = f"mp-machine-preservation.{NAMESPACE}"
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()

VALUE_SETS: dict[str, dict[str, str]] = {
    "default": {},
    "all-webhooks": {"webhooks.shoots.register": "true"},
    "cert-manager": {"certificates.mode": '"certManager"', "webhooks.shoots.register": "true"},
    "cert-manager-external-issuer": {
        "certificates.mode": '"certManager"',
        "certificates.certManager.issuerRef": json.dumps(
            {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        ),
    },
    "provided": {
        "certificates.mode": '"provided"',
        "certificates.provided.secretName": '"my-tls"',
        "certificates.provided.caBundle": json.dumps(CA_BUNDLE),
    },
    "remote-clusters": {
        "clusters.control.kubeconfigSecret": '"seed-kubeconfig"',
        "clusters.control.namespace": '"shoot--p--s"',
        "clusters.target.kubeconfigSecret": '"shoot-kubeconfig"',
        "clusters.garden.kubeconfigSecret": '"garden-kubeconfig"',
        "webhooks.nodes.register": "false",
        "webhooks.machines.register": "true",
        "certificates.selfManaged.remoteConfigurations": json.dumps(
            [
                {"cluster": "target", "kind": "validating", "name": "mp-machine-preservation"},
                {"cluster": "target", "kind": "mutating", "name": "mp-machine-preservation"},
                {"cluster": "garden", "kind": "validating", "name": "mp-machine-preservation"},
            ]
        ),
        "webhooks.clientConfig.url": '"https://mp.seed.example.com:443"',
        "webhook.mcmUsernames": json.dumps([SEED_MCM]),
    },
    # The documented Gardener install: in the seed, next to MCM in the shoot's namespace (the release
    # namespace), the shoot reached by kubeconfig, its node webhooks' caBundle injected from here.
    "seed": {
        "clusters.target.kubeconfigSecret": '"shoot-kubeconfig"',
        "webhooks.nodes.register": "false",
        "webhooks.clientConfig.url": '"https://mp.seed.example.com"',
        "certificates.selfManaged.remoteConfigurations": json.dumps(
            [
                {"cluster": "target", "kind": "validating", "name": "mp-machine-preservation.kube-system"},
                {"cluster": "target", "kind": "mutating", "name": "mp-machine-preservation.kube-system"},
            ]
        ),
        "webhook.mcmUsernames": json.dumps([SEED_MCM]),
        "networkPolicy.webhook.from": json.dumps([{"ipBlock": {"cidr": "10.250.0.0/16"}}]),
        "networkPolicy.metrics.scrapers": json.dumps(
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "garden"}}}]
        ),
        "controller.metricsLocalhostOnly": "true",
        "metrics.serviceMonitor.enabled": "true",
    },
    "native": {"mcmNativePreservation": "true", "maxPreserveTimeout": '"240h"'},
    "registration-only": {
        "webhook.enabled": "false",
        "controller.enabled": "false",
        "webhooks.clientConfig.url": '"https://mp.seed.example.com"',
        "webhook.controllerUsername": '"system:serviceaccount:kube-system:mp-controller"',
        "webhook.mcmUsernames": json.dumps([MCM, "system:serviceaccount:shoot--p--s:machine-controller-manager"]),
        "rbac.remoteIdentities.caBundleInjector": '"seed-webhook"',
        "rbac.remoteIdentities.controller": '"seed-controller"',
    },
    "monitoring": {
        "metrics.serviceMonitor.enabled": "true",
        "metrics.serviceMonitor.labels": '{"release": "prometheus"}',
        "metrics.serviceMonitor.interval": '"15s"',
        "networkPolicy.metrics.scrapers": json.dumps([{"podSelector": {"matchLabels": {"app": "prometheus"}}}]),
    },
    "monitoring-cert-manager": {
        "metrics.serviceMonitor.enabled": "true",
        "certificates.mode": '"certManager"',
        "networkPolicy.enabled": "false",
    },
    "customised": {
        "webhook.replicas": "3",
        "webhook.nodeSelector": '{"role": "system"}',
        "webhook.tolerations": '[{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}]',
        "controller.leaderElection.enabled": "false",
        "controller.machinePreserveTimeout": '"96h"',
        "webhooks.machines.failurePolicy": '"Ignore"',
        "webhooks.nodes.timeoutSeconds": "3",
        "webhooks.machines.namespaceSelector": '{"matchLabels": {"gardener.cloud/role": "shoot"}}',
        "image.tag": '"v9.9.9"',
    },
}


@pytest.fixture(scope="module")
def rendered(toolchain: Toolchain) -> dict[str, list[dict[str, Any]]]:
    return {name: template(toolchain.helm, values) for name, values in VALUE_SETS.items()}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(toolchain: Toolchain, name: str) -> None:
    result = helm(toolchain.helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *set_args(VALUE_SETS[name]))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "2"}, "additional properties 'replicaCount' not allowed"),
        ({"webhook.replica": "2"}, "additional properties 'replica' not allowed"),
        ({"certificates.selfManaged.caValidty": '"1h"'}, "additional properties 'caValidty' not allowed"),
        ({"webhooks.nodes.failurePolicy": '"Fail"'}, "additional properties 'failurePolicy' not allowed"),
        ({"webhook.replicas": '"two"'}, "got string, want integer"),
        ({"rbac.create": '"yes"'}, "got string, want boolean"),
        ({"certificates.mode": '"vault"'}, "value must be one of"),
        ({"webhooks.machines.failurePolicy": '"fail"'}, "value must be one of"),
        ({"webhooks.nodes.timeoutSeconds": "10"}, "maximum: got 10, want 5"),
        ({"controller.machinePreserveTimeout": '"3d"'}, "does not match pattern"),
        ({"certificates.selfManaged.servingRenewFraction": "1.5"}, "exclusiveMaximum"),
        ({"webhook.tolerations": '[{"key": "a", "operator": "Maybe"}]'}, "value must be one of"),
        ({"metrics.serviceMonitor.interval": '"30 seconds"'}, "does not match pattern"),
        ({"webhook.maxPreserveTimeout": '"720h"'}, "additional properties 'maxPreserveTimeout' not allowed"),
        ({"maxPreserveTimeout": '"30d"'}, "does not match pattern"),
        ({"mcmNativePreservation": '"yes"'}, "value must be one of"),
        ({"networkPolicy.webhook.from": "[{}]"}, "minProperties"),
        ({"networkPolicy.metrics.scrapers": '[{"ipBlock": {}}]'}, "missing property 'cidr'"),
        ({"controller.metricsLocalhostOnly": '"yes"'}, "got string, want boolean"),
        # The seed setup: MCM runs in the shoot's namespace, so its user names must be given.
        ({"clusters.target.kubeconfigSecret": '"shoot"'}, "at '/webhook/mcmUsernames': minItems: got 0, want 1"),
        (
            {
                "clusters.control.kubeconfigSecret": '"seed"',
                "webhook.mcmUsernames": "[]",
            },
            "at '/webhook/mcmUsernames': minItems: got 0, want 1",
        ),
        (
            {
                "certificates.selfManaged.remoteConfigurations": json.dumps(
                    [{"cluster": "target", "kind": "validating", "name": "x"}]
                )
            },
            "at '/webhook/mcmUsernames': minItems: got 0, want 1",
        ),
    ],
)
def test_schema_rejects_unknown_keys_and_wrong_types(
    toolchain: Toolchain, values: dict[str, str], message: str
) -> None:
    result = helm(toolchain.helm, "template", "mp", str(CHART), *set_args(values), check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"certificates.mode": '"provided"'}, "certificates.provided.secretName is required"),
        ({"webhook.enabled": "false"}, "webhooks.clientConfig.url is required"),
        (
            {
                "certificates.mode": '"provided"',
                "certificates.provided.secretName": '"my-tls"',
                "certificates.provided.caBundle": json.dumps(CA_BUNDLE),
                "metrics.serviceMonitor.enabled": "true",
            },
            "metrics.serviceMonitor.webhookTlsConfig is required with certificates.mode=provided",
        ),
        (
            {
                "certificates.selfManaged.remoteConfigurations": json.dumps(
                    [{"cluster": "garden", "kind": "validating", "name": "x"}]
                ),
                "webhook.mcmUsernames": json.dumps([SEED_MCM]),
            },
            "clusters.garden.kubeconfigSecret must be set",
        ),
        (
            {"metrics.serviceMonitor.enabled": "true"},
            "metrics.serviceMonitor.enabled with networkPolicy.enabled needs networkPolicy.metrics.scrapers",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(
    toolchain: Toolchain, values: dict[str, str], message: str
) -> None:
    result = helm(toolchain.helm, "template", "mp", str(CHART), *set_args(values), check=False)
    assert result.returncode != 0
    assert message in result.stderr


def _builder_webhooks(
    *,
    client: builder.ClientConfig,
    controller: str,
    mcm: list[str],
    nodes: bool,
    machines: bool,
    shoots: bool,
    node_timeout: int = 5,
    machine_policy: builder.FailurePolicy = "Fail",
    machine_namespace_selector: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    machine_namespace_selector = machine_namespace_selector or builder.control_namespace_selector(NAMESPACE)
    built = []
    if nodes:
        built += [
            builder.node_preserve_annotation_webhook(
                client=client, controller_username=controller, mcm_usernames=mcm, timeout_seconds=node_timeout
            ),
            builder.node_ca_annotation_webhook(
                client=client, controller_username=controller, mcm_usernames=mcm, timeout_seconds=node_timeout
            ),
            builder.node_mcm_marker_webhook(client=client, mcm_usernames=mcm, timeout_seconds=node_timeout),
        ]
    if machines:
        built += [
            builder.machine_preserve_annotation_webhook(
                client=client,
                controller_username=controller,
                failure_policy=machine_policy,
                namespace_selector=machine_namespace_selector,
            ),
            builder.machine_deletion_webhook(
                client=client,
                mcm_usernames=mcm,
                failure_policy=machine_policy,
                namespace_selector=machine_namespace_selector,
            ),
        ]
    if shoots:
        built.append(builder.shoot_webhook(client=client))
    return {webhook["name"]: webhook for webhook in built}


def _service_client(ca_bundle: bytes = b"") -> builder.ClientConfig:
    return builder.ClientConfig(
        ca_bundle=ca_bundle, service_namespace=NAMESPACE, service_name=WEBHOOK, service_port=443
    )


EXPECTED: dict[str, Any] = {
    "default": lambda: _builder_webhooks(
        client=_service_client(), controller=CONTROLLER_USERNAME, mcm=[MCM], nodes=True, machines=True, shoots=False
    ),
    "all-webhooks": lambda: _builder_webhooks(
        client=_service_client(), controller=CONTROLLER_USERNAME, mcm=[MCM], nodes=True, machines=True, shoots=True
    ),
    "provided": lambda: _builder_webhooks(
        client=_service_client(base64.b64decode(CA_BUNDLE)),
        controller=CONTROLLER_USERNAME,
        mcm=[MCM],
        nodes=True,
        machines=True,
        shoots=False,
    ),
    "registration-only": lambda: _builder_webhooks(
        client=builder.ClientConfig(ca_bundle=b"", url="https://mp.seed.example.com"),
        controller="system:serviceaccount:kube-system:mp-controller",
        mcm=[MCM, "system:serviceaccount:shoot--p--s:machine-controller-manager"],
        nodes=True,
        machines=True,
        shoots=False,
    ),
    "customised": lambda: _builder_webhooks(
        client=_service_client(),
        controller=CONTROLLER_USERNAME,
        mcm=[MCM],
        nodes=True,
        machines=True,
        shoots=False,
        node_timeout=3,
        machine_policy="Ignore",
        machine_namespace_selector=builder.control_namespace_selector(
            NAMESPACE, {"matchLabels": {"gardener.cloud/role": "shoot"}}
        ),
    ),
    "seed": lambda: _builder_webhooks(
        client=builder.ClientConfig(ca_bundle=b"", url="https://mp.seed.example.com"),
        controller=CONTROLLER_USERNAME,
        mcm=[SEED_MCM],
        nodes=False,
        machines=True,
        shoots=False,
    ),
    # MCM preserves natively: the same registrations (what the webhook lets through is decided in code).
    "native": lambda: _builder_webhooks(
        client=_service_client(), controller=CONTROLLER_USERNAME, mcm=[MCM], nodes=True, machines=True, shoots=False
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_chart_registers_exactly_what_the_webhook_builder_builds(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    """The chart's rules and matchConditions are the ones the webhook's tests exercise."""
    chart = webhooks_by_name(rendered[name])
    expected = EXPECTED[name]()
    if name != "provided":
        # Self-managed: the caBundle is injected at run time, the chart leaves it out.
        for webhook in expected.values():
            webhook["clientConfig"].pop("caBundle")
    assert sorted(chart) == sorted(expected)
    for webhook_name, webhook in expected.items():
        assert chart[webhook_name] == webhook, webhook_name


# What the value sets choose over the registry's defaults (webhooks.nodes.timeoutSeconds, .machines.failurePolicy).
CHOSEN: dict[str, builder.Chosen] = {
    "customised": {
        **{
            name: {"timeoutSeconds": 3}
            for name in (builder.NODE_PRESERVE_WEBHOOK, builder.NODE_CA_WEBHOOK, builder.NODE_MCM_MARKER_WEBHOOK)
        },
        **{
            name: {"failurePolicy": "Ignore"}
            for name in (builder.MACHINE_PRESERVE_WEBHOOK, builder.MACHINE_DELETION_WEBHOOK)
        },
    },
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_webhook_is_as_registered(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    """Path, rules, failurePolicy and the rest of each webhook as the registry the server serves by says."""
    assert builder.registration_problems(rendered[name], chosen=CHOSEN.get(name)) == []


def test_node_webhooks_can_never_block_nodes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, documents in rendered.items():
        for webhook in webhooks_by_name(documents).values():
            touches_nodes = any("nodes" in rule["resources"] for rule in webhook["rules"])
            if not touches_nodes:
                continue
            assert webhook["failurePolicy"] == "Ignore", name
            assert webhook["timeoutSeconds"] <= 5, name
            assert all("nodes/status" in rule["resources"] for rule in webhook["rules"]), name
            conditions = {c["name"]: c["expression"] for c in webhook["matchConditions"]}
            assert conditions["not-a-kubelet"] == "!('system:nodes' in request.userInfo.groups)"
            if webhook["name"] != builder.NODE_MCM_MARKER_WEBHOOK:
                assert MCM in conditions["not-mcm-or-controller"]
                continue
            # The one exception: only MCM's requests, and only those adding its marker to a node we preserve.
            assert set(conditions) == {"not-a-kubelet", "by-mcm", "mcm-marker-added", "preserved-by-the-controller"}
            assert MCM in _username_list(conditions["by-mcm"])


def _username_list(expression: str) -> list[str]:
    """The names in the first `request.userInfo.username in [...]` of a CEL expression."""
    found = re.search(r"request\.userInfo\.username in \[([^\]]*)\]", expression)
    assert found, expression
    return re.findall(r"'([^']*)'", found.group(1))


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_node_annotation_policy_wherever_node_webhooks_are_registered(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    """The auto value and the CA marker on Nodes are judged by a ValidatingAdmissionPolicy (CEL in the API
    server, never a call out), with the same identities as the node webhooks exclude; no node webhooks, no
    policy (a seed install registers them, and so the policy, in the shoot)."""
    documents = rendered[name]
    policies = [d for d in documents if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [d for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    node_webhook = webhooks_by_name(documents).get(builder.NODE_PRESERVE_WEBHOOK)
    if node_webhook is None:
        assert (policies, bindings) == ([], []), name
        return
    policy, binding = find(documents, "ValidatingAdmissionPolicy"), find(documents, "ValidatingAdmissionPolicyBinding")
    policy_name = f"mp-machine-preservation-node-annotations.{NAMESPACE}"
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == policy_name
    assert "namespace" not in policy["metadata"]
    assert policy["metadata"]["labels"]["app.kubernetes.io/instance"] == "mp"
    # No matchResources: the binding applies to every Node the policy matches.
    assert binding["spec"] == {"policyName": policy_name, "validationActions": ["Deny"]}

    spec = policy["spec"]
    assert spec["failurePolicy"] == "Ignore", "a CEL error never blocks a node"
    assert spec["matchConstraints"] == {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["nodes", "nodes/status"],
                "scope": "*",
            }
        ],
    }
    # Only requests changing one of the three annotations get as far as the validations (the webhook's own CEL).
    own_marker = vocabulary.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    assert spec["matchConditions"] == [
        {
            "name": "preserve-or-marker-changes",
            "expression": builder.any_annotation_changed(
                [vocabulary.PRESERVE_ANNOTATION, vocabulary.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION, own_marker]
            ),
        }
    ]
    auto, marker, ours = spec["validations"]
    for validation in (auto, marker, ours):
        assert validation["reason"] == "Forbidden"
    assert "'auto-preserve', 'auto-preserved'" in auto["expression"]
    assert "userInfo" not in auto["expression"], "nobody sets the auto value on a Node, the controller neither"
    assert auto["message"].startswith(f"metadata.annotations[{vocabulary.PRESERVE_ANNOTATION}]: Forbidden: ")
    assert '"", "now", "when-failed", "false"' in auto["message"]
    assert marker["message"].startswith(
        f"metadata.annotations[{vocabulary.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION}]: "
    )
    assert marker["expression"].endswith(
        f"|| !{builder.annotation_changed(vocabulary.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION)}"
    )

    # The controller and MCM: the very names the node webhooks exclude (the same values).
    allowed = _username_list(marker["expression"])
    excluded = {c["name"]: c["expression"] for c in node_webhook["matchConditions"]}["not-mcm-or-controller"]
    assert allowed == _username_list(excluded)
    controller = (
        "system:serviceaccount:kube-system:mp-controller" if name == "registration-only" else CONTROLLER_USERNAME
    )
    mcm = [MCM, SEED_MCM] if name == "registration-only" else [MCM]
    assert allowed == sorted([controller, *mcm])
    assert all(user in marker["message"] for user in allowed)
    # Our own marker: the controller alone.
    assert ours["message"].startswith(f"metadata.annotations[{own_marker}]: Forbidden: ")
    assert ours["expression"].endswith(f"|| !{builder.annotation_changed(own_marker)}")
    assert _username_list(ours["expression"]) == [controller]


def test_webhook_configurations_are_plain_release_resources(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """No Helm hooks anywhere: `helm uninstall` removes every object, webhook configurations included."""
    for documents in rendered.values():
        for document in documents:
            assert "helm.sh/hook" not in (document["metadata"].get("annotations") or {}), document["metadata"]["name"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_metrics_services_and_service_monitors(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = rendered["default"]
    assert "ServiceMonitor" not in kinds(default), "off by default: the CRD may not exist"
    controller = find(default, "Deployment", CONTROLLER)
    metrics = find(default, "Service", f"{CONTROLLER}-metrics")
    pod_labels = controller["spec"]["template"]["metadata"]["labels"]
    assert _selects(metrics["spec"]["selector"], pod_labels)
    port = controller["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": port["containerPort"], "targetPort": "metrics", "protocol": "TCP"}
    ]

    documents = rendered["monitoring"]
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    monitors = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {CONTROLLER, WEBHOOK}
    for monitor in monitors.values():
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        chosen = [
            name
            for name, svc in services.items()
            if _selects(monitor["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        ]
        expected = f"{CONTROLLER}-metrics" if monitor["metadata"]["name"] == CONTROLLER else WEBHOOK
        assert chosen == [expected], "each ServiceMonitor selects exactly its component's Service"
    assert monitors[CONTROLLER]["spec"]["endpoints"][0]["port"] == "metrics"
    webhook = monitors[WEBHOOK]["spec"]["endpoints"][0]
    assert (webhook["port"], webhook["scheme"]) == ("https", "https")
    assert webhook["tlsConfig"] == {
        "ca": {"secret": {"name": f"{WEBHOOK}-certs", "key": "ca-bundle.crt"}},
        "serverName": f"{WEBHOOK}.{NAMESPACE}.svc",
    }, "verified against the self-managed CA bundle, never insecureSkipVerify"
    cert_manager = find(rendered["monitoring-cert-manager"], "ServiceMonitor", WEBHOOK)["spec"]["endpoints"][0]
    secret = find(rendered["monitoring-cert-manager"], "Certificate", WEBHOOK)["spec"]["secretName"]
    assert cert_manager["tlsConfig"]["ca"] == {"secret": {"name": secret, "key": "ca.crt"}}


def test_default_install_shape(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["default"]
    webhook = find(documents, "Deployment", WEBHOOK)
    assert webhook["spec"]["replicas"] >= 2
    pdb = find(documents, "PodDisruptionBudget", WEBHOOK)
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == webhook["spec"]["selector"]["matchLabels"]
    service = find(documents, "Service", WEBHOOK)
    assert service["spec"]["selector"] == webhook["spec"]["template"]["metadata"]["labels"]
    pod = webhook["spec"]["template"]["spec"]
    server = next(c for c in pod["containers"] if c["name"] == "webhook")
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert server["ports"] == [{"name": "https", "containerPort": 10250, "protocol": "TCP"}]
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    # Self-managed certificates: the certs manager's own Deployment and ServiceAccount keep the Secret with
    # the CA key and publish the serving pair; the webhook pods mount only that pair.
    assert "initContainers" not in pod
    assert [c["name"] for c in pod["containers"]] == ["webhook"]
    assert {
        "name": "certs",
        "secret": {
            "secretName": f"{WEBHOOK}-tls",
            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
        },
    } in pod["volumes"]
    certs = find(documents, "Deployment", CERTS)
    certs_pod = certs["spec"]["template"]["spec"]
    assert certs_pod["serviceAccountName"] == CERTS != pod["serviceAccountName"]
    assert [c["name"] for c in certs_pod["containers"]] == ["certs"]
    assert certs_pod["containers"][0]["args"][1:3] == ["certs", "run"]
    assert not [v for v in certs_pod.get("volumes", []) if "secret" in v], "it reads its Secrets through the API"
    assert find(documents, "ServiceAccount", CERTS)
    for name in (f"{WEBHOOK}-certs", f"{WEBHOOK}-tls"):
        assert "data" not in find(documents, "Secret", name), "rendered empty: Helm never touches the certificates"
    controller = find(documents, "Deployment", CONTROLLER)
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--log-level=INFO", "controller"]
    assert f"--namespace={NAMESPACE}" in args
    assert "--leader-elect" in args
    assert not [a for a in args if "kubeconfig" in a], "in-cluster by default"
    controller_container = controller["spec"]["template"]["spec"]["containers"][0]
    assert controller_container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert controller_container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    for configuration in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in find(documents, configuration)["webhooks"]:
            assert "caBundle" not in hook["clientConfig"]


def _containers(documents: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    pods = [d["spec"]["template"]["spec"] for d in documents if d["kind"] == "Deployment"]
    return [(pod, c) for pod in pods for c in [*pod.get("initContainers", []), *pod["containers"]]]


def test_every_container_is_locked_down(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, documents in rendered.items():
        for pod, container in _containers(documents):
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert context["allowPrivilegeEscalation"] is False
            assert context["privileged"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]["memory"], (name, container["name"])


def test_every_container_has_a_writable_temporary_directory(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The root filesystem is read-only, but the kubernetes client writes a kubeconfig's embedded certificates to
    temporary files: TMPDIR names an emptyDir (in memory, small) every container mounts."""
    for name, documents in rendered.items():
        for pod, container in _containers(documents):
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert env.get("TMPDIR") in mounts, (name, container["name"])
            volume = volumes[mounts[env["TMPDIR"]]]
            assert volume["emptyDir"]["medium"] == "Memory", "keys in temporary files stay off the node's disk"
            assert volume["emptyDir"]["sizeLimit"], (name, container["name"])


def test_the_webhook_identity_holds_no_key_material_in_any_install(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Whatever the values: no rule bound to the webhook's ServiceAccount reaches Secrets or webhook
    configurations (the API server's own verdict on these rules: test_chart_certs_identity.py)."""
    for name, documents in rendered.items():
        roles = {(d["kind"], d["metadata"]["name"]): d for d in documents if d["kind"] in ("Role", "ClusterRole")}
        for binding in (d for d in documents if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            if not any(s.get("name") == WEBHOOK for s in binding["subjects"]):
                continue
            role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            resources = {r for rule in role["rules"] for r in rule["resources"]}
            forbidden = {"secrets", "validatingwebhookconfigurations", "mutatingwebhookconfigurations"}
            assert not resources & forbidden, (name, role["metadata"]["name"])


def _rules(documents: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str, str]]:
    role = find(documents, kind, name)
    return {
        (group, resource, verb, ",".join(rule.get("resourceNames", [])))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _expand(group: str, resources: str, verbs: str, names: str = "") -> set[tuple[str, str, str, str]]:
    return {(group, r, v, names) for r in resources.split() for v in verbs.split()}


def _unique(name: str) -> str:
    """The chart's name for an object outside the release namespace."""
    return f"{name}.{NAMESPACE}"


def test_rbac_grants_exactly_the_verbs_used(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["default"]
    machine = "machine.sapcloud.io"
    assert _rules(documents, "Role", _unique(f"{CONTROLLER}-control")) == (
        _expand(machine, "machines", "list watch patch delete")
        | _expand(machine, "machinesets machinedeployments", "list watch")
        | _expand(machine, "machines/status machinesets/status machinedeployments/status", "patch")
        | _expand("", "events", "create get patch")
        | _expand("apps", "deployments", "get", "machine-controller-manager")
        # The Lease by name; create cannot be limited by name.
        | _expand("coordination.k8s.io", "leases", "get update", "machine-preservation-controller")
        | _expand("coordination.k8s.io", "leases", "create")
    )
    assert _rules(documents, "ClusterRole", _unique(f"{CONTROLLER}-target")) == (
        _expand("", "nodes", "get list watch patch")
        | _expand("", "nodes/status", "patch")
        | _expand("", "pods", "list watch")
        | _expand("", "pods/eviction", "create")
        | _expand("policy", "poddisruptionbudgets", "list")
    )
    node_events = find(documents, "Role", _unique(f"{CONTROLLER}-node-events"))
    assert node_events["metadata"]["namespace"] == "default"
    assert _rules(documents, "Role", _unique(f"{CONTROLLER}-node-events")) == _expand(
        "", "events", "create get list patch"
    )
    # The evidence of a failure (controller/preservation/evidence.py), in the target cluster's kube-system.
    evidence = find(documents, "Role", _unique(f"{CONTROLLER}-evidence"))
    assert evidence["metadata"]["namespace"] == "kube-system"
    assert _rules(documents, "Role", _unique(f"{CONTROLLER}-evidence")) == _expand(
        "", "configmaps", "create delete get list patch"
    )
    # MCM's generation: its Deployment (above), its Machine and MachineSet CRDs; the controller and the webhook
    # each decide at start.
    # The controller also reads whether Gardener's Cluster CRD is there (then it watches the Cluster).
    crds = "machines.machine.sapcloud.io,machinesets.machine.sapcloud.io"
    for component, names in ((CONTROLLER, f"{crds},clusters.extensions.gardener.cloud"), (WEBHOOK, crds)):
        assert _rules(documents, "ClusterRole", _unique(f"{component}-crd")) == _expand(
            "apiextensions.k8s.io", "customresourcedefinitions", "get", names
        )
    # Gardener's Cluster resource is cluster-scoped and named after the control namespace: that one only.
    assert _rules(documents, "ClusterRole", _unique(f"{CONTROLLER}-gardener-cluster")) == _expand(
        "extensions.gardener.cloud", "clusters", "get list watch", NAMESPACE
    )
    # The webhook's deletion guard caches them (list and watch), never reading per review.
    assert _rules(documents, "ClusterRole", _unique(f"{WEBHOOK}-gardener-cluster")) == _expand(
        "extensions.gardener.cloud", "clusters", "list watch", NAMESPACE
    )
    assert _rules(documents, "Role", _unique(f"{WEBHOOK}-control")) == (
        _expand(machine, "machines machinesets machinedeployments", "list watch")
        | _expand("apps", "deployments", "get", "machine-controller-manager")
    )
    assert _rules(documents, "Role", CERTS) == _expand("", "secrets", "get patch", f"{WEBHOOK}-certs,{WEBHOOK}-tls")
    assert _rules(documents, "ClusterRole", _unique(f"{CERTS}-cabundle")) == _expand(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations mutatingwebhookconfigurations",
        "get patch",
        CONFIGURATION,
    )
    bindings = [d for d in documents if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    roles = [d for d in documents if d["kind"] in ("Role", "ClusterRole")]
    assert sorted(b["roleRef"]["name"] for b in bindings) == sorted(r["metadata"]["name"] for r in roles)
    for binding in bindings:
        role = binding["roleRef"]["name"]
        component = next(
            c for c in ("controller", "webhook", "certs") if role.startswith(f"mp-machine-preservation-{c}")
        )
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"mp-machine-preservation-{component}", "namespace": NAMESPACE}
        ]


def _outside_the_release_namespace(documents: list[dict[str, Any]], namespace: str) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of every object that another release, in another namespace, could also create."""
    return {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for d in documents
        if d["metadata"].get("namespace", "") != namespace
    }


@pytest.mark.parametrize("name", ["default", "all-webhooks", "seed", "registration-only"])
def test_releases_side_by_side_never_share_an_object(toolchain: Toolchain, name: str) -> None:
    """The same release name in two namespaces (a seed: one release per shoot namespace), and two releases in
    one namespace: no cluster-scoped object, and nothing in `default`, has the same name."""
    values = dict(VALUE_SETS[name])
    installs = [("mp", "shoot--a--one"), ("mp", "shoot--a--one-b"), ("other", "shoot--a--one")]
    seen: dict[tuple[str, str, str], tuple[str, str]] = {}
    for release, namespace in installs:
        documents = template(toolchain.helm, values, namespace=namespace, release=release)
        outside = _outside_the_release_namespace(documents, namespace)
        assert {kind for kind, _, _ in outside} >= {"ValidatingWebhookConfiguration", "ClusterRole"}
        for key in outside:
            assert key not in seen, f"{key} of {release}/{namespace} also rendered by {seen[key]}"
            seen[key] = (release, namespace)


def test_certs_manager_injects_exactly_the_configurations_it_may_patch(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    documents = rendered["default"]
    names = {d["metadata"]["name"] for d in documents if d["kind"].endswith("WebhookConfiguration")}
    assert names == {CONFIGURATION}
    certs = [c for _, c in _containers(documents) if c["args"][1:3] == ["certs", "run"]]
    assert certs
    for container in certs:
        targets = {a.split("=", 1)[1] for a in container["args"] if a.startswith("--webhook-configuration=")}
        assert targets == {f"validating/{CONFIGURATION}", f"mutating/{CONFIGURATION}"}
    granted = {rule[3] for rule in _rules(documents, "ClusterRole", _unique(f"{CERTS}-cabundle"))}
    assert granted == {CONFIGURATION}


@pytest.mark.parametrize(
    ("name", "namespace"), [("default", NAMESPACE), ("seed", NAMESPACE), ("remote-clusters", "shoot--p--s")]
)
def test_machine_webhooks_judge_only_the_control_namespace(
    rendered: dict[str, list[dict[str, Any]]], name: str, namespace: str
) -> None:
    machine_hooks = [
        hook
        for hook in webhooks_by_name(rendered[name]).values()
        if any("machines" in rule["resources"] for rule in hook["rules"])
    ]
    assert machine_hooks
    for hook in machine_hooks:
        assert hook["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == namespace, hook["name"]


def test_deletion_guard_is_only_called_for_mcms_deletes_of_failed_or_preserved_machines(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    conditions = {
        c["name"]: c["expression"]
        for c in webhooks_by_name(rendered["seed"])[builder.MACHINE_DELETION_WEBHOOK]["matchConditions"]
    }
    assert conditions == {
        "deleted-by-mcm": f"request.userInfo.username in ['{SEED_MCM}']",
        "machine-failed-or-preserved": (
            "((oldObject != null && has(oldObject.status) && has(oldObject.status.currentStatus) && "
            "has(oldObject.status.currentStatus.phase) && oldObject.status.currentStatus.phase == 'Failed') || "
            + " || ".join(
                "(oldObject != null && has(oldObject.metadata.annotations) && "
                f"'{key}' in oldObject.metadata.annotations)"
                for key in vocabulary.PRESERVATION_RECORD_ANNOTATIONS
            )
            + ")"
        ),
        # Gardener marks every machine of a Shoot it hibernates or deletes: those deletes never wait for us.
        "not-force-deletion": (
            "!(oldObject != null && has(oldObject.metadata.labels) && 'force-deletion' in oldObject.metadata.labels "
            "&& oldObject.metadata.labels['force-deletion'] == 'True')"
        ),
    }


def _args(documents: list[dict[str, Any]], deployment: str, container: str) -> list[str]:
    pod = find(documents, "Deployment", deployment)["spec"]["template"]["spec"]
    args: list[str] = next(c for c in pod["containers"] if c["name"] == container)["args"]
    return args


@pytest.mark.parametrize(
    ("values", "native", "limit"),
    [
        ({}, "auto", "720h"),
        ({"mcmNativePreservation": "true", "maxPreserveTimeout": '"240h"'}, "true", "240h"),
        ({"mcmNativePreservation": '"true"'}, "true", "720h"),
        ({"mcmNativePreservation": "false", "maxPreserveTimeout": '"1h30m"'}, "false", "1h30m"),
    ],
)
def test_native_preservation_and_the_maximum_reach_both_components(
    toolchain: Toolchain, values: dict[str, str], native: str, limit: str
) -> None:
    documents = template(toolchain.helm, values)
    for deployment, container in ((CONTROLLER, "controller"), (WEBHOOK, "webhook")):
        args = _args(documents, deployment, container)
        assert f"--mcm-native-preservation={native}" in args, (deployment, args)
        assert f"--max-preserve-timeout={limit}" in args, (deployment, args)
        parsed = build_parser().parse_args(args)
        assert getattr(parsed.mcm_native_preservation, "value", parsed.mcm_native_preservation) == native
    # The guard stays registered: with native preservation the webhook itself lets MCM's deletes through
    # (except for a preservation handed over from our controller).
    assert builder.MACHINE_DELETION_WEBHOOK in webhooks_by_name(documents)


def test_network_policies_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["default"]
    policies = {d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "NetworkPolicy"}
    assert set(policies) == {"mp-machine-preservation-deny-ingress", WEBHOOK}, "no scrapers: no metrics policy"
    # Every pod of the release is isolated (the certificate manager's too, whatever its component).
    isolate = policies["mp-machine-preservation-deny-ingress"]
    assert isolate["policyTypes"] == ["Ingress"]
    assert "ingress" not in isolate
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        assert _selects(isolate["podSelector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"])
    # The webhook port, from any source (the API server's address depends on the cluster), and nothing else.
    webhook = policies[WEBHOOK]
    labels = find(documents, "Deployment", WEBHOOK)["spec"]["template"]["metadata"]["labels"]
    assert _selects(webhook["podSelector"]["matchLabels"], labels)
    assert not _selects(
        webhook["podSelector"]["matchLabels"],
        find(documents, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"],
    )
    assert webhook["ingress"] == [{"ports": [{"protocol": "TCP", "port": 10250}]}]
    assert "NetworkPolicy" not in kinds(rendered["monitoring-cert-manager"]), "networkPolicy.enabled=false"


def test_seed_setup(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The documented Gardener install: narrowed peers, scrapers, the controller's metrics on localhost."""
    documents = rendered["seed"]
    policies = {d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "NetworkPolicy"}
    assert set(policies) == {"mp-machine-preservation-deny-ingress", WEBHOOK}
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "garden"}}}
    # /metrics shares the webhook port: the scrapers are let in there too.
    assert policies[WEBHOOK]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 10250}], "from": [{"ipBlock": {"cidr": "10.250.0.0/16"}}, scraper]}
    ]
    # The controller's metrics only on 127.0.0.1: no port, Service, ServiceMonitor or policy for them.
    controller = find(documents, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-bind-address=127.0.0.1" in controller["args"]
    assert "ports" not in controller
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        command = controller[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert f"http://127.0.0.1:8080{path}" in command[2]
    assert not [d for d in documents if d["kind"] == "Service" and d["metadata"]["name"].startswith(CONTROLLER)]
    monitors = [d["metadata"]["name"] for d in documents if d["kind"] == "ServiceMonitor"]
    assert monitors == [WEBHOOK]
    # MCM's identity in the shoot's namespace: the webhook's flag and the configurations' CEL.
    webhook_args = _args(documents, WEBHOOK, "webhook")
    assert [a for a in webhook_args if a.startswith("--mcm-username=")] == [f"--mcm-username={SEED_MCM}"]
    assert SEED_MCM in str(webhooks_by_name(documents)[builder.MACHINE_DELETION_WEBHOOK]["matchConditions"])
    # The shoot's configurations, named by the registration install there, get their caBundle from here.
    certs = next(c for _, c in _containers(documents) if c["args"][1:3] == ["certs", "run"])
    assert (
        "--webhook-configuration=validating/mp-machine-preservation.kube-system@/etc/machine-preservation/target/kubeconfig"
        in certs["args"]
    )
    # Only the control cluster's rights here; the shoot's are granted by the registration install.
    role_names = {d["metadata"]["name"] for d in documents if d["kind"] in ("Role", "ClusterRole")}
    assert role_names == {
        _unique(f"{CONTROLLER}-control"),
        _unique(f"{CONTROLLER}-crd"),
        _unique(f"{CONTROLLER}-gardener-cluster"),
        _unique(f"{WEBHOOK}-control"),
        _unique(f"{WEBHOOK}-crd"),
        _unique(f"{WEBHOOK}-gardener-cluster"),
        CERTS,
        _unique(f"{CERTS}-cabundle"),
    }


def test_scrapers_reach_the_controllers_metrics_port_only(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["monitoring"]
    scraper = {"podSelector": {"matchLabels": {"app": "prometheus"}}}
    policy = find(documents, "NetworkPolicy", f"{CONTROLLER}-metrics")["spec"]
    labels = find(documents, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"]
    assert _selects(policy["podSelector"]["matchLabels"], labels)
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}], "from": [scraper]}]
    # The webhook port stays open to every source: the scrapers are among them.
    assert find(documents, "NetworkPolicy", WEBHOOK)["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 10250}]}
    ]


def test_cert_manager_mode(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["cert-manager"]
    assert kinds(d for d in documents if d["apiVersion"].startswith("cert-manager.io")) == [
        "Certificate",
        "Certificate",
        "Issuer",
        "Issuer",
    ]
    serving = find(documents, "Certificate", WEBHOOK)
    assert serving["spec"]["secretName"] == f"{WEBHOOK}-tls"
    assert f"{WEBHOOK}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    for configuration in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        annotations = find(documents, configuration)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{WEBHOOK}"}
    pod = find(documents, "Deployment", WEBHOOK)["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert [c["name"] for c in pod["containers"]] == ["webhook"]
    assert {"name": "certs", "secret": {"secretName": f"{WEBHOOK}-tls"}} in pod["volumes"]
    assert not [d for d in documents if d["kind"] == "Secret"]
    assert not [d for d in documents if "cabundle" in d["metadata"]["name"]], "cainjector owns the caBundle"
    external = rendered["cert-manager-external-issuer"]
    assert kinds(d for d in external if d["apiVersion"].startswith("cert-manager.io")) == ["Certificate"]
    assert find(external, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_provided_mode(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["provided"]
    pod = find(documents, "Deployment", WEBHOOK)["spec"]["template"]["spec"]
    assert {"name": "certs", "secret": {"secretName": "my-tls"}} in pod["volumes"]
    assert [c["name"] for c in pod["containers"]] == ["webhook"]
    assert all(w["clientConfig"]["caBundle"] == CA_BUNDLE for w in webhooks_by_name(documents).values())
    assert not [d for d in documents if d["kind"] == "Secret"]


def test_remote_clusters_use_kubeconfig_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["remote-clusters"]
    controller = find(documents, "Deployment", CONTROLLER)["spec"]["template"]["spec"]
    args = controller["containers"][0]["args"]
    assert "--control-kubeconfig=/etc/machine-preservation/control/kubeconfig" in args
    assert "--target-kubeconfig=/etc/machine-preservation/target/kubeconfig" in args
    assert "--namespace=shoot--p--s" in args
    kubeconfigs = {v["secret"]["secretName"] for v in controller["volumes"] if "secret" in v}
    assert kubeconfigs == {"seed-kubeconfig", "shoot-kubeconfig"}
    webhook = find(documents, "Deployment", WEBHOOK)["spec"]["template"]["spec"]
    server = next(c for c in webhook["containers"] if c["name"] == "webhook")
    assert "--kubeconfig=/etc/machine-preservation/control/kubeconfig" in server["args"]
    # The webhook pods get the control cluster's kubeconfig only; the remote caBundle injection's kubeconfigs
    # go to the certs manager.
    assert {m["mountPath"] for m in server["volumeMounts"]} == {"/certs", "/tmp", "/etc/machine-preservation/control"}
    certs = find(documents, "Deployment", CERTS)["spec"]["template"]["spec"]["containers"][0]
    assert (
        "--webhook-configuration=validating/mp-machine-preservation@/etc/machine-preservation/garden/kubeconfig"
        in (certs["args"])
    )
    assert "--extra-name=mp.seed.example.com" in certs["args"]
    assert {m["mountPath"] for m in certs["volumeMounts"]} == {
        "/tmp",
        "/etc/machine-preservation/target",
        "/etc/machine-preservation/garden",
    }
    # Nothing is granted in the cluster the chart is installed in for clusters reached by kubeconfig.
    role_names = {d["metadata"]["name"] for d in documents if d["kind"] in ("Role", "ClusterRole")}
    assert role_names == {CERTS, _unique(f"{CERTS}-cabundle")}
    hooks = webhooks_by_name(documents)
    assert sorted(hooks) == [builder.MACHINE_DELETION_WEBHOOK, builder.MACHINE_PRESERVE_WEBHOOK]
    assert hooks[builder.MACHINE_DELETION_WEBHOOK]["clientConfig"] == {
        "url": "https://mp.seed.example.com:443/validate-machine-deletion"
    }


def test_registration_only_install_grants_the_remote_identities_exactly_their_work(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    documents = rendered["registration-only"]
    assert kinds(documents) == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ]
    assert _rules(documents, "ClusterRole", _unique("mp-machine-preservation-remote-cabundle")) == _expand(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations mutatingwebhookconfigurations",
        "get patch",
        CONFIGURATION,
    )
    assert _rules(documents, "ClusterRole", _unique("mp-machine-preservation-remote-controller")) == _rules(
        rendered["default"], "ClusterRole", _unique(f"{CONTROLLER}-target")
    )
    assert _rules(documents, "Role", _unique("mp-machine-preservation-remote-controller-node-events")) == _expand(
        "", "events", "create get list patch"
    )
    assert _rules(documents, "Role", _unique("mp-machine-preservation-remote-controller-evidence")) == _rules(
        rendered["default"], "Role", _unique(f"{CONTROLLER}-evidence")
    )
    subjects = {
        b["metadata"]["name"]: b["subjects"] for b in documents if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }
    assert subjects == {
        _unique("mp-machine-preservation-remote-cabundle"): [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "seed-webhook"}
        ],
        _unique("mp-machine-preservation-remote-controller"): [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "seed-controller"}
        ],
        _unique("mp-machine-preservation-remote-controller-node-events"): [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "seed-controller"}
        ],
        _unique("mp-machine-preservation-remote-controller-evidence"): [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "seed-controller"}
        ],
    }


def test_customised_values_reach_the_manifests(rendered: dict[str, list[dict[str, Any]]]) -> None:
    documents = rendered["customised"]
    webhook = find(documents, "Deployment", WEBHOOK)
    assert webhook["spec"]["replicas"] == 3
    pod = webhook["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "system"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert all(c["image"] == "ghcr.io/gardener/machine-preservation:v9.9.9" for c in pod["containers"])
    args = find(documents, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-elect" in args
    assert "--machine-preserve-timeout=96h" in args
    control_rules = _rules(documents, "Role", _unique(f"{CONTROLLER}-control"))
    assert not [rule for rule in control_rules if rule[1] == "leases"], "no Lease access without leader election"


@pytest.mark.parametrize("name", ["default", "remote-clusters", "provided"])
def test_chart_commands_are_accepted_by_the_cli(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    """Every webhook/certs container's args parse with the real command line (the image's ENTRYPOINT)."""
    parser = build_parser()
    commands = set()
    for _, container in _containers(rendered[name]):
        args = parser.parse_args(container["args"])
        commands.add(args.command)
        if args.command == "webhook":
            assert args.cert_dir == Path("/certs")
            assert args.port == 10250
            assert args.control_namespace == ("shoot--p--s" if name == "remote-clusters" else NAMESPACE)
        elif args.command == "certs":
            assert args.cert_dir is None, "shares no directory with the webhook"
            assert args.secret == (NAMESPACE, f"{WEBHOOK}-certs")
            assert args.serving_secret == (NAMESPACE, f"{WEBHOOK}-tls")
        else:
            assert args.command == "controller"
            assert args.leader_elect is True
            assert args.metrics_port == 8080
            assert args.metrics_bind_address == "0.0.0.0", "reachable by Prometheus and the kubelet's probes"
            remote = name == "remote-clusters"
            assert args.namespace == ("shoot--p--s" if remote else NAMESPACE)
            assert args.control_kubeconfig == (Path("/etc/machine-preservation/control/kubeconfig") if remote else None)
            assert args.target_kubeconfig == (Path("/etc/machine-preservation/target/kubeconfig") if remote else None)
    assert commands == ({"webhook", "controller"} if name == "provided" else {"webhook", "certs", "controller"})


def test_dockerfile_matches_the_chart(rendered: dict[str, list[dict[str, Any]]]) -> None:
    dockerfile = (CHART.parents[1] / "Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE)
    assert entrypoint is not None
    assert json.loads(entrypoint.group(1)) == ["machine-preservation"]
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)$", dockerfile, re.MULTILINE).group(1).split()}  # type: ignore[union-attr]
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    assert user is not None
    documents = rendered["default"]
    ports = {p["containerPort"] for _, c in _containers(documents) for p in c.get("ports", [])}
    assert ports == exposed
    for pod, container in _containers(documents):
        assert "command" not in container, "the image's ENTRYPOINT is the command"
        assert pod["securityContext"]["runAsUser"] == int(user.group(1))
        assert pod["securityContext"]["runAsGroup"] == int(user.group(2))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert {values["webhook"]["port"], values["controller"]["metricsPort"]} == exposed
