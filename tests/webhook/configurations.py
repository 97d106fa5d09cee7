"""The webhook configurations the charts register for Machines and Shoots, built from the production blocks in
machine_preservation.core.webhook_configurations (which builds the node ones every shoot gets), for the tests
that register the webhook and compare the charts with them (tests/integration/test_chart_render.py).

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

from collections.abc import Iterable, Mapping
from typing import Any, Final

from machine_preservation.core import vocabulary as v
from machine_preservation.core import webhook_configurations as wc
from machine_preservation.core.admission.deletion import FORCE_DELETION_LABEL, FORCE_DELETION_VALUE
from machine_preservation.core.gardener.provider_config import EXTENSION_TYPE
from machine_preservation.core.webhook_configurations import (
    DOMAIN,
    NODE_CA_WEBHOOK,
    NODE_MCM_MARKER_WEBHOOK,
    NODE_PRESERVE_WEBHOOK,
    PRESERVE_RELATED_ANNOTATIONS,
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
    "shoot_webhook",
    "validating_configuration",
]

MACHINE_PRESERVE_WEBHOOK: Final = f"preserve-annotation.machines.{DOMAIN}"
MACHINE_DELETION_WEBHOOK: Final = f"deletion.machines.{DOMAIN}"
SHOOT_WEBHOOK: Final = f"workers.shoots.{DOMAIN}"
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
    failure_policy: wc.FailurePolicy = "Fail",
    timeout_seconds: int = 10,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Machines CREATE/UPDATE: preserve annotation values and the controller's markers."""
    return wc.webhook_entry(
        name=MACHINE_PRESERVE_WEBHOOK,
        client=client,
        path=wc.PRESERVE_ANNOTATION_PATH,
        rules=[
            wc.rule(
                group=v.MACHINE_API_GROUP,
                version=v.MACHINE_API_VERSION,
                resources=["machines"],
                operations=["CREATE", "UPDATE"],
            )
        ],
        match_conditions=[
            wc.match_condition(
                "preserve-annotations-change", wc.any_annotation_changed(wc.PRESERVE_RELATED_ANNOTATIONS)
            ),
            wc.match_condition("not-the-controller", wc.username_not_in([controller_username])),
        ],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        object_selector=None,
        namespace_selector=namespace_selector,
    )


def machine_deletion_webhook(
    *,
    client: wc.ClientConfig,
    mcm_usernames: Iterable[str],
    failure_policy: wc.FailurePolicy = "Fail",
    timeout_seconds: int = 10,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validating, Machines DELETE, called for MCM's deletes of Failed machines and of machines carrying our
    preservation record only (only those are kept), unless Gardener marked the machine for forced deletion."""
    return wc.webhook_entry(
        name=MACHINE_DELETION_WEBHOOK,
        client=client,
        path=wc.MACHINE_DELETION_PATH,
        rules=[
            wc.rule(
                group=v.MACHINE_API_GROUP, version=v.MACHINE_API_VERSION, resources=["machines"], operations=["DELETE"]
            )
        ],
        match_conditions=[
            wc.match_condition("deleted-by-mcm", f"request.userInfo.username in {wc.username_list(mcm_usernames)}"),
            wc.match_condition("machine-failed-or-preserved", _failed_or_preserved("oldObject")),
            wc.match_condition("not-force-deletion", _not_force_deleted("oldObject")),
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
    client: wc.ClientConfig,
    failure_policy: wc.FailurePolicy = "Fail",
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
    return wc.webhook_entry(
        name=SHOOT_WEBHOOK,
        client=client,
        path=wc.SHOOT_PATH,
        rules=[
            wc.rule(
                group=v.SHOOT_API_GROUP,
                version=v.SHOOT_API_VERSION,
                resources=["shoots"],
                operations=["CREATE", "UPDATE"],
            )
        ],
        match_conditions=[wc.match_condition("preservation-settings-change", settings_changed)],
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
        object_selector=None,
        namespace_selector=namespace_selector,
    )
