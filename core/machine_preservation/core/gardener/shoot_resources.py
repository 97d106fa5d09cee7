"""What the Gardener extension provisions for each shoot, as plain objects (no I/O).

In the shoot namespace of the seed:
- the shoot-access Secret `shoot-access-machine-preservation`: the shoot's gardener-resource-manager (GRM)
  creates the ServiceAccount `kube-system/machine-preservation` in the shoot and keeps a token for it in the
  Secret's `data.token` (audience `gardener`, 12 h by default, renewed at 80 %). The controller reaches the
  shoot as `system:serviceaccount:kube-system:machine-preservation`;
- the ManagedResource `extension-machine-preservation-shoot` (no class: the shoot's GRM applies it in the
  shoot) and its data Secret, holding the objects below.

In the shoot (through the ManagedResource):
- RBAC for that ServiceAccount with exactly what the controller does there: list/watch/patch Nodes, patch
  nodes/status, list/watch Pods, create pods/eviction (drain), create/get/list/patch Events in `default`
  (events about Nodes, cluster-scoped objects, go there as the kubelet's do), and the evidence ConfigMaps of
  failures in `kube-system`. The same verbs as the standalone chart's remote-access RBAC
  (`mp.controller.targetRules`, `mp.controller.nodeEventRules`, `mp.controller.evidenceRules`);
- the node webhook configurations, in url mode pointing at the extension's webhook Service in the seed (the
  shoot's kube-apiserver runs in the seed), with the CA, `failurePolicy: Ignore`, `timeoutSeconds` ≤ 5 and
  `matchConditions` that leave out kubelets, MCM and the controller;
- the ValidatingAdmissionPolicy on node annotations and its binding, the same rules as the standalone chart's
  `node-annotation-policy.yaml`.
The node webhooks and the policy only where the shoot's Kubernetes has both (1.30 and later, `kubernetes_gap`);
elsewhere the shoot is reported (ControlPlaneHealthy False, a Warning Event) and served with the RBAC alone.

MCM reaches the shoot as `system:serviceaccount:kube-system:machine-controller-manager` (gardenlet gives it a
shoot-access Secret of its own, `shoot-access-machine-controller-manager`).

Output is deterministic: the same input gives the same bytes, so an unchanged shoot needs no write.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from machine_preservation.core import vocabulary as v
from machine_preservation.core import webhook_configurations as wc
from machine_preservation.core.gardener.extension import ConditionStatus, HealthReason

SERVICE_ACCOUNT: Final = "machine-preservation"
SERVICE_ACCOUNT_NAMESPACE: Final = "kube-system"
CONTROLLER_USERNAME: Final = f"system:serviceaccount:{SERVICE_ACCOUNT_NAMESPACE}:{SERVICE_ACCOUNT}"
MCM_USERNAME: Final = "system:serviceaccount:kube-system:machine-controller-manager"

SHOOT_ACCESS_SECRET: Final = f"shoot-access-{SERVICE_ACCOUNT}"
TOKEN_KEY: Final = "token"

MANAGED_RESOURCE: Final = "extension-machine-preservation-shoot"
# The data Secret's name without its content hash (`managed_resource`): immutable, one name per content.
MANAGED_RESOURCE_SECRET: Final = f"managedresource-{MANAGED_RESOURCE}"
# As Gardener's managedresources.NewForShoot builds one: the creator (`origin`), the label GRM puts on every object
# it applies in the shoot (Gardener's shoot deletion then leaves them to GRM), and the label that lets the seed's GRM
# garbage-collect a data Secret no ManagedResource refers to any more.
ORIGIN_LABEL: Final = "origin"
ORIGIN: Final = "machine-preservation"
SHOOT_NO_CLEANUP_LABEL: Final = "shoot.gardener.cloud/no-cleanup"
GARBAGE_COLLECTABLE_LABEL: Final = "resources.gardener.cloud/garbage-collectable-reference"
MANAGED_RESOURCE_DATA_KEY: Final = "objects.yaml"
# The condition GRM sets on a ManagedResource once every object is applied in the target cluster.
RESOURCES_APPLIED: Final = "ResourcesApplied"
# On our ManagedResource: the sha256 of the webhook CA bundle its objects carry (ca_bundle_digest).
CA_BUNDLE_ANNOTATION: Final = f"{wc.DOMAIN}/ca-bundle-sha256"

# Names of the objects in the shoot.
SHOOT_OBJECT_NAME: Final = "extensions.gardener.cloud:machine-preservation"
WEBHOOK_CONFIGURATION: Final = "machine-preservation"
NODE_ANNOTATION_POLICY: Final = "machine-preservation-node-annotations"
NODE_EVENT_NAMESPACE: Final = "default"

PURPOSE_LABEL: Final = "resources.gardener.cloud/purpose"
CLASS_LABEL: Final = "resources.gardener.cloud/class"
SERVICE_ACCOUNT_NAME_ANNOTATION: Final = "serviceaccount.resources.gardener.cloud/name"
SERVICE_ACCOUNT_NAMESPACE_ANNOTATION: Final = "serviceaccount.resources.gardener.cloud/namespace"

MANAGED_BY_LABELS: Final[Mapping[str, str]] = {
    "app.kubernetes.io/managed-by": "gardener-extension-machine-preservation"
}

RBAC_API_VERSION: Final = "rbac.authorization.k8s.io/v1"
ADMISSION_API_VERSION: Final = "admissionregistration.k8s.io/v1"


# --- reaching the shoot -----------------------------------------------------------------------------------------


def shoot_access_secret(namespace: str) -> dict[str, Any]:
    """The Secret the shoot's GRM fills with a token for `kube-system/machine-preservation` in the shoot.

    No data: GRM writes `data.token` (and would keep a `data.kubeconfig` template current, which we do not need:
    the controller builds its client from the token). Applied with a merge patch, so GRM's token and its
    renew-timestamp annotation survive our writes."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": SHOOT_ACCESS_SECRET,
            "namespace": namespace,
            "labels": {PURPOSE_LABEL: "token-requestor", CLASS_LABEL: "shoot"},
            "annotations": {
                SERVICE_ACCOUNT_NAME_ANNOTATION: SERVICE_ACCOUNT,
                SERVICE_ACCOUNT_NAMESPACE_ANNOTATION: SERVICE_ACCOUNT_NAMESPACE,
            },
        },
    }


