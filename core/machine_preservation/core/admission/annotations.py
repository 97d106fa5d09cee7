"""Who may write which preserve-related annotation value on Nodes and Machines.

- `node.machine.sapcloud.io/preserve`: absent, `""`, `now`, `when-failed`, `false` for everyone; the auto
  value (`auto-preserve`, and upstream's `auto-preserved`) only from the controller's identity. Exact,
  case-sensitive strings; whitespace is part of the value.
- the controller-owned markers (core.vocabulary.CONTROLLER_OWNED_ANNOTATIONS) change only through the
  controller's identity; the CA `-by-mcm` marker also through MCM's identities, because upstream MCM sets it
  itself during rolling updates.
- MCM's identities are its exact usernames, and for a Machine also its ServiceAccount in the Machine's namespace
  (`namespace`; settings.mcm_service_accounts).
- when the cluster's MCM preserves natively (settings.mcm_native_preservation), MCM's identities may also
  write their own auto value (`auto-preserved`, not ours) and the last-applied node value: MCM runs the
  lifecycle then and writes both itself. Users still may not.
- on UPDATE an annotation whose value did not change is not judged again, so an object that already carries
  a bad value can still be updated otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.field_errors import FieldError, aggregate, forbidden, not_supported, root
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import Verdict, allow, deny

_ANNOTATIONS = root("metadata", "annotations")
_MCM_MAY_CHANGE = frozenset({v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION})
_NATIVE_MCM_MAY_CHANGE = frozenset({v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION})


def annotation_errors(
    *,
    old: Mapping[str, str] | None,
    new: Mapping[str, str],
    username: str,
    settings: AdmissionSettings,
    namespace: str | None = None,
) -> tuple[FieldError, ...]:
    """Every rule the change from `old` (None on CREATE) to `new` breaks, in a stable order. `namespace`: the
    object's (None for a Node)."""
    previous: Mapping[str, str] = old or {}
    errors: list[FieldError] = []
    is_controller = settings.is_controller(username)
    is_mcm = settings.is_mcm(username, namespace=namespace)
    native_mcm = settings.mcm_native_preservation and is_mcm

    value = new.get(v.PRESERVE_ANNOTATION)
    # A native MCM writes its own auto value: that is its auto-preservation, not a user's.
    mcm_auto = native_mcm and value == v.UPSTREAM_AUTO_PRESERVE_VALUE
    if value is not None and value != previous.get(v.PRESERVE_ANNOTATION) and not mcm_auto:
        path = _ANNOTATIONS.key(v.PRESERVE_ANNOTATION)
        if value in v.AUTO_PRESERVE_VALUES and not is_controller:
            supported = ", ".join(f'"{option}"' for option in v.USER_ALLOWED_VALUES)
            errors.append(
                forbidden(
                    path,
                    f'the value "{value}" is reserved for the preservation controller '
                    f"({settings.controller_shown}); supported values: {supported}",
                )
            )
        elif value not in v.USER_ALLOWED_VALUES and value not in v.AUTO_PRESERVE_VALUES:
            errors.append(not_supported(path, value, v.USER_ALLOWED_VALUES))

    for key in v.CONTROLLER_OWNED_ANNOTATIONS:
        if new.get(key) == previous.get(key) or is_controller:
            continue
        if key in _MCM_MAY_CHANGE and is_mcm:
            continue
        if key in _NATIVE_MCM_MAY_CHANGE and native_mcm:
            continue
        errors.append(
            forbidden(
                _ANNOTATIONS.key(key),
                f"only the preservation controller ({settings.controller_shown}) may set, change or remove it",
            )
        )
    return tuple(errors)


def judge_annotations(
    *,
    subject: str,
    old: Mapping[str, str] | None,
    new: Mapping[str, str],
    username: str,
    settings: AdmissionSettings,
    namespace: str | None = None,
) -> Verdict:
    """Allow, or deny naming the object (`subject`, e.g. `Node "n1"`) and every broken rule."""
    errors = annotation_errors(old=old, new=new, username=username, settings=settings, namespace=namespace)
    if not errors:
        return allow()
    return deny(f"{subject}: {aggregate(errors)}")
