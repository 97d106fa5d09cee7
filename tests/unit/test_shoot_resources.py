"""What the extension provisions per shoot (core.shoot_resources): the shoot-access Secret, the RBAC with the
controller's verbs, the node webhook configurations in url mode, the node annotation policy, and the
ManagedResource with its data Secret (deterministic bytes)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import webhook_configurations as wc
from machine_preservation.core.gardener import shoot_resources as sr

NAMESPACE = "shoot--p--s"
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
# The webhook Service as the shoot's kube-apiserver (in the seed) reaches it.
URL = "https://gardener-extension-machine-preservation-webhook.extension-machine-preservation-x1.svc:443"
CONTROLLER = "system:serviceaccount:kube-system:machine-preservation"
MCM = "system:serviceaccount:kube-system:machine-controller-manager"


def deserialize_objects(data: bytes) -> list[dict[str, Any]]:
    """The inverse of `serialize_objects` (for its own output)."""
    parts = [part.strip() for part in data.decode().split("\n---\n")]
    return [json.loads(part.removeprefix("---").strip()) for part in parts if part.removeprefix("---").strip()]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


def test_shoot_access_secret() -> None:
    secret = sr.shoot_access_secret(NAMESPACE)
    assert secret["metadata"] == {
        "name": "shoot-access-machine-preservation",
        "namespace": NAMESPACE,
        "labels": {"resources.gardener.cloud/purpose": "token-requestor", "resources.gardener.cloud/class": "shoot"},
        "annotations": {
            "serviceaccount.resources.gardener.cloud/name": "machine-preservation",
            "serviceaccount.resources.gardener.cloud/namespace": "kube-system",
        },
    }
    assert secret["type"] == "Opaque"
    assert "data" not in secret  # GRM writes the token; a write of ours must not remove it


def test_identities() -> None:
    assert sr.CONTROLLER_USERNAME == CONTROLLER
    assert sr.MCM_USERNAME == MCM
    assert URL == "https://gardener-extension-machine-preservation-webhook.extension-machine-preservation-x1.svc:443"


def test_rbac_grants_exactly_the_controllers_verbs() -> None:
    objects = sr.rbac_objects()
    role, binding = by_kind(objects, "ClusterRole"), by_kind(objects, "ClusterRoleBinding")
    grants = {(r, verb) for rule in role["rules"] for r in rule["resources"] for verb in rule["verbs"]}
    assert all(
        rule["apiGroups"] == ["policy" if "poddisruptionbudgets" in rule["resources"] else ""] for rule in role["rules"]
    )
    assert grants == {
        ("nodes", "get"),  # reconcile.LiveNodes
        ("nodes", "list"),
        ("nodes", "watch"),
        ("nodes", "patch"),
        ("nodes/status", "patch"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods/eviction", "create"),
        ("poddisruptionbudgets", "list"),  # drain.py names the budgets that refused
    }
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "machine-preservation", "namespace": "kube-system"}
    ]
    roles = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"default", "kube-system"}
    # Events about Nodes go to `default`; the evidence of a failure is listed from there.
    assert roles["default"]["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "list", "patch"]}
    ]
    # The evidence ConfigMaps (controller/preservation/evidence.py).
    assert roles["kube-system"]["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "delete", "get", "list", "patch"]}
    ]
    for namespace, role_binding in bindings.items():
        assert role_binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[namespace]["metadata"]["name"],
        }
        assert role_binding["subjects"] == binding["subjects"]


def webhooks() -> dict[str, dict[str, Any]]:
    validating, mutating = sr.node_webhook_configurations(ca_bundle=CA, url=URL)
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    return {hook["name"]: hook for config in (validating, mutating) for hook in config["webhooks"]}


def test_node_webhooks_in_url_mode() -> None:
    hooks = webhooks()
    assert set(hooks) == {wc.NODE_PRESERVE_WEBHOOK, wc.NODE_CA_WEBHOOK, wc.NODE_MCM_MARKER_WEBHOOK}
    paths = {
        wc.NODE_PRESERVE_WEBHOOK: "/validate-preserve-annotation",
        wc.NODE_CA_WEBHOOK: "/mutate-node-ca-annotation",
        wc.NODE_MCM_MARKER_WEBHOOK: "/mutate-node-mcm-marker",
    }
    for name, hook in hooks.items():
        assert hook["clientConfig"] == {"url": URL + paths[name], "caBundle": base64.b64encode(CA).decode()}
        assert hook["failurePolicy"] == "Ignore"
        assert 1 <= hook["timeoutSeconds"] <= 5
        assert hook["matchConditions"]
        assert all(rule["resources"] == ["nodes", "nodes/status"] for rule in hook["rules"])
        assert "namespaceSelector" not in hook


def test_node_webhooks_leave_out_kubelets_mcm_and_the_controller() -> None:
    hooks = webhooks()
    for name in (wc.NODE_PRESERVE_WEBHOOK, wc.NODE_CA_WEBHOOK):
        conditions = {c["name"]: c["expression"] for c in hooks[name]["matchConditions"]}
        assert conditions["not-a-kubelet"] == "!('system:nodes' in request.userInfo.groups)"
        assert conditions["not-mcm-or-controller"] == f"!(request.userInfo.username in ['{MCM}', '{CONTROLLER}'])"
    marker = {c["name"]: c["expression"] for c in hooks[wc.NODE_MCM_MARKER_WEBHOOK]["matchConditions"]}
    assert marker["by-mcm"] == f"request.userInfo.username in ['{MCM}']"


def test_node_webhook_timeout_is_bounded() -> None:
    with pytest.raises(ValueError, match="timeoutSeconds"):
        sr.node_webhook_configurations(ca_bundle=CA, url=URL, timeout_seconds=6)
    validating, _ = sr.node_webhook_configurations(ca_bundle=CA, url=URL, timeout_seconds=3)
    assert validating["webhooks"][0]["timeoutSeconds"] == 3


def test_node_annotation_policy() -> None:
    policy, binding = sr.node_annotation_policy()
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    assert policy["spec"]["failurePolicy"] == "Ignore"
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    expressions = [check["expression"] for check in policy["spec"]["validations"]]
    assert "['auto-preserve', 'auto-preserved']" in expressions[0]
    assert expressions[1].startswith(f"request.userInfo.username in ['{MCM}', '{CONTROLLER}'] || ")
    assert expressions[2].startswith(f"request.userInfo.username in ['{CONTROLLER}'] || ")


def test_shoot_objects_are_everything() -> None:
    objects = sr.shoot_objects(ca_bundle=CA, url=URL)
    assert sorted(obj["kind"] for obj in objects) == [
        "ClusterRole",
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
    keys = [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects]
    assert len(set(keys)) == len(keys)


def test_managed_resource() -> None:
    objects = sr.shoot_objects(ca_bundle=CA, url=URL)
    secret, resource = sr.managed_resource(NAMESPACE, objects)
    # As Gardener's managedresources.NewForShoot builds them: an immutable Secret named after its content and
    # collectable by the seed's GRM, the creator in `origin`, `no-cleanup` injected into every shoot object.
    assert re.fullmatch(r"managedresource-extension-machine-preservation-shoot-[0-9a-f]{8}", secret["metadata"]["name"])
    assert secret["immutable"] is True
    assert secret["metadata"]["labels"]["resources.gardener.cloud/garbage-collectable-reference"] == "true"
    assert secret["metadata"]["labels"]["origin"] == "machine-preservation"
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert resource["apiVersion"] == "resources.gardener.cloud/v1alpha1"
    assert resource["metadata"]["name"] == "extension-machine-preservation-shoot"
    assert resource["metadata"]["namespace"] == NAMESPACE
    assert resource["metadata"]["labels"]["origin"] == "machine-preservation"
    assert resource["spec"] == {
        "secretRefs": [{"name": secret["metadata"]["name"]}],
        "injectLabels": {"shoot.gardener.cloud/no-cleanup": "true"},
        "keepObjects": False,
    }
    assert "class" not in resource["spec"]
    assert sr.data_secrets(resource) == [secret["metadata"]["name"]]
    (data,) = secret["data"].values()
    decoded = deserialize_objects(base64.b64decode(data))
    assert sorted(decoded, key=sr._sort_key) == sorted(objects, key=sr._sort_key)


def test_managed_resource_bytes_do_not_depend_on_order() -> None:
    objects = sr.shoot_objects(ca_bundle=CA, url=URL)
    first, _ = sr.managed_resource(NAMESPACE, objects)
    second, _ = sr.managed_resource(NAMESPACE, [dict(reversed(o.items())) for o in reversed(objects)])
    assert first == second
    rotated, _ = sr.managed_resource(NAMESPACE, sr.shoot_objects(ca_bundle=CA + b"\n", url=URL))
    assert rotated["data"] != first["data"]
    assert rotated["metadata"]["name"] != first["metadata"]["name"], "new content, new immutable Secret"


def test_the_data_secret_is_named_after_its_labels_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new version labelling it otherwise gets a new Secret: the extension never patches a data Secret (its RBAC
    lets it patch only the shoot-access Secret)."""
    objects = sr.shoot_objects(ca_bundle=CA, url=URL)
    first, _ = sr.managed_resource(NAMESPACE, objects)
    monkeypatch.setattr(sr, "MANAGED_BY_LABELS", {**sr.MANAGED_BY_LABELS, "app.kubernetes.io/version": "2"})
    relabelled, _ = sr.managed_resource(NAMESPACE, objects)
    assert relabelled["data"] == first["data"]
    assert relabelled["metadata"]["name"] != first["metadata"]["name"]


