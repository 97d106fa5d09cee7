"""The webhooks' registry, and the Validating/MutatingWebhookConfiguration builders: how the API server is told
to call the webhook.

`REGISTRY` names each webhook once: its path, the kind its reviews carry, its rules, failurePolicy, timeout and
the fields every registration shares. The server routes and answers by it (webhook/app.py: which paths, which
kinds on each, and how an internal error is answered), the builders here build from it, and the tests compare
every chart's rendered configurations with it (tests/webhook/configurations.py).

Production code: the Gardener extension puts the node configurations into every shoot (shoot_resources.py).
The narrowing they encode: node rules (Nodes and nodes/status, which can carry metadata changes too) are called
only when a relevant annotation changes (CEL `matchConditions`), never for kubelets (group `system:nodes`), MCM
or the controller, with `failurePolicy: Ignore` and `timeoutSeconds` ≤ 5, so a webhook outage cannot block nodes.
The Machine and Shoot registrations are the charts' own; tests/webhook/configurations.py builds them from the
blocks here, for the tests that register the webhook and compare the charts with them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from machine_preservation.core import vocabulary as v

# The URL paths the webhook server serves (webhook/app.py routes them), one per kind of review.
PRESERVE_ANNOTATION_PATH: Final = "/validate-preserve-annotation"
CA_ANNOTATION_PATH: Final = "/mutate-node-ca-annotation"
MCM_MARKER_PATH: Final = "/mutate-node-mcm-marker"
MACHINE_DELETION_PATH: Final = "/validate-machine-deletion"
SHOOT_PATH: Final = "/validate-shoot"
# The node endpoints as a shoot's kube-apiserver calls them when one webhook serves every shoot of a seed:
# SHOOT_PREFIX + the shoot's namespace in the seed + the endpoint's path.
SHOOT_PREFIX: Final = "/shoots/"


def shoot_path(namespace: str, path: str = "") -> str:
    """The URL path of node endpoint `path` (or of them all, without one) for the shoot of `namespace`."""
    return f"{SHOOT_PREFIX}{namespace}{path}"


DOMAIN: Final = "machine-preservation.sapcloud.io"
NODE_PRESERVE_WEBHOOK: Final = f"preserve-annotation.nodes.{DOMAIN}"
NODE_CA_WEBHOOK: Final = f"ca-annotation.nodes.{DOMAIN}"
NODE_MCM_MARKER_WEBHOOK: Final = f"mcm-marker.nodes.{DOMAIN}"
MACHINE_PRESERVE_WEBHOOK: Final = f"preserve-annotation.machines.{DOMAIN}"
MACHINE_DELETION_WEBHOOK: Final = f"deletion.machines.{DOMAIN}"
SHOOT_WEBHOOK: Final = f"workers.shoots.{DOMAIN}"

MAX_NODE_TIMEOUT_SECONDS: Final = 5
KUBELET_GROUP: Final = "system:nodes"
PRESERVE_RELATED_ANNOTATIONS: Final = (v.PRESERVE_ANNOTATION, *v.CONTROLLER_OWNED_ANNOTATIONS)

FailurePolicy = Literal["Fail", "Ignore"]
ConfigurationKind = Literal["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"]


@dataclass(frozen=True)
class Registration:
    """One webhook: how the API server is told to call it, and what the server answers there.

    `group`, `kind`: what its reviews carry (the server refuses another kind on the path); `failure_policy`,
    `timeout_seconds`: the defaults (an operator may choose Ignore and another timeout for Machines and Shoots;
    node webhooks are always Ignore, ≤ 5 s); `per_shoot`: also served under `shoot_path(namespace, path)`,
    the URL each shoot's kube-apiserver calls when one server serves every shoot of a seed."""

    name: str
    configuration: ConfigurationKind
    path: str
    group: str
    version: str
    kind: str
    resources: tuple[str, ...]
    operations: tuple[str, ...]
    failure_policy: FailurePolicy
    timeout_seconds: int
    per_shoot: bool = False
    reinvocation_policy: str | None = None  # mutating only
    side_effects: str = "None"  # no decision has side effects: dryRun requests take the same path
    match_policy: str = "Equivalent"
    admission_review_versions: tuple[str, ...] = field(default=("v1",))

    @property
    def group_kind(self) -> tuple[str, str]:
        return (self.group, self.kind)

    def rules(self) -> list[dict[str, Any]]:
        return [rule(group=self.group, version=self.version, resources=self.resources, operations=self.operations)]


