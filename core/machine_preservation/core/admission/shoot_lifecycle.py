"""Is the Shoot that owns a control namespace going away (hibernated, deleted, migrated)?

Gardener keeps a cluster-scoped `Cluster` resource (extensions.gardener.cloud/v1alpha1) per Shoot in the
seed, named after the Shoot's control namespace, with the whole Shoot as raw JSON in `spec.shoot`. What
the deletion guard reads from it, with Gardener's own meaning:
- hibernation: `spec.hibernation.enabled` is true (the Shoot's desired state is "hibernated"; Gardener
  then scales every worker pool to zero and marks the machines for forced deletion);
- deletion: the Shoot has a `metadata.deletionTimestamp`;
- migration of the control plane to another seed: `status.lastOperation.type` is `Migrate`.

A missing Cluster (not a Gardener seed, or not a Shoot namespace) means none of these. A Cluster whose
parts are not what Gardener writes is read as far as it makes sense: a part of the wrong type counts as
absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CLUSTER_API_GROUP: Final = "extensions.gardener.cloud"
CLUSTER_API_VERSION: Final = "v1alpha1"
CLUSTER_PLURAL: Final = "clusters"
MIGRATE_OPERATION: Final = "Migrate"


@dataclass(frozen=True)
class ShootLifecycle:
    """What the Shoot is going through, as its Cluster resource shows."""

    name: str = ""
    hibernated: bool = False
    deleted: bool = False
    migrated: bool = False

    def going_away(self) -> str:
        """Why every machine of the Shoot may go, for people; "" when none applies."""
        shoot = f'Shoot "{self.name}"' if self.name else "the Shoot"
        if self.deleted:
            return f"{shoot} is being deleted"
        if self.hibernated:
            return f"{shoot} is being hibernated"
        if self.migrated:
            return f"{shoot} is being migrated to another seed"
        return ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def shoot_lifecycle(cluster: Mapping[str, Any]) -> ShootLifecycle:
    """Read a Cluster object (as the API serves it)."""
    shoot = _mapping(_mapping(cluster.get("spec")).get("shoot"))
    metadata = _mapping(shoot.get("metadata"))
    hibernation = _mapping(_mapping(shoot.get("spec")).get("hibernation"))
    last_operation = _mapping(_mapping(shoot.get("status")).get("lastOperation"))
    name = metadata.get("name")
    return ShootLifecycle(
        name=name if isinstance(name, str) else "",
        hibernated=hibernation.get("enabled") is True,
        deleted=bool(metadata.get("deletionTimestamp")),
        migrated=last_operation.get("type") == MIGRATE_OPERATION,
    )