def test_keep_objects_patch() -> None:
    assert sr.keep_objects_patch() == {"spec": {"keepObjects": True}}
    assert sr.keep_objects_patch(False) == {"spec": {"keepObjects": False}}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "apiVersion": st.text(max_size=8),
                "kind": st.text(max_size=8),
                "metadata": st.fixed_dictionaries({"name": st.text(max_size=8)}),
                "data": JSON,
            }
        ),
        max_size=4,
    )
)
def test_serialization_round_trips(objects: list[dict[str, Any]]) -> None:
    data = sr.serialize_objects(objects)
    assert deserialize_objects(data) == sorted(objects, key=sr._sort_key)
    assert sr.serialize_objects(list(reversed(objects))) == data or len({sr._sort_key(o) for o in objects}) < len(
        objects
    )


# --- ControlPlaneHealthy: how a shoot is served -------------------------------------------------------------------

APPLIED = sr.ObjectsApplied(namespace="shoot--p--a", applied=True, message="All resources are applied.")
NOT_APPLIED = sr.ObjectsApplied(namespace="shoot--p--a", applied=False, message="Could not apply: forbidden")


SLOW = "GET /version took 5.2 s"


NOT_REPORTED = sr.ObjectsApplied(namespace="shoot--p--a", applied=False, message="not reported yet", reported=False)
T, F, P = "True", "False", "Progressing"
OK, FAIL, PROGRESS = "HealthCheckSuccessful", "HealthCheckUnsuccessful", "HealthCheckProgressing"


