"""Validating/MutatingWebhookConfiguration builders: how the API server is told to call the webhook.

Production code: the Gardener extension puts the node configurations into every shoot (shoot_resources.py).
The standalone Helm chart renders the same registration, and tests/integration/test_chart_render.py compares
the chart's webhook configurations with these builders. The narrowing they encode:
- node rules (Nodes and nodes/status, which can carry metadata changes too) are called only when a relevant
  annotation changes (CEL `matchConditions`), never for kubelets (group `system:nodes`), MCM or the
  controller, with `failurePolicy: Ignore` and `timeoutSeconds` ≤ 5, so a webhook outage cannot block nodes;
- Machine and Shoot rules may fail closed; the deletion guard is only called for MCM's own deletes of
  Failed machines and of machines carrying our preservation record, so an outage never blocks MCM deleting
  the healthy machines nobody preserves; and never for a machine Gardener marked for forced deletion (it marks
  every machine of a Shoot it hibernates or deletes before MCM deletes them), so an outage never blocks
  hibernation or shoot deletion (force deletion's deletes are gardenlet's, never MCM's);
- Machine rules are namespaced: the chart pins them to their control namespace (`control_namespace_selector`),
  so several installs in one cluster each judge only their own.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import FORCE_DELETION_LABEL, FORCE_DELETION_VALUE
from machine_preservation.core.provider_config import EXTENSION_TYPE

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
MACHINE_PRESERVE_WEBHOOK: Final = f"preserve-annotation.machines.{DOMAIN}"
NODE_CA_WEBHOOK: Final = f"ca-annotation.nodes.{DOMAIN}"
NODE_MCM_MARKER_WEBHOOK: Final = f"mcm-marker.nodes.{DOMAIN}"
MACHINE_DELETION_WEBHOOK: Final = f"deletion.machines.{DOMAIN}"
SHOOT_WEBHOOK: Final = f"workers.shoots.{DOMAIN}"

MAX_NODE_TIMEOUT_SECONDS: Final = 5
KUBELET_GROUP: Final = "system:nodes"
# Set by the API server on every namespace.
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
PRESERVE_RELATED_ANNOTATIONS: Final = (v.PRESERVE_ANNOTATION, *v.CONTROLLER_OWNED_ANNOTATIONS)

FailurePolicy = Literal["Fail", "Ignore"]


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


def _username_not_in(usernames: Iterable[str]) -> str:
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


def _failed(obj: str) -> str:
    """CEL: the object's phase is Failed (every level checked, so a Machine without status is not)."""
    return (
        f"({obj} != null && has({obj}.status) && has({obj}.status.currentStatus) && "
        f"has({obj}.status.currentStatus.phase) && {obj}.status.currentStatus.phase == "
        f"{cel_string(v.MachinePhase.FAILED)})"
    )


def _failed_or_preserved(obj: str) -> str:
    """CEL: the object is Failed, or carries any key of our preservation record (in any phase)."""
    record = " || ".join(has_annotation(obj, key) for key in v.PRESERVATION_RECORD_ANNOTATIONS)
    return f"({_failed(obj)} || {record})"


def _not_force_deleted(obj: str) -> str:
    """CEL: the object does not carry MCM's forced-deletion mark."""
    label = cel_string(FORCE_DELETION_LABEL)
    return (
        f"!({obj} != null && has({obj}.metadata.labels) && {label} in {obj}.metadata.labels && "
        f"{obj}.metadata.labels[{label}] == {cel_string(FORCE_DELETION_VALUE)})"
    )