# --- the objects for the shoot ------------------------------------------------------------------------------------


def _rule(group: str, resources: Sequence[str], verbs: Sequence[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}


# What the controller does in the shoot: informers on Nodes and Pods (caches.py), a Node read past the cache
# (reconcile.LiveNodes), Node and Node status patches (apply.py), evictions and the PodDisruptionBudgets of a
# refused one's namespace, listed to name them on the Node (drain.py).
TARGET_RULES: Final[Sequence[Mapping[str, Any]]] = (
    _rule("", ["nodes"], ["get", "list", "watch", "patch"]),
    _rule("", ["nodes/status"], ["patch"]),
    _rule("", ["pods"], ["list", "watch"]),
    _rule("", ["pods/eviction"], ["create"]),
    _rule("policy", ["poddisruptionbudgets"], ["list"]),
)
# Events about Nodes (events.py): created, read and patched to count a repeat up; listed for the evidence of a
# failure (preservation/evidence.py).
NODE_EVENT_RULES: Final[Sequence[Mapping[str, Any]]] = (_rule("", ["events"], ["create", "get", "list", "patch"]),)
# The evidence ConfigMaps in EVIDENCE_NAMESPACE (preservation/evidence.py): created, read back when one is there
# already, patched (replaced, its expiry set or cleared), listed and deleted by the sweep.
EVIDENCE_RULES: Final[Sequence[Mapping[str, Any]]] = (
    _rule("", ["configmaps"], ["create", "delete", "get", "list", "patch"]),
)

_SUBJECT: Final[Mapping[str, str]] = {
    "kind": "ServiceAccount",
    "name": SERVICE_ACCOUNT,
    "namespace": SERVICE_ACCOUNT_NAMESPACE,
}


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY_LABELS)}
    if namespace is not None:
        metadata["namespace"] = namespace
    return metadata