def _node_webhook(
    name: str,
    configuration: ConfigurationKind,
    path: str,
    operations: tuple[str, ...],
    reinvocation_policy: str | None = None,
) -> Registration:
    """A node webhook: never blocks a node (Ignore, at most 5 s), served to every shoot too."""
    return Registration(
        name=name,
        configuration=configuration,
        path=path,
        group="",
        version="v1",
        kind="Node",
        resources=("nodes", "nodes/status"),  # nodes/status can carry metadata changes too
        operations=operations,
        failure_policy="Ignore",
        timeout_seconds=MAX_NODE_TIMEOUT_SECONDS,
        per_shoot=True,
        reinvocation_policy=reinvocation_policy,
    )


def _fail_closed_webhook(
    name: str, path: str, group: str, version: str, kind: str, operations: tuple[str, ...]
) -> Registration:
    """A Machine or Shoot webhook: fails closed by default (not node-critical), served on the plain path only."""
    return Registration(
        name=name,
        configuration="ValidatingWebhookConfiguration",
        path=path,
        group=group,
        version=version,
        kind=kind,
        resources=(kind.lower() + "s",),
        operations=operations,
        failure_policy="Fail",
        timeout_seconds=10,
    )


_VALIDATING: Final = "ValidatingWebhookConfiguration"
_MUTATING: Final = "MutatingWebhookConfiguration"
_CREATE_UPDATE: Final = ("CREATE", "UPDATE")
NODE_PRESERVE: Final = _node_webhook(NODE_PRESERVE_WEBHOOK, _VALIDATING, PRESERVE_ANNOTATION_PATH, _CREATE_UPDATE)
# Another mutating webhook could change the annotation after us; look again if so.
NODE_CA: Final = _node_webhook(
    NODE_CA_WEBHOOK, _MUTATING, CA_ANNOTATION_PATH, ("UPDATE",), reinvocation_policy="IfNeeded"
)
NODE_MCM_MARKER: Final = _node_webhook(NODE_MCM_MARKER_WEBHOOK, _MUTATING, MCM_MARKER_PATH, ("UPDATE",))
MACHINE_PRESERVE: Final = _fail_closed_webhook(
    MACHINE_PRESERVE_WEBHOOK,
    PRESERVE_ANNOTATION_PATH,
    v.MACHINE_API_GROUP,
    v.MACHINE_API_VERSION,
    "Machine",
    _CREATE_UPDATE,
)
MACHINE_DELETION: Final = _fail_closed_webhook(
    MACHINE_DELETION_WEBHOOK, MACHINE_DELETION_PATH, v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, "Machine", ("DELETE",)
)
SHOOT: Final = _fail_closed_webhook(
    SHOOT_WEBHOOK, SHOOT_PATH, v.SHOOT_API_GROUP, v.SHOOT_API_VERSION, "Shoot", _CREATE_UPDATE
)
# Every webhook, in the order the server lists the kinds it accepts on a path (Node before Machine).
REGISTRY: Final = (NODE_PRESERVE, NODE_CA, NODE_MCM_MARKER, MACHINE_PRESERVE, MACHINE_DELETION, SHOOT)