def control_namespace_selector(namespace: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A namespaceSelector for the control namespace only, narrowed further by `extra` (a label selector)."""
    selector = dict(extra or {})
    selector["matchLabels"] = {**selector.get("matchLabels", {}), NAMESPACE_NAME_LABEL: namespace}
    return selector


def _condition(name: str, expression: str) -> dict[str, str]:
    return {"name": name, "expression": expression}


def _node_exclusions(*, controller_username: str, mcm_usernames: Iterable[str]) -> list[dict[str, str]]:
    return [
        _condition("not-a-kubelet", f"!({cel_string(KUBELET_GROUP)} in request.userInfo.groups)"),
        _condition("not-mcm-or-controller", _username_not_in([controller_username, *mcm_usernames])),
    ]


def _rule(*, group: str, version: str, resources: Sequence[str], operations: Sequence[str]) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": [version],
        "operations": list(operations),
        "resources": list(resources),
        "scope": "*",
    }


def _webhook(
    *,
    name: str,
    client: ClientConfig,
    path: str,
    rules: list[dict[str, Any]],
    match_conditions: list[dict[str, str]],
    failure_policy: FailurePolicy,
    timeout_seconds: int,
    object_selector: Mapping[str, Any] | None,
    namespace_selector: Mapping[str, Any] | None,
) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": name,
        "clientConfig": client.for_path(path),
        "rules": rules,
        "matchConditions": match_conditions,
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": timeout_seconds,
        "admissionReviewVersions": ["v1"],
    }
    if object_selector is not None:
        webhook["objectSelector"] = dict(object_selector)
    if namespace_selector is not None:
        webhook["namespaceSelector"] = dict(namespace_selector)
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
    return _webhook(
        name=NODE_PRESERVE_WEBHOOK,
        client=client,
        path=PRESERVE_ANNOTATION_PATH,
        rules=[_rule(group="", version="v1", resources=["nodes", "nodes/status"], operations=["CREATE", "UPDATE"])],
        match_conditions=[
            _condition("preserve-annotations-change", any_annotation_changed(PRESERVE_RELATED_ANNOTATIONS)),
            *_node_exclusions(controller_username=controller_username, mcm_usernames=mcm_usernames),
        ],
        failure_policy="Ignore",
        timeout_seconds=_node_timeout(timeout_seconds),
        object_selector=object_selector,
        namespace_selector=None,
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
    webhook = _webhook(
        name=NODE_CA_WEBHOOK,
        client=client,
        path=CA_ANNOTATION_PATH,
        rules=[_rule(group="", version="v1", resources=["nodes", "nodes/status"], operations=["UPDATE"])],
        match_conditions=[
            _condition("ca-annotation-changes", annotation_changed(v.CA_SCALE_DOWN_DISABLED_ANNOTATION)),
            _condition("ca-annotation-not-true", f"!{still_true}"),
            _condition("node-preserved", f"{_preserved('oldObject')} || {_preserved('object')}"),
            *_node_exclusions(controller_username=controller_username, mcm_usernames=mcm_usernames),
        ],
        failure_policy="Ignore",
        timeout_seconds=_node_timeout(timeout_seconds),
        object_selector=object_selector,
        namespace_selector=None,
    )
    # Another mutating webhook could change the annotation after us; look again if so.
    webhook["reinvocationPolicy"] = "IfNeeded"
    return webhook


def node_mcm_marker_webhook(
    *,
    client: ClientConfig,
    mcm_usernames: Iterable[str],
    timeout_seconds: int = MAX_NODE_TIMEOUT_SECONDS,
    object_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Mutating, Nodes UPDATE by MCM: keep its CA marker off the nodes the controller preserves."""
    mcm_marker, ours = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    return _webhook(
        name=NODE_MCM_MARKER_WEBHOOK,
        client=client,
        path=MCM_MARKER_PATH,
        rules=[_rule(group="", version="v1", resources=["nodes", "nodes/status"], operations=["UPDATE"])],
        match_conditions=[
            _condition(
                "mcm-marker-added",
                f"!{has_annotation('oldObject', mcm_marker)} && {has_annotation('object', mcm_marker)}",
            ),
            _condition(
                "preserved-by-the-controller",
                f"{has_annotation('oldObject', ours)} && {has_annotation('object', ours)}",
            ),
            _condition("by-mcm", f"request.userInfo.username in {username_list(mcm_usernames)}"),
            _node_exclusions(controller_username="", mcm_usernames=())[0],
        ],
        failure_policy="Ignore",
        timeout_seconds=_node_timeout(timeout_seconds),
        object_selector=object_selector,
        namespace_selector=None,
    )


def machine_preserve_annotation_webhook(
    *,
    client: ClientConfig,
    controller_username: str,
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = 10,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Machines CREATE/UPDATE: preserve annotation values and the controller's markers."""
    return _webhook(
        name=MACHINE_PRESERVE_WEBHOOK,
        client=client,
        path=PRESERVE_ANNOTATION_PATH,
        rules=[
            _rule(
                group=v.MACHINE_API_GROUP,
                version=v.MACHINE_API_VERSION,
                resources=["machines"],
                operations=["CREATE", "UPDATE"],
            )
        ],
        match_conditions=[
            _condition("preserve-annotations-change", any_annotation_changed(PRESERVE_RELATED_ANNOTATIONS)),
            _condition("not-the-controller", _username_not_in([controller_username])),
        ],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        object_selector=None,
        namespace_selector=namespace_selector,
    )


def machine_deletion_webhook(
    *,
    client: ClientConfig,
    mcm_usernames: Iterable[str],
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = 10,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Machines DELETE, called for MCM's deletes of Failed machines and of machines carrying our
    preservation record only (only those are kept), unless Gardener marked the machine for forced deletion."""
    return _webhook(
        name=MACHINE_DELETION_WEBHOOK,
        client=client,
        path=MACHINE_DELETION_PATH,
        rules=[
            _rule(
                group=v.MACHINE_API_GROUP, version=v.MACHINE_API_VERSION, resources=["machines"], operations=["DELETE"]
            )
        ],
        match_conditions=[
            _condition("deleted-by-mcm", f"request.userInfo.username in {username_list(mcm_usernames)}"),
            _condition("machine-failed-or-preserved", _failed_or_preserved("oldObject")),
            _condition("not-force-deletion", _not_force_deleted("oldObject")),
        ],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        object_selector=None,
        namespace_selector=namespace_selector,
    )


def _workers_present(obj: str) -> str:
    return f"(has({obj}.spec) && has({obj}.spec.provider) && has({obj}.spec.provider.workers))"


def _extensions_present(obj: str) -> str:
    return f"(has({obj}.spec) && has({obj}.spec.extensions))"


def _pool_settings(obj: str) -> str:
    """Per pool what the Shoot admission judges: name, max, timeout and the max's bound (`maximum`,
    `systemComponents`), each as a list of zero or one item (so an absent field compares as absent, and typed
    fields of different kinds fit one list via `dyn`)."""
    mcm = "w.machineControllerManager"
    parts = [
        "has(w.name) ? [w.name] : []",
        f"has({mcm}) && has({mcm}.autoPreserveFailedMachineMax) ? [{mcm}.autoPreserveFailedMachineMax] : []",
        f"has({mcm}) && has({mcm}.machinePreserveTimeout) ? [{mcm}.machinePreserveTimeout] : []",
        "has(w.maximum) ? [w.maximum] : []",
        "has(w.systemComponents) ? [w.systemComponents] : []",
    ]
    projection = ", ".join(f"dyn({part})" for part in parts)
    return f"({_workers_present(obj)} ? {obj}.spec.provider.workers.map(w, [{projection}]) : [])"


def _preservation_extension(obj: str) -> str:
    """The Shoot's entries of this extension (its providerConfig, whether it is disabled)."""
    entries = f"{obj}.spec.extensions.filter(e, has(e.type) && e.type == '{EXTENSION_TYPE}')"
    return f"({_extensions_present(obj)} ? {entries} : [])"


def shoot_webhook(
    *,
    client: ClientConfig,
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = 10,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Shoots CREATE/UPDATE, called on UPDATE only when what the admission judges changes (a pool's
    preservation settings or their bound, the extension's entry): any other update (an image or version update,
    hibernation, a deletion's annotations) never reaches the webhook, so its outage cannot block it."""
    settings_changed = (
        "request.operation != 'UPDATE' || "
        f"{_pool_settings('object')} != {_pool_settings('oldObject')} || "
        f"{_preservation_extension('object')} != {_preservation_extension('oldObject')}"
    )
    return _webhook(
        name=SHOOT_WEBHOOK,
        client=client,
        path=SHOOT_PATH,
        rules=[
            _rule(
                group=v.SHOOT_API_GROUP,
                version=v.SHOOT_API_VERSION,
                resources=["shoots"],
                operations=["CREATE", "UPDATE"],
            )
        ],
        match_conditions=[_condition("preservation-settings-change", settings_changed)],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        object_selector=None,
        namespace_selector=namespace_selector,
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
