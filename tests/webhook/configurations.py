"""The webhook configurations the charts register for Machines and Shoots, built from the production blocks in
machine_preservation.core.webhook_configurations (which builds the node ones every shoot gets), for the tests
that register the webhook and compare the charts with them (tests/integration/test_chart_render.py); and
`registration_problems`, the oracle every chart's rendered configurations are held to: the registry
(`REGISTRY`), which the server routes and answers by too.

The narrowing they encode:
- Machine and Shoot rules may fail closed; the deletion guard is only called for MCM's own deletes of
  Failed machines and of machines carrying our preservation record, so an outage never blocks MCM deleting
  the healthy machines nobody preserves; and never for a machine Gardener marked for forced deletion (it marks
  every machine of a Shoot it hibernates or deletes before MCM deletes them), so an outage never blocks
  hibernation or shoot deletion (force deletion's deletes are gardenlet's, never MCM's);
- Machine rules are namespaced: the chart pins them to their control namespace (`control_namespace_selector`),
  so several installs in one cluster each judge only their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import urlparse

from machine_preservation.core import vocabulary as v
from machine_preservation.core import webhook_configurations as wc
from machine_preservation.core.admission.deletion import FORCE_DELETION_LABEL, FORCE_DELETION_VALUE
from machine_preservation.core.gardener.provider_config import EXTENSION_TYPE
from machine_preservation.core.webhook_configurations import (
    MACHINE_DELETION_WEBHOOK,
    MACHINE_PRESERVE_WEBHOOK,
    NODE_CA_WEBHOOK,
    NODE_MCM_MARKER_WEBHOOK,
    NODE_PRESERVE_WEBHOOK,
    PRESERVE_RELATED_ANNOTATIONS,
    SHOOT_WEBHOOK,
    ClientConfig,
    FailurePolicy,
    annotation_changed,
    any_annotation_changed,
    mutating_configuration,
    node_ca_annotation_webhook,
    node_mcm_marker_webhook,
    node_preserve_annotation_webhook,
    validating_configuration,
)

__all__ = [
    "MACHINE_DELETION_WEBHOOK",
    "MACHINE_PRESERVE_WEBHOOK",
    "NODE_CA_WEBHOOK",
    "NODE_MCM_MARKER_WEBHOOK",
    "NODE_PRESERVE_WEBHOOK",
    "PRESERVE_RELATED_ANNOTATIONS",
    "SHOOT_WEBHOOK",
    "Chosen",
    "ClientConfig",
    "FailurePolicy",
    "annotation_changed",
    "any_annotation_changed",
    "control_namespace_selector",
    "machine_deletion_webhook",
    "machine_preserve_annotation_webhook",
    "mutating_configuration",
    "node_ca_annotation_webhook",
    "node_mcm_marker_webhook",
    "node_preserve_annotation_webhook",
    "registration_problems",
    "shoot_webhook",
    "validating_configuration",
]

# Set by the API server on every namespace.
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"


def _failed(obj: str) -> str:
    """CEL: the object's phase is Failed (every level checked, so a Machine without status is not)."""
    return (
        f"({obj} != null && has({obj}.status) && has({obj}.status.currentStatus) && "
        f"has({obj}.status.currentStatus.phase) && {obj}.status.currentStatus.phase == "
        f"{wc.cel_string(v.MachinePhase.FAILED)})"
    )


def _failed_or_preserved(obj: str) -> str:
    """CEL: the object is Failed, or carries any key of our preservation record (in any phase)."""
    record = " || ".join(wc.has_annotation(obj, key) for key in v.PRESERVATION_RECORD_ANNOTATIONS)
    return f"({_failed(obj)} || {record})"


def _not_force_deleted(obj: str) -> str:
    """CEL: the object does not carry MCM's forced-deletion mark."""
    label = wc.cel_string(FORCE_DELETION_LABEL)
    return (
        f"!({obj} != null && has({obj}.metadata.labels) && {label} in {obj}.metadata.labels && "
        f"{obj}.metadata.labels[{label}] == {wc.cel_string(FORCE_DELETION_VALUE)})"
    )


