"""Webhook configurations the certs manager keeps entirely: checking the manifest, the desired object, and the plan
that turns a live object into it. Pure. (The API server taking these patches, defaulting, and rejecting stale
patches is tested in tests/integration/test_certs_seed_webhooks.py.)"""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.certs import bundle, commands, managed
from machine_preservation.certs.authority import generate_ca
from machine_preservation.certs.manager import ManagerSettings, WebhookConfigurationRef, WebhookKind
from machine_preservation.certs.rotation import RotationPolicy, ServingIdentity
from machine_preservation.cli.main import build_parser

NOW = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)
CA_A = generate_ca(common_name="a", now=NOW, valid_for=dt.timedelta(days=1))
CA_B = generate_ca(common_name="b", now=NOW, valid_for=dt.timedelta(days=1))


def template(*conditions: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "mp", "labels": {"app.kubernetes.io/name": "mp"}},
        "webhooks": [
            {
                "name": "deletion.machines.example.com",
                "clientConfig": {"service": {"namespace": "ns", "name": "svc", "path": "/d", "port": 443}},
                "rules": [
                    {
                        "apiGroups": ["machine.sapcloud.io"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["DELETE"],
                        "resources": ["machines"],
                        "scope": "Namespaced",
                    }
                ],
                "matchConditions": [{"name": f"c{i}", "expression": e} for i, e in enumerate(conditions)],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }


def as_served(wanted: dict[str, Any], *, resource_version: str = "7") -> dict[str, Any]:
    """What the API server returns for a created `wanted`: server metadata and defaulted fields added."""
    live = copy.deepcopy(wanted)
    live["metadata"].update(resourceVersion=resource_version, uid="u-1", generation=1, managedFields=[{"m": 1}])
    for webhook in live["webhooks"]:
        webhook.setdefault("matchPolicy", "Equivalent")
        webhook.setdefault("namespaceSelector", {})
        webhook.setdefault("objectSelector", {})
        webhook.setdefault("timeoutSeconds", 10)
    return live


def apply_patch(document: dict[str, Any], patch: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """RFC 6902 `replace`/`add` on object members, as the patches use them (the API server's own application
    is in the integration test)."""
    result = copy.deepcopy(document)
    for operation in patch:
        *parents, last = operation["path"].lstrip("/").split("/")
        target: Any = result
        for part in parents:
            target = target[part]
        if operation["op"] == "replace":
            assert last in target, operation
        target[last] = copy.deepcopy(operation["value"])
    return result


# --- the manifest ----------------------------------------------------------------------------------------------


def test_a_rendered_manifest_loads() -> None:
    loaded = managed.load_template(yaml.safe_dump(template("true")), kind="validating", name="mp")
    assert loaded == template("true")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(kind="MutatingWebhookConfiguration"), "kind 'MutatingWebhookConfiguration'"),
        (lambda d: d.update(apiVersion="admissionregistration.k8s.io/v1beta1"), "apiVersion"),
        (lambda d: d["metadata"].update(name="other"), "metadata.name 'other', expected 'mp'"),
        (lambda d: d.update(webhooks=[]), "no webhooks"),
        (lambda d: d["webhooks"][0].pop("clientConfig"), "needs a name and a clientConfig"),
    ],
    ids=["kind", "apiVersion", "name", "no-webhooks", "no-client-config"],
)
def test_a_manifest_for_something_else_is_refused(change: Any, message: str) -> None:
    document = template("true")
    change(document)
    with pytest.raises(managed.TemplateProblem, match=message):
        managed.load_template(yaml.safe_dump(document), kind="validating", name="mp")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "webhooks: [\n"])
def test_what_is_not_a_manifest_is_refused(text: str) -> None:
    with pytest.raises(managed.TemplateProblem):
        managed.load_template(text, kind="validating", name="mp")


# --- the desired object ----------------------------------------------------------------------------------------


def test_desired_trusts_the_bundle_in_every_webhook() -> None:
    two = template("true")
    two["webhooks"].append({**copy.deepcopy(two["webhooks"][0]), "name": "other.machines.example.com"})
    two["metadata"]["namespace"] = "ignored"  # a cluster-scoped object: only name, labels, annotations are kept
    pem = bundle.compose_bundle([CA_A.certificate, CA_B.certificate])
    wanted = managed.desired(two, bundle_pem=pem)
    assert all(w["clientConfig"]["caBundle"] == bundle.encode(pem) for w in wanted["webhooks"])
    assert bundle.trusts(wanted, CA_A.certificate)
    assert bundle.trusts(wanted, CA_B.certificate)
    assert wanted["metadata"] == {"name": "mp", "labels": {"app.kubernetes.io/name": "mp"}}
    assert "caBundle" not in two["webhooks"][0]["clientConfig"], "the manifest itself is left alone"


# --- covers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "wanted", "expected"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, True),
        ({"a": {"x": 2}}, {"a": {"x": 1}}, False),
        ([{"n": 1, "d": 0}], [{"n": 1}], True),
        ([{"n": 1}, {"n": 2}], [{"n": 1}], False),
        ([{"n": 1}], [{"n": 1}, {"n": 2}], False),
        ([1, 2], [2, 1], False),
        ({"a": []}, {"a": {}}, False),
        ({"a": None}, {"a": 0}, False),
        ("x", "x", True),
    ],
)
def test_covers(actual: Any, wanted: Any, expected: bool) -> None:
    assert managed.covers(actual, wanted) is expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=12,
)


@given(json_values)
def test_everything_covers_itself(value: Any) -> None:
    assert managed.covers(value, value)


