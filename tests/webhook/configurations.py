"""The webhook configuration builders, for the tests that register the webhook or compare the chart with them.

They are production code now (machine_preservation.core.webhook_configurations: the Gardener extension puts
the node configurations into every shoot); this module keeps the tests' import path.
"""

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
    control_namespace_selector,
    machine_deletion_webhook,
    machine_preserve_annotation_webhook,
    mutating_configuration,
    node_ca_annotation_webhook,
    node_mcm_marker_webhook,
    node_preserve_annotation_webhook,
    shoot_webhook,
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