def control_namespace_selector(namespace: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A namespaceSelector for the control namespace only, narrowed further by `extra` (a label selector)."""
    selector = dict(extra or {})
    selector["matchLabels"] = {**selector.get("matchLabels", {}), NAMESPACE_NAME_LABEL: namespace}
    return selector


def machine_preserve_annotation_webhook(
    *,
    client: wc.ClientConfig,
    controller_username: str,
    failure_policy: wc.FailurePolicy | None = None,
    timeout_seconds: int | None = None,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Machines CREATE/UPDATE: preserve annotation values and the controller's markers."""
    return wc.webhook_entry(
        wc.MACHINE_PRESERVE,
        client=client,
        match_conditions=[
            wc.match_condition(
                "preserve-annotations-change", wc.any_annotation_changed(wc.PRESERVE_RELATED_ANNOTATIONS)
            ),
            wc.match_condition("not-the-controller", wc.username_not_in([controller_username])),
        ],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        namespace_selector=namespace_selector,
    )


def machine_deletion_webhook(
    *,
    client: wc.ClientConfig,
    mcm_usernames: Iterable[str],
    failure_policy: wc.FailurePolicy | None = None,
    timeout_seconds: int | None = None,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Machines DELETE, called for MCM's deletes of Failed machines and of machines carrying our
    preservation record only (only those are kept), unless Gardener marked the machine for forced deletion."""
    return wc.webhook_entry(
        wc.MACHINE_DELETION,
        client=client,
        match_conditions=[
            wc.match_condition("deleted-by-mcm", f"request.userInfo.username in {wc.username_list(mcm_usernames)}"),
            wc.match_condition("machine-failed-or-preserved", _failed_or_preserved("oldObject")),
            wc.match_condition("not-force-deletion", _not_force_deleted("oldObject")),
        ],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
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
    client: wc.ClientConfig,
    failure_policy: wc.FailurePolicy | None = None,
    timeout_seconds: int | None = None,
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
    return wc.webhook_entry(
        wc.SHOOT,
        client=client,
        match_conditions=[wc.match_condition("preservation-settings-change", settings_changed)],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        namespace_selector=namespace_selector,
    )


# --- the oracle: rendered configurations against the registry ----------------------------------------------------

# By webhook name, what an operator chose over the registry's defaults: "failurePolicy" (Machines and Shoots
# only), "timeoutSeconds".
Chosen = Mapping[str, Mapping[str, Any]]
_SHOOT_PATH = re.compile(re.escape(wc.SHOOT_PREFIX) + r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)")
_REGISTERED: Final = {registration.name: registration for registration in wc.REGISTRY}
# A rule's scope is the installation's to narrow (the seed chart's Machine rules are Namespaced).
_RULE_KEYS: Final = ("apiGroups", "apiVersions", "operations", "resources")


def _path(client_config: Mapping[str, Any]) -> str:
    if "service" in client_config:
        return str(client_config["service"].get("path", ""))
    return urlparse(client_config["url"]).path


def _path_problem(registration: wc.Registration, path: str) -> str:
    if path == registration.path:
        return ""
    per_shoot = _SHOOT_PATH.fullmatch(path)
    if registration.per_shoot and per_shoot is not None and per_shoot.group(2) == registration.path:
        return ""
    return f"path {path!r}, registered {registration.path!r}"


def _webhook_problems(kind: str, webhook: Mapping[str, Any], chosen: Mapping[str, Any]) -> list[str]:
    registration = _REGISTERED.get(webhook["name"])
    if registration is None:
        return ["not in the registry"]
    if "failurePolicy" in chosen and registration.failure_policy == "Ignore":
        return ["a node webhook's failurePolicy is never the operator's to choose"]
    expected = {
        "kind": registration.configuration,
        "rules": [{key: r[key] for key in _RULE_KEYS} for r in registration.rules()],
        "failurePolicy": chosen.get("failurePolicy", registration.failure_policy),
        "timeoutSeconds": chosen.get("timeoutSeconds", registration.timeout_seconds),
        "sideEffects": registration.side_effects,
        "matchPolicy": registration.match_policy,
        "admissionReviewVersions": list(registration.admission_review_versions),
        "reinvocationPolicy": registration.reinvocation_policy,
    }
    found = {
        **{key: webhook.get(key) for key in expected},
        "kind": kind,
        "rules": [{key: r.get(key) for key in _RULE_KEYS} for r in webhook.get("rules", [])],
    }
    problems = [
        f"{key} {found[key]!r}, registered {expected[key]!r}" for key in expected if found[key] != expected[key]
    ]
    path = _path_problem(registration, _path(webhook["clientConfig"]))
    return [*problems, path] if path else problems


def registration_problems(documents: Iterable[Mapping[str, Any]], *, chosen: Chosen | None = None) -> list[str]:
    """Where the webhooks of the Validating/MutatingWebhookConfigurations among `documents` differ from the
    registry: a name it does not know, another configuration kind, path, rules, failurePolicy, timeoutSeconds
    (but as `chosen`), sideEffects, matchPolicy, admissionReviewVersions or reinvocationPolicy. [] when none."""
    problems = []
    for document in documents:
        kind = document.get("kind")
        if kind not in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            continue
        for webhook in document.get("webhooks", []):
            for problem in _webhook_problems(kind, webhook, (chosen or {}).get(webhook["name"], {})):
                problems.append(f"{webhook['name']}: {problem}")
    return problems