def rbac_objects() -> list[dict[str, Any]]:
    """ClusterRole + ClusterRoleBinding, Role + RoleBinding (events in `default`; the evidence ConfigMaps in
    EVIDENCE_NAMESPACE) for the controller's ServiceAccount in the shoot."""
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "name": SHOOT_OBJECT_NAME}
    return [
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "ClusterRole",
            "metadata": _metadata(SHOOT_OBJECT_NAME),
            "rules": [dict(rule) for rule in TARGET_RULES],
        },
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "ClusterRoleBinding",
            "metadata": _metadata(SHOOT_OBJECT_NAME),
            "roleRef": {**role_ref, "kind": "ClusterRole"},
            "subjects": [dict(_SUBJECT)],
        },
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "Role",
            "metadata": _metadata(SHOOT_OBJECT_NAME, NODE_EVENT_NAMESPACE),
            "rules": [dict(rule) for rule in NODE_EVENT_RULES],
        },
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "RoleBinding",
            "metadata": _metadata(SHOOT_OBJECT_NAME, NODE_EVENT_NAMESPACE),
            "roleRef": {**role_ref, "kind": "Role"},
            "subjects": [dict(_SUBJECT)],
        },
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "Role",
            "metadata": _metadata(SHOOT_OBJECT_NAME, v.EVIDENCE_NAMESPACE),
            "rules": [dict(rule) for rule in EVIDENCE_RULES],
        },
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "RoleBinding",
            "metadata": _metadata(SHOOT_OBJECT_NAME, v.EVIDENCE_NAMESPACE),
            "roleRef": {**role_ref, "kind": "Role"},
            "subjects": [dict(_SUBJECT)],
        },
    ]


def node_webhook_configurations(
    *,
    ca_bundle: bytes,
    url: str,
    timeout_seconds: int = wc.MAX_NODE_TIMEOUT_SECONDS,
    controller_username: str = CONTROLLER_USERNAME,
    mcm_usernames: Iterable[str] = (MCM_USERNAME,),
) -> list[dict[str, Any]]:
    """The shoot's node webhooks: validating `preserve-annotation.nodes`, mutating `ca-annotation.nodes` and
    `mcm-marker.nodes`, all calling `url` + path with `ca_bundle` (PEM) as the CA."""
    client = wc.ClientConfig(ca_bundle=ca_bundle, url=url)
    mcm = sorted(set(mcm_usernames))
    validating = wc.validating_configuration(
        name=WEBHOOK_CONFIGURATION,
        labels=MANAGED_BY_LABELS,
        webhooks=[
            wc.node_preserve_annotation_webhook(
                client=client,
                controller_username=controller_username,
                mcm_usernames=mcm,
                timeout_seconds=timeout_seconds,
            )
        ],
    )
    mutating = wc.mutating_configuration(
        name=WEBHOOK_CONFIGURATION,
        labels=MANAGED_BY_LABELS,
        webhooks=[
            wc.node_ca_annotation_webhook(
                client=client,
                controller_username=controller_username,
                mcm_usernames=mcm,
                timeout_seconds=timeout_seconds,
            ),
            wc.node_mcm_marker_webhook(client=client, mcm_usernames=mcm, timeout_seconds=timeout_seconds),
        ],
    )
    return [validating, mutating]


def node_annotation_policy(
    *,
    controller_username: str = CONTROLLER_USERNAME,
    mcm_usernames: Iterable[str] = (MCM_USERNAME,),
    name: str = NODE_ANNOTATION_POLICY,
) -> list[dict[str, Any]]:
    """ValidatingAdmissionPolicy + Binding on Node annotations, judged inside the shoot's API server for every
    identity (the webhooks leave kubelets, MCM and the controller out): nobody sets an auto value of the
    preserve annotation on a Node; only the controller and MCM touch MCM's CA marker; only the controller
    touches its own CA marker."""
    watched = [
        v.PRESERVE_ANNOTATION,
        v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,
        v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
    ]
    policy = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(name),
        "spec": {
            "failurePolicy": "Ignore",
            "matchConstraints": {
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
            },
            "matchConditions": [
                {"name": "preserve-or-marker-changes", "expression": wc.any_annotation_changed(watched)}
            ],
            "validations": [
                _no_auto_value_on_nodes(),
                *_markers_owned(controller_username=controller_username, mcm=sorted(set(mcm_usernames))),
            ],
        },
    }
    binding = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _metadata(name),
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def _no_auto_value_on_nodes() -> dict[str, Any]:
    """An auto value of the preserve annotation is never set on a Node (one already there may stay)."""
    preserve = v.PRESERVE_ANNOTATION
    quoted = wc.cel_string(preserve)
    value = f"object.metadata.annotations[{quoted}]"
    unchanged = f"({wc.has_annotation('oldObject', preserve)} && oldObject.metadata.annotations[{quoted}] == {value})"
    autos = ", ".join(wc.cel_string(auto) for auto in v.AUTO_PRESERVE_VALUES)
    auto_set = f"({wc.has_annotation('object', preserve)} && {value} in [{autos}] && !{unchanged})"
    supported = ", ".join(f'"{text}"' for text in ("", *v.USER_PRESERVE_VALUES))
    return {
        "expression": f"!{auto_set}",
        "reason": "Forbidden",
        "message": (
            f'metadata.annotations[{preserve}]: Forbidden: "auto-preserve" and "auto-preserved" are never '
            f"set on a Node (auto-preservation marks the Machine); supported values: {supported}"
        ),
    }


