"""The calls an identity made, from the API server's audit log, against the RBAC a chart grants it.

tests/e2e/product.py's audit policy records every request of a ServiceAccount (at least its metadata). Each becomes
a `Call` as the authorizer sees it: verb, API group, resource (with subresource), namespace and name (none for a
create: RBAC cannot name what does not exist yet; a list or watch with the field selector `metadata.name` names it).
Each (ClusterRole|Role)Binding of the rendered chart for that ServiceAccount expands into `Grant`s, one per verb,
resource and name of a rule, where it applies. Comparing the two both ways shows what the code calls that RBAC does
not allow (`missing`) and what RBAC allows that the code never called (`unused`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str  # "secrets", "extensions/status"
    namespace: str  # "" for cluster-scoped objects
    name: str  # "" when the request names no object (a create, a list without the name's field selector)


@dataclass(frozen=True)
class Grant:
    verb: str
    group: str
    resource: str
    name: str  # "" for any name
    namespace: str  # "" for every namespace (a ClusterRole bound cluster-wide)

    def allows(self, call: Call) -> bool:
        return (
            self.verb in ("*", call.verb)
            and self.group in ("*", call.group)
            and self.resource in ("*", call.resource)
            and self.name in ("", call.name)
            and self.namespace in ("", call.namespace)
        )


def calls(audit_log: Path, user: str) -> set[Call]:
    """Every resource request of `user` the API server logged (non-resource URLs such as /version are left out:
    every authenticated identity may call those)."""
    found: set[Call] = set()
    with audit_log.open("rb") as log:
        for line in log:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                ref = event.get("objectRef")
                if (event.get("user") or {}).get("username") != user or not ref or not ref.get("resource"):
                    continue
                verb = event.get("verb", "")
                resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                found.add(
                    Call(
                        verb=verb,
                        group=ref.get("apiGroup", ""),
                        resource=resource,
                        namespace=ref.get("namespace", ""),
                        name="" if verb == "create" else ref.get("name", ""),
                    )
                )
    return found


def grants(documents: Iterable[Mapping[str, Any]], *, namespace: str, service_account: str) -> set[Grant]:
    """What the rendered RBAC in `documents` grants ServiceAccount `namespace/service_account`."""
    documents = list(documents)
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in documents}
    found: set[Grant] = set()
    for binding in documents:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == service_account and s.get("namespace") == namespace
            for s in binding.get("subjects") or []
        ):
            continue
        where = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
        ref = binding["roleRef"]
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else "", ref["name"])]
        for rule in role.get("rules") or []:
            for verb in rule["verbs"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for name in rule.get("resourceNames") or [""]:
                            found.add(Grant(verb, group, resource, name, where))
    return found


def missing(made: Iterable[Call], granted: Iterable[Grant]) -> set[Call]:
    """The calls no grant allows."""
    granted = list(granted)
    return {call for call in made if not any(grant.allows(call) for grant in granted)}


def unused(made: Iterable[Call], granted: Iterable[Grant]) -> set[Grant]:
    """The grants no call needed."""
    made = list(made)
    return {grant for grant in granted if not any(grant.allows(call) for call in made)}