@given(st.dictionaries(st.text(max_size=2), json_values, max_size=4), st.text(max_size=2), json_values)
def test_a_default_the_manifest_does_not_state_is_never_a_difference(
    wanted: dict[str, Any], key: str, default: Any
) -> None:
    if key in wanted:
        return
    assert managed.covers({**wanted, key: default}, wanted)


# --- the plan --------------------------------------------------------------------------------------------------

PEM_A = CA_A.cert_pem


def test_the_object_as_served_needs_nothing() -> None:
    wanted = managed.desired(template("true"), bundle_pem=PEM_A)
    live = as_served(wanted)
    live["metadata"]["labels"]["resources.gardener.cloud/managed-by"] = "gardener"  # someone else's label
    assert managed.plan(live, wanted) == managed.Plan()


@pytest.mark.parametrize(
    ("change", "reasons"),
    [
        # What gardener-resource-manager's re-apply did to the old chart's object.
        (lambda live: live["webhooks"][0]["clientConfig"].pop("caBundle"), ("webhooks",)),
        (lambda live: live["webhooks"][0]["clientConfig"].update(caBundle=bundle.encode(CA_B.cert_pem)), ("webhooks",)),
        # A chart upgrade: a new matchCondition in the manifest (the live object has one less).
        (lambda live: live["webhooks"][0]["matchConditions"].pop(), ("webhooks",)),
        (lambda live: live["webhooks"][0].update(failurePolicy="Ignore"), ("webhooks",)),
        (lambda live: live["webhooks"].append({**live["webhooks"][0], "name": "stray.example.com"}), ("webhooks",)),
        (lambda live: live["metadata"]["labels"].update({"app.kubernetes.io/name": "x"}), ("labels",)),
        (lambda live: live["metadata"].pop("labels"), ("labels",)),
    ],
    ids=[
        "caBundle-wiped",
        "caBundle-other",
        "matchCondition",
        "hand-edit",
        "extra-webhook",
        "label",
        "no-labels",
    ],
)
def test_any_difference_is_one_conditional_patch_that_reaches_the_desired_object(
    change: Any, reasons: tuple[str, ...]
) -> None:
    wanted = managed.desired(template("true", "false"), bundle_pem=PEM_A)
    live = as_served(wanted, resource_version="41")
    live["metadata"]["labels"]["keep.example.com/mine"] = "yes"
    change(live)
    step = managed.plan(live, wanted)
    assert step.reasons == reasons
    assert step.patch[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": "41"}
    patched = apply_patch(live, step.patch)
    assert managed.covers(patched, wanted)
    assert managed.plan(patched, wanted) == managed.Plan()
    assert [w["name"] for w in patched["webhooks"]] == ["deletion.machines.example.com"]
    if "labels" in live["metadata"]:
        assert patched["metadata"]["labels"]["keep.example.com/mine"] == "yes", "others' labels stay"


def test_owner_references_someone_set_are_left_alone() -> None:
    wanted = managed.desired(template("true"), bundle_pem=PEM_A)
    live = as_served(wanted)
    live["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Namespace", "name": "x", "uid": "u"}]
    assert managed.plan(live, wanted) == managed.Plan()


# --- flags and settings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "validating/mp=/etc/x/c.yaml",
            WebhookConfigurationRef(WebhookKind.VALIDATING, "mp", template=Path("/etc/x/c.yaml")),
        ),
        ("mutating/m=c.yaml", WebhookConfigurationRef(WebhookKind.MUTATING, "m", template=Path("c.yaml"))),
        (
            "validating/mp@/var/run/garden/kubeconfig=/etc/x/c.yaml",
            WebhookConfigurationRef(
                WebhookKind.VALIDATING,
                "mp",
                kubeconfig=Path("/var/run/garden/kubeconfig"),
                template=Path("/etc/x/c.yaml"),
            ),
        ),
    ],
)
def test_owned_configuration_references_parse(text: str, expected: WebhookConfigurationRef) -> None:
    assert WebhookConfigurationRef.parse_managed(text) == expected


@pytest.mark.parametrize(
    "text", ["validating/mp", "validating/=f", "webhook/mp=f", "validating/mp@=f", "validating/mp@/k"]
)
def test_bad_owned_configuration_references_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected validating/NAME\[@KUBECONFIG\]=FILE"):
        WebhookConfigurationRef.parse_managed(text)


def test_a_configuration_is_either_injected_or_owned() -> None:
    with pytest.raises(ValueError, match="named twice"):
        ManagerSettings(
            secret_namespace="ns",
            secret_name="s",
            cert_dir=Path("/c"),
            identity=ServingIdentity(dns_names=("a",)),
            policy=RotationPolicy(),
            configurations=(
                WebhookConfigurationRef.parse("validating/mp"),
                WebhookConfigurationRef.parse_managed("validating/mp=/f"),
            ),
            ca_common_name="ca",
        )


def test_the_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(
        [
            "certs",
            "run",
            "--secret=ns/certs",
            "--serving-secret=ns/tls",
            "--service=svc",
            "--namespace=ns",
            "--webhook-configuration=mutating/m",
            "--own-webhook-configuration=validating/mp=/etc/seed/c.yaml",
        ]
    )
    settings = commands.settings_from(args)
    assert settings.configurations == (
        WebhookConfigurationRef(WebhookKind.MUTATING, "m"),
        WebhookConfigurationRef(WebhookKind.VALIDATING, "mp", template=Path("/etc/seed/c.yaml")),
    )
