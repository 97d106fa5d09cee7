"""Keep the cluster-autoscaler's scale-down-disabled annotation on preserved nodes (mutating).

A node counts as preserved when its `Preserved` condition is True or the CA annotation's preservation marker
is present, before or after the request (a request that drops the marker too is still judged as on a
preserved node; the validating webhook then denies the marker change). The marker is ours
(`…/scale-down-disabled-by-preservation`), or MCM's `…-by-mcm` where MCM preserves natively; with an older
MCM, `…-by-mcm` only says that a rollout disabled scale-down, which is no preservation. If anyone but the
controller removes `cluster-autoscaler.kubernetes.io/scale-down-disabled` or changes it to anything but `"true"`,
the request is patched back to `"true"` with a warning, because the cluster-autoscaler only honours exactly `"true"`.

MCM v0.61 marks every node of a MachineDeployment with `…-by-mcm` while a rollout runs, and removes the CA
annotation from each node carrying that marker once the rollout is complete. On a node we preserve (our marker
before and after the request), MCM's request adding its marker is patched so that it does not: MCM's update then
changes nothing, and its clean-up later passes the node by. Where MCM preserves natively the marker is MCM's.
"""

from __future__ import annotations

from typing import Final

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import PatchOperation, Verdict, allow, escape_pointer_token
from machine_preservation.core.models import Node

RESTORED_WARNING: Final = (
    f'{v.CA_SCALE_DOWN_DISABLED_ANNOTATION} restored to "{v.CA_SCALE_DOWN_DISABLED_VALUE}": '
    "the node is preserved by machine-preservation"
)
MCM_MARKER_WARNING: Final = (
    f"{v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION} not added: machine-preservation keeps "
    f"{v.CA_SCALE_DOWN_DISABLED_ANNOTATION} on this preserved node"
)


def is_preserved_node(node: Node, *, mcm_native_preservation: bool) -> bool:
    condition = node.preserved_condition
    if condition is not None and condition.status == "True":
        return True
    annotations = node.metadata.annotations
    if v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION in annotations:
        return True
    return mcm_native_preservation and v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION in annotations


def guard_ca_annotation(
    *,
    old_node: Node | None,
    new_node: Node,
    annotations_present: bool,
    username: str,
    settings: AdmissionSettings,
) -> Verdict:
    """Allow untouched, or allow with a JSONPatch that puts `"true"` back and a warning.

    `annotations_present` tells whether the incoming object has a `metadata.annotations` map at all:
    RFC 6902 `add` needs the parent to exist, so without one the whole map is added.
    """
    if old_node is None or settings.is_controller(username):
        return allow()
    native = settings.mcm_native_preservation
    if not (
        is_preserved_node(old_node, mcm_native_preservation=native)
        or is_preserved_node(new_node, mcm_native_preservation=native)
    ):
        return allow()
    key = v.CA_SCALE_DOWN_DISABLED_ANNOTATION
    before = old_node.metadata.annotations.get(key)
    after = new_node.metadata.annotations.get(key)
    if after == v.CA_SCALE_DOWN_DISABLED_VALUE or after == before:
        return allow()
    if annotations_present:
        operation = PatchOperation(
            "add", f"/metadata/annotations/{escape_pointer_token(key)}", v.CA_SCALE_DOWN_DISABLED_VALUE
        )
    else:
        operation = PatchOperation("add", "/metadata/annotations", {key: v.CA_SCALE_DOWN_DISABLED_VALUE})
    return allow(warnings=(RESTORED_WARNING,), patch=(operation,))


def guard_mcm_marker(*, old_node: Node | None, new_node: Node, username: str, settings: AdmissionSettings) -> Verdict:
    """Allow untouched, or allow with a JSONPatch that takes out the `…-by-mcm` marker MCM adds to a node we
    preserve (see the module's docstring)."""
    if old_node is None or settings.mcm_native_preservation or not settings.is_mcm(username, namespace=None):
        return allow()
    ours = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    marker = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    before, after = old_node.metadata.annotations, new_node.metadata.annotations
    if not (ours in before and ours in after) or marker in before or marker not in after:
        return allow()
    operation = PatchOperation("remove", f"/metadata/annotations/{escape_pointer_token(marker)}")
    return allow(warnings=(MCM_MARKER_WARNING,), patch=(operation,))