@dataclass(frozen=True)
class ClientConfig:
    """Where the API server reaches the webhook: a base URL, or a Service; plus the CA that signed it."""

    ca_bundle: bytes
    url: str = ""
    service_namespace: str = ""
    service_name: str = ""
    service_port: int = 443

    def for_path(self, path: str) -> dict[str, Any]:
        config: dict[str, Any] = {"caBundle": base64.b64encode(self.ca_bundle).decode()}
        if self.url:
            config["url"] = self.url.rstrip("/") + path
        else:
            config["service"] = {
                "namespace": self.service_namespace,
                "name": self.service_name,
                "port": self.service_port,
                "path": path,
            }
        return config


# --- CEL building blocks ---------------------------------------------------------------------------------


def cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def has_annotation(obj: str, key: str) -> str:
    return f"({obj} != null && has({obj}.metadata.annotations) && {cel_string(key)} in {obj}.metadata.annotations)"


def annotation_changed(key: str) -> str:
    """CEL: the annotation was added, removed or changed between oldObject (null on CREATE) and object."""
    new, old = has_annotation("object", key), has_annotation("oldObject", key)
    quoted = cel_string(key)
    return (
        f"({new} != {old} || ({new} && object.metadata.annotations[{quoted}] != "
        f"oldObject.metadata.annotations[{quoted}]))"
    )


def any_annotation_changed(keys: Iterable[str]) -> str:
    return " || ".join(annotation_changed(key) for key in keys)


def username_list(usernames: Iterable[str]) -> str:
    """CEL: a list literal of the usernames, deduplicated and sorted."""
    return "[" + ", ".join(cel_string(name) for name in sorted(set(usernames))) + "]"


def username_not_in(usernames: Iterable[str]) -> str:
    return f"!(request.userInfo.username in {username_list(usernames)})"


def _preserved(obj: str) -> str:
    # Our CA marker, or MCM's (its own preservation where it preserves natively; the webhook tells them apart).
    marker = (
        f"{has_annotation(obj, v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION)} || "
        f"{has_annotation(obj, v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION)}"
    )
    condition = (
        f"({obj} != null && has({obj}.status) && has({obj}.status.conditions) && "
        f"{obj}.status.conditions.exists(c, c.type == {cel_string(v.PRESERVED_CONDITION_TYPE)} && "
        "c.status == 'True'))"
    )
    return f"({marker} || {condition})"


def match_condition(name: str, expression: str) -> dict[str, str]:
    return {"name": name, "expression": expression}


def _node_exclusions(*, controller_username: str, mcm_usernames: Iterable[str]) -> list[dict[str, str]]:
    return [
        match_condition("not-a-kubelet", f"!({cel_string(KUBELET_GROUP)} in request.userInfo.groups)"),
        match_condition("not-mcm-or-controller", username_not_in([controller_username, *mcm_usernames])),
    ]


def rule(*, group: str, version: str, resources: Sequence[str], operations: Sequence[str]) -> dict[str, Any]:
    # scope "*": an installation narrows Machines to its namespaces by namespaceSelector.
    return {
        "apiGroups": [group],
        "apiVersions": [version],
        "operations": list(operations),
        "resources": list(resources),
        "scope": "*",
    }