def _markers_owned(*, controller_username: str, mcm: list[str]) -> list[dict[str, Any]]:
    """MCM's CA marker is the controller's and MCM's to touch; ours, the controller's alone."""
    marker = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    own = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    return [
        {
            "expression": (
                f"request.userInfo.username in {wc.username_list([controller_username, *mcm])} || "
                f"!{wc.annotation_changed(marker)}"
            ),
            "reason": "Forbidden",
            "message": (
                f"metadata.annotations[{marker}]: Forbidden: only the preservation controller "
                f"({controller_username}) and MCM ({', '.join(mcm)}) may set, change or remove it"
            ),
        },
        {
            "expression": (
                f"request.userInfo.username in {wc.username_list([controller_username])} || "
                f"!{wc.annotation_changed(own)}"
            ),
            "reason": "Forbidden",
            "message": (
                f"metadata.annotations[{own}]: Forbidden: only the preservation controller "
                f"({controller_username}) may set, change or remove it"
            ),
        },
    ]


# The first Kubernetes version with both `matchConditions` (GA) and ValidatingAdmissionPolicy v1.
FULL_PROTECTION_SINCE: Final = (1, 30)
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?")


def kubernetes_gap(version: str) -> str:
    """Why a shoot of Kubernetes `version` cannot carry the node webhooks and the node annotation policy; empty
    where it can, or where the version is not known (Gardener always writes it; a test's Cluster may not).

    Before 1.30 the policy's API (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy) does not exist, and
    `matchConditions` is beta (1.28, 1.29: on by default, but a shoot may turn its feature gate off) or off: an
    API server without it drops the field and sends kubelets', MCM's and our own node updates to the webhook,
    which would judge them. So neither is installed there (half of them would protect nothing reliably), and the
    shoot is reported, not silently half-protected."""
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        return ""
    found = (int(match.group(1)), int(match.group(2)))
    if found >= FULL_PROTECTION_SINCE:
        return ""
    since = ".".join(map(str, FULL_PROTECTION_SINCE))
    return (
        f"the shoot's Kubernetes {version} lacks ValidatingAdmissionPolicy v1 and generally available webhook "
        f"matchConditions (both from {since}): the node webhooks and the node annotation policy are not installed, "
        f"so writes of the preserve annotation on Nodes are not checked; upgrade the shoot to Kubernetes {since} "
        "or later"
    )


def shoot_objects(
    *, ca_bundle: bytes, url: str, kubernetes_version: str = "", timeout_seconds: int = wc.MAX_NODE_TIMEOUT_SECONDS
) -> list[dict[str, Any]]:
    """Everything the ManagedResource puts into a shoot: the RBAC always (the lifecycle runs), the node webhooks
    and the policy only where the shoot's Kubernetes supports them (`kubernetes_gap`)."""
    if kubernetes_gap(kubernetes_version):
        return rbac_objects()
    return [
        *rbac_objects(),
        *node_webhook_configurations(ca_bundle=ca_bundle, url=url, timeout_seconds=timeout_seconds),
        *node_annotation_policy(),
    ]


# --- the ManagedResource ---------------------------------------------------------------------------------------