@pytest.mark.parametrize(
    ("hibernated", "running", "native", "problem", "objects", "slow", "status", "reason", "in_message", "diagnosis"),
    [
        # As Gardener's health-check library says it: hibernated is healthy.
        (True, False, None, "down", None, "", T, OK, "Shoot is hibernated", ""),
        (True, True, None, "", APPLIED, SLOW, T, OK, "Shoot is hibernated", ""),
        # Starting, or waiting for the shoot (its API server, the token): Progressing, never False.
        (False, False, None, "cannot watch nodes: refused", APPLIED, "", P, PROGRESS, "refused", "refused"),
        (False, False, None, "cannot watch nodes: refused", APPLIED, SLOW, P, PROGRESS, "refused", "refused"),
        (False, False, None, "", APPLIED, "", P, PROGRESS, "starting", ""),
        (False, True, False, "", None, "", P, PROGRESS, "being applied", ""),
        (False, True, False, "", NOT_REPORTED, "", P, PROGRESS, "being applied", ""),
        # What is ours failing: GRM says our objects are not applied.
        (False, True, False, "", NOT_APPLIED, SLOW, F, FAIL, "forbidden", ""),
        # A slow API server is gardenlet's APIServerAvailable: healthy here, our diagnosis for Events.
        (False, True, False, "", APPLIED, SLOW, T, OK, "All health checks successful", f"answers slowly ({SLOW})"),
        (False, True, False, "", APPLIED, "", T, OK, "All health checks successful", ""),
        (False, True, True, "", APPLIED, "", T, OK, "natively", ""),
    ],
)
def test_shoot_health(
    hibernated: bool,
    running: bool,
    native: bool | None,
    problem: str,
    objects: sr.ObjectsApplied | None,
    slow: str,
    status: str,
    reason: str,
    in_message: str,
    diagnosis: str,
) -> None:
    health = sr.shoot_health(
        hibernated=hibernated, running=running, native=native, problem=problem, objects=objects, slow=slow
    )
    assert (health.status, health.reason) == (status, reason)
    assert health.served == (status == T)
    assert in_message in health.message
    assert diagnosis in health.diagnosis
    assert bool(health.diagnosis) == bool(diagnosis)