def webhook_entry(
    registration: Registration,
    *,
    client: ClientConfig,
    match_conditions: list[dict[str, str]],
    failure_policy: FailurePolicy | None = None,
    timeout_seconds: int | None = None,
    object_selector: Mapping[str, Any] | None = None,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The webhook `registration` registers, reached through `client`; `failure_policy`, `timeout_seconds`: an
    operator's choice over the registration's (None: its own)."""
    webhook: dict[str, Any] = {
        "name": registration.name,
        "clientConfig": client.for_path(registration.path),
        "rules": registration.rules(),
        "matchConditions": match_conditions,
        "failurePolicy": registration.failure_policy if failure_policy is None else failure_policy,
        "matchPolicy": registration.match_policy,
        "sideEffects": registration.side_effects,
        "timeoutSeconds": registration.timeout_seconds if timeout_seconds is None else timeout_seconds,
        "admissionReviewVersions": list(registration.admission_review_versions),
    }
    if object_selector is not None:
        webhook["objectSelector"] = dict(object_selector)
    if namespace_selector is not None:
        webhook["namespaceSelector"] = dict(namespace_selector)
    if registration.reinvocation_policy is not None:
        webhook["reinvocationPolicy"] = registration.reinvocation_policy
    return webhook


def _node_timeout(timeout_seconds: int) -> int:
    if not 1 <= timeout_seconds <= MAX_NODE_TIMEOUT_SECONDS:
        raise ValueError(f"node webhooks need 1 ≤ timeoutSeconds ≤ {MAX_NODE_TIMEOUT_SECONDS}, got {timeout_seconds}")
    return timeout_seconds


# --- the six webhooks ------------------------------------------------------------------------------------


def node_preserve_annotation_webhook(
    *,
    client: ClientConfig,
    controller_username: str,
    mcm_usernames: Iterable[str],
    timeout_seconds: int = MAX_NODE_TIMEOUT_SECONDS,
    object_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Nodes CREATE/UPDATE: preserve annotation values and the controller's markers."""
    return webhook_entry(
        NODE_PRESERVE,
        client=client,
        match_conditions=[
            match_condition("preserve-annotations-change", any_annotation_changed(PRESERVE_RELATED_ANNOTATIONS)),
            *_node_exclusions(controller_username=controller_username, mcm_usernames=mcm_usernames),
        ],
        timeout_seconds=_node_timeout(timeout_seconds),
        object_selector=object_selector,
    )


def node_ca_annotation_webhook(
    *,
    client: ClientConfig,
    controller_username: str,
    mcm_usernames: Iterable[str],
    timeout_seconds: int = MAX_NODE_TIMEOUT_SECONDS,
    object_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Mutating, Nodes UPDATE: put the CA annotation back on preserved nodes."""
    key = cel_string(v.CA_SCALE_DOWN_DISABLED_ANNOTATION)
    present = has_annotation("object", v.CA_SCALE_DOWN_DISABLED_ANNOTATION)
    still_true = f"({present} && object.metadata.annotations[{key}] == 'true')"
    return webhook_entry(
        NODE_CA,
        client=client,
        match_conditions=[
            match_condition("ca-annotation-changes", annotation_changed(v.CA_SCALE_DOWN_DISABLED_ANNOTATION)),
            match_condition("ca-annotation-not-true", f"!{still_true}"),
            match_condition("node-preserved", f"{_preserved('oldObject')} || {_preserved('object')}"),
            *_node_exclusions(controller_username=controller_username, mcm_usernames=mcm_usernames),
        ],
        timeout_seconds=_node_timeout(timeout_seconds),
        object_selector=object_selector,
    )


def node_mcm_marker_webhook(
    *,
    client: ClientConfig,
    mcm_usernames: Iterable[str],
    timeout_seconds: int = MAX_NODE_TIMEOUT_SECONDS,
    object_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Mutating, Nodes UPDATE by MCM: keep its CA marker off the nodes the controller preserves."""
    mcm_marker, ours = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    return webhook_entry(
        NODE_MCM_MARKER,
        client=client,
        match_conditions=[
            match_condition(
                "mcm-marker-added",
                f"!{has_annotation('oldObject', mcm_marker)} && {has_annotation('object', mcm_marker)}",
            ),
            match_condition(
                "preserved-by-the-controller",
                f"{has_annotation('oldObject', ours)} && {has_annotation('object', ours)}",
            ),
            match_condition("by-mcm", f"request.userInfo.username in {username_list(mcm_usernames)}"),
            _node_exclusions(controller_username="", mcm_usernames=())[0],
        ],
        timeout_seconds=_node_timeout(timeout_seconds),
        object_selector=object_selector,
    )


def validating_configuration(
    *, name: str, webhooks: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "webhooks": [dict(webhook) for webhook in webhooks],
    }


def mutating_configuration(
    *, name: str, webhooks: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "webhooks": [dict(webhook) for webhook in webhooks],
    }