def _sort_key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    metadata = obj.get("metadata", {})
    return (obj.get("apiVersion", ""), obj.get("kind", ""), metadata.get("namespace", ""), metadata.get("name", ""))


def serialize_objects(objects: Iterable[Mapping[str, Any]]) -> bytes:
    """The objects as one multi-document YAML stream GRM reads; each document is JSON (valid YAML), keys
    sorted, documents in a fixed order, so equal objects give equal bytes."""
    documents = [json.dumps(obj, sort_keys=True, ensure_ascii=False) for obj in sorted(objects, key=_sort_key)]
    return ("---\n" + "\n---\n".join(documents) + "\n").encode() if documents else b""


def ca_bundle_digest(ca_bundle: bytes) -> str:
    """What the ManagedResource's CA_BUNDLE_ANNOTATION says: the bundle its node webhooks carry, as the certs
    manager can tell it from the bytes it stored."""
    return hashlib.sha256(ca_bundle).hexdigest()


def managed_resource(
    namespace: str, objects: Iterable[Mapping[str, Any]], *, ca_bundle: bytes | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data Secret and the ManagedResource, as Gardener's `managedresources.NewForShoot` builds them: no class
    (the shoot's GRM applies it in the shoot), the objects deleted with it (`keepObjects: false`; a migration sets
    `true` itself before deleting), `shoot.gardener.cloud/no-cleanup` injected into every object, the creator in
    `origin`; the Secret immutable, named after its content, labels included (a change makes a new one, the seed's
    GRM collects the old; so the extension never changes a data Secret and needs no right to). `ca_bundle`: the
    webhook CA bundle the objects were made with, named by digest for the certs manager (`bundle_pending`)."""
    data = {MANAGED_RESOURCE_DATA_KEY: base64.b64encode(serialize_objects(objects)).decode()}
    labels = {**MANAGED_BY_LABELS, ORIGIN_LABEL: ORIGIN, GARBAGE_COLLECTABLE_LABEL: "true"}
    checksum = hashlib.sha256(json.dumps([labels, data], sort_keys=True).encode()).hexdigest()[:8]
    name = f"{MANAGED_RESOURCE_SECRET}-{checksum}"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": data,
    }
    resource = {
        "apiVersion": "resources.gardener.cloud/v1alpha1",
        "kind": "ManagedResource",
        "metadata": {
            "name": MANAGED_RESOURCE,
            "namespace": namespace,
            "labels": {**MANAGED_BY_LABELS, ORIGIN_LABEL: ORIGIN},
            **({"annotations": {CA_BUNDLE_ANNOTATION: ca_bundle_digest(ca_bundle)}} if ca_bundle is not None else {}),
        },
        "spec": {
            "secretRefs": [{"name": name}],
            "injectLabels": {SHOOT_NO_CLEANUP_LABEL: "true"},
            "keepObjects": False,
        },
    }
    return secret, resource


def data_secrets(resource: Mapping[str, Any]) -> list[str]:
    """The names of the data Secrets a ManagedResource (as read) refers to."""
    refs = (resource.get("spec") or {}).get("secretRefs") or []
    return [str(ref["name"]) for ref in refs if isinstance(ref, Mapping) and ref.get("name")]


def keep_objects_patch(keep: bool = True) -> dict[str, Any]:
    """Merge patch of the ManagedResource: keep (migration) or delete (deletion) the shoot's objects with it."""
    return {"spec": {"keepObjects": keep}}


# --- how a shoot is served, for the Extension's ControlPlaneHealthy condition ----------------------------------


@dataclass(frozen=True)
class ObjectsApplied:
    """The ManagedResource's `ResourcesApplied` condition, as the shoot's GRM reports it."""

    namespace: str
    applied: bool
    message: str = ""
    reported: bool = True  # GRM has reported ResourcesApplied at all


def objects_applied(raw: Mapping[str, Any]) -> ObjectsApplied:
    """Read a ManagedResource (as the API serves it): is `ResourcesApplied` True, and what GRM says."""
    metadata = raw.get("metadata") or {}
    status = raw.get("status") or {}
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    condition = next(
        (c for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == RESOURCES_APPLIED),
        None,
    )
    applied = condition is not None and condition.get("status") == "True"
    message = str(condition.get("message") or "") if condition is not None else "not reported yet"
    return ObjectsApplied(
        namespace=str(metadata.get("namespace") or ""), applied=applied, message=message, reported=condition is not None
    )


def bundle_pending(resources: Iterable[Mapping[str, Any]], *, ca_bundle: bytes) -> tuple[str, ...]:
    """The namespaces whose ManagedResource (ours, as read) has not been applied in its shoot with `ca_bundle`:
    not made with it yet, or its GRM has not applied that generation (`status.observedGeneration` behind, or
    `ResourcesApplied` not True). One being deleted is not waited for."""
    digest = ca_bundle_digest(ca_bundle)
    pending = []
    for resource in resources:
        metadata = resource.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            continue
        status = resource.get("status") or {}
        current = (
            (metadata.get("annotations") or {}).get(CA_BUNDLE_ANNOTATION) == digest
            and status.get("observedGeneration") == metadata.get("generation")
            and objects_applied(resource).applied
        )
        if not current:
            pending.append(str(metadata.get("namespace") or ""))
    return tuple(sorted(pending))


@dataclass(frozen=True)
class ShootHealth:
    """The Extension's ControlPlaneHealthy condition, worded as Gardener's health-check library words it, and our own
    diagnosis of the shoot for Events, metrics and the log (never a condition False: a slow or unreachable API
    server is gardenlet's `APIServerAvailable`, a token not written yet is the shoot's GRM's)."""

    status: ConditionStatus
    reason: HealthReason
    message: str
    diagnosis: str = ""  # what is wrong with the shoot that is not ours to report False, for people

    @property
    def served(self) -> bool:
        return self.status is ConditionStatus.TRUE


ALL_SUCCESSFUL: Final = "All health checks successful"
HIBERNATED: Final = "Shoot is hibernated"


def shoot_health(
    *,
    hibernated: bool,
    running: bool,
    native: bool | None,
    problem: str,
    objects: ObjectsApplied | None,
    slow: str = "",
    gap: str = "",
) -> ShootHealth:
    """How the shoot is served, in Gardener's terms:
    - True (`HealthCheckSuccessful`) while hibernated ("Shoot is hibernated"), and while its lifecycle runs with
      every cache following the shoot and its GRM has applied our objects (RBAC, node webhooks, policy), however
      slowly its API server answers (`slow`, for people: the diagnosis);
    - Progressing (`HealthCheckProgressing`) while the lifecycle starts or waits for the shoot (its API server,
      the shoot-access token: `problem`, the diagnosis too) and while GRM has not reported on our objects yet;
    - False (`HealthCheckUnsuccessful`) where what is ours fails: GRM reports our objects not applied; and where
      the shoot's Kubernetes is too old for the node webhooks and policy (`gap`, kubernetes_gap; the diagnosis
      too): the shoot is served without them, and its owner must see that."""
    if hibernated:
        return ShootHealth(ConditionStatus.TRUE, HealthReason.SUCCESSFUL, HIBERNATED)
    if not running:
        waiting = problem or "the shoot's lifecycle is starting"
        return ShootHealth(
            ConditionStatus.PROGRESSING,
            HealthReason.PROGRESSING,
            f"Machine preservation is starting for the shoot: {waiting}",
            diagnosis=problem,
        )
    if objects is None or not objects.reported:
        return ShootHealth(
            ConditionStatus.PROGRESSING,
            HealthReason.PROGRESSING,
            "The node webhooks and RBAC are being applied in the shoot",
        )
    if not objects.applied:
        return ShootHealth(
            ConditionStatus.FALSE,
            HealthReason.UNSUCCESSFUL,
            f"The node webhooks and RBAC are not applied in the shoot: {objects.message}",
        )
    if gap:
        return ShootHealth(
            ConditionStatus.FALSE,
            HealthReason.UNSUCCESSFUL,
            f"Machine preservation runs without its node protection: {gap}",
            diagnosis=f"Machine preservation runs without its node protection: {gap}",
        )
    observe = " (MCM preserves natively: the extension observes)" if native else ""
    diagnosis = f"The shoot's API server answers slowly ({slow}): preservations wait for it." if slow else ""
    return ShootHealth(ConditionStatus.TRUE, HealthReason.SUCCESSFUL, ALL_SUCCESSFUL + observe, diagnosis=diagnosis)