@pytest.mark.parametrize(
    ("status", "applied", "message"),
    [
        ({"conditions": [{"type": "ResourcesApplied", "status": "True", "message": "ok"}]}, True, "ok"),
        ({"conditions": [{"type": "ResourcesApplied", "status": "False", "message": "boom"}]}, False, "boom"),
        ({"conditions": [{"type": "ResourcesHealthy", "status": "True"}]}, False, "not reported yet"),
        ({}, False, "not reported yet"),
        (None, False, "not reported yet"),
    ],
)
def test_objects_applied_reads_grms_condition(status: Any, applied: bool, message: str) -> None:
    raw: dict[str, Any] = {"metadata": {"name": sr.MANAGED_RESOURCE, "namespace": "shoot--p--a"}, "status": status}
    found = sr.objects_applied(raw)
    assert (found.namespace, found.applied, found.message) == ("shoot--p--a", applied, message)


# --- shoots whose Kubernetes cannot carry the node webhooks and the policy ------------------------------------


@pytest.mark.parametrize(
    ("version", "gap"),
    [
        ("1.29.4", True),
        ("v1.27.3", True),
        ("1.28.0-gardener.1", True),
        ("1.30.0", False),
        ("1.36.0", False),
        ("2.0.0", False),
        ("", False),  # not known: Gardener always writes it
        ("latest", False),
    ],
)
def test_kubernetes_gap(version: str, gap: bool) -> None:
    found = sr.kubernetes_gap(version)
    assert bool(found) == gap
    if gap:
        assert version in found
        assert "1.30" in found


@given(major=st.integers(0, 3), minor=st.integers(0, 60), patch=st.integers(0, 20))
def test_only_kubernetes_1_30_and_later_gets_the_node_webhooks_and_the_policy(
    major: int, minor: int, patch: int
) -> None:
    objects = sr.shoot_objects(ca_bundle=CA, url=URL, kubernetes_version=f"{major}.{minor}.{patch}")
    full = sr.shoot_objects(ca_bundle=CA, url=URL)
    assert {"ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy"} <= {obj["kind"] for obj in full}
    # Below 1.30 the RBAC alone: the lifecycle runs, nothing half-working is installed.
    assert objects == (full if (major, minor) >= (1, 30) else sr.rbac_objects())


def test_a_shoot_too_old_for_the_node_protection_is_reported_unhealthy() -> None:
    gap = sr.kubernetes_gap("1.29.4")
    health = sr.shoot_health(hibernated=False, running=True, native=False, problem="", objects=APPLIED, gap=gap)
    assert (health.status, health.reason) == (F, FAIL)
    assert not health.served
    assert "Kubernetes 1.29.4" in health.message
    assert "Kubernetes 1.29.4" in health.diagnosis  # the Warning Event
    hibernated = sr.shoot_health(hibernated=True, running=False, native=None, problem="", objects=None, gap=gap)
    assert hibernated.served


# --- which shoots have applied the webhook CA bundle (for the certs manager) -----------------------------------


def _resource(
    namespace: str,
    *,
    bundle: bytes | None = CA,
    generation: int = 2,
    observed: int | None = 2,
    applied: str = "True",
    deleting: bool = False,
) -> dict[str, Any]:
    _, resource = sr.managed_resource(namespace, sr.shoot_objects(ca_bundle=CA, url=URL), ca_bundle=bundle)
    resource["metadata"]["generation"] = generation
    if deleting:
        resource["metadata"]["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "ResourcesApplied", "status": applied}]}
    if observed is not None:
        status["observedGeneration"] = observed
    resource["status"] = status
    return resource


def test_the_managed_resource_names_the_bundle_it_carries() -> None:
    _, resource = sr.managed_resource(NAMESPACE, sr.shoot_objects(ca_bundle=CA, url=URL), ca_bundle=CA)
    assert resource["metadata"]["annotations"] == {sr.CA_BUNDLE_ANNOTATION: sr.ca_bundle_digest(CA)}


@pytest.mark.parametrize(
    ("resource", "pending"),
    [
        (_resource("a"), False),
        (_resource("a", bundle=b"old"), True),  # made with another bundle
        (_resource("a", bundle=None), True),  # made before the annotation existed
        (_resource("a", observed=1), True),  # its GRM has not seen this generation yet
        (_resource("a", observed=None), True),
        (_resource("a", applied="False"), True),
        (_resource("a", bundle=b"old", deleting=True), False),  # going: not waited for
    ],
)
def test_bundle_pending(resource: dict[str, Any], pending: bool) -> None:
    assert sr.bundle_pending([resource], ca_bundle=CA) == (("a",) if pending else ())


def test_bundle_pending_names_every_waiting_shoot_sorted() -> None:
    resources = [_resource("c", applied="False"), _resource("a"), _resource("b", bundle=b"old")]
    assert sr.bundle_pending(resources, ca_bundle=CA) == ("b", "c")
