"""Gardener's objects as the product reads them, in one place: the seed's `Cluster` and the Shoot it carries
(worker pools, zones, the extension's providerConfig), what the Shoot is going through (hibernation, deletion,
migration), and how Gardener spreads a pool's value over its zones.

Gardener keeps a cluster-scoped `Cluster` resource (extensions.gardener.cloud/v1alpha1) per Shoot in the seed,
named after the Shoot's control namespace, with the whole Shoot as raw JSON in `spec.shoot`. Every reader here is
lenient: a part that is not what Gardener writes counts as absent (or is reported by name), never an error.

- Lifecycle, with Gardener's own meaning: hibernation is `spec.hibernation.enabled` true (Gardener then scales
  every worker pool to zero and marks the machines for forced deletion); deletion is a `metadata.deletionTimestamp`;
  migration of the control plane to another seed is `status.lastOperation.type` `Migrate`. A missing Cluster (not
  a Gardener seed, or not a Shoot namespace) means none of these.
- Zones: Gardener's `DistributeOverZones`: every zone gets `total // zones`, and the first `total % zones` zones
  get one more (the remainder goes to the first zones, whatever its doc comment says).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener.provider_config import (
    InvalidPreservationConfig,
    PreservationConfig,
    parse_preservation_config,
    preservation_extension,
)
from machine_preservation.core.models import KubeModel, ObjectMeta, mapping_of

CLUSTER_API_GROUP: Final = "extensions.gardener.cloud"
CLUSTER_API_VERSION: Final = "v1alpha1"
CLUSTER_PLURAL: Final = "clusters"
MIGRATE_OPERATION: Final = "Migrate"
WORKER_POOL_LABEL: Final = "worker.gardener.cloud/pool"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
DEPRECATED_ZONE_LABEL: Final = "failure-domain.beta.kubernetes.io/zone"
GENERIC_KUBECONFIG_ANNOTATION: Final = "generic-token-kubeconfig.secret.gardener.cloud/name"
# On a Shoot: the owner confirmed its force deletion (Gardener then force-deletes its extensions).
FORCE_DELETION_ANNOTATION: Final = "confirmation.gardener.cloud/force-deletion"


# --- The Cluster and its Shoot ---------------------------------------------------------------------------


def _strings(value: Any) -> list[str] | None:
    return value if isinstance(value, list) and all(isinstance(item, str) for item in value) else None


class ShootWorker(KubeModel):
    """A worker pool of the Shoot. Lenient: a malformed part is kept as None (or dropped), never an error; the
    setting values stay raw so that a bad one is reported by name, not lost."""

    name: str = ""
    zones: list[str] | None = Field(default_factory=list)  # None: present but not a list of strings
    machine_controller_manager: dict[str, Any] | None = None
    # An earlier iteration of the API had the max at the worker level.
    auto_preserve_failed_machine_max: Any = None
    maximum: Any = None
    system_components: Any = None

    def auto_preserve_bound(self) -> int | None:
        """The largest max Gardener's admission lets this pool have; None when `maximum` is not an integer."""
        if not isinstance(self.maximum, int) or isinstance(self.maximum, bool):
            return None
        return auto_preserve_bound(maximum=self.maximum, system_components=self.system_components)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return value if isinstance(value, str) else ""

    @field_validator("zones", mode="before")
    @classmethod
    def _zones(cls, value: Any) -> Any:
        return [] if value is None else _strings(value)

    @field_validator("machine_controller_manager", mode="before")
    @classmethod
    def _settings(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else None


class ShootProvider(KubeModel):
    workers: list[ShootWorker] = Field(default_factory=list)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        return [worker for worker in value if isinstance(worker, dict)] if isinstance(value, list) else []


class ShootSpec(KubeModel):
    provider: ShootProvider = Field(default_factory=ShootProvider)

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else {}


class Shoot(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ShootSpec = Field(default_factory=ShootSpec)

    @field_validator("spec", mode="before")
    @classmethod
    def _spec(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else {}

    def worker(self, pool: str) -> ShootWorker | None:
        return next((worker for worker in self.spec.provider.workers if worker.name == pool), None)


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


def shoot_lifecycle(cluster: Mapping[str, Any]) -> ShootLifecycle:
    """Read a Cluster object (as the API serves it)."""
    shoot = mapping_of(mapping_of(cluster.get("spec")).get("shoot"))
    metadata = mapping_of(shoot.get("metadata"))
    hibernation = mapping_of(mapping_of(shoot.get("spec")).get("hibernation"))
    last_operation = mapping_of(mapping_of(shoot.get("status")).get("lastOperation"))
    name = metadata.get("name")
    return ShootLifecycle(
        name=name if isinstance(name, str) else "",
        hibernated=hibernation.get("enabled") is True,
        deleted=bool(metadata.get("deletionTimestamp")),
        migrated=last_operation.get("type") == MIGRATE_OPERATION,
    )


class ClusterView(BaseModel):
    """A `Cluster` as the product reads it, parsed once per watch event and read by everyone who needs it: its
    name and Shoot, or why there is no usable Shoot; the Shoot's extension providerConfig, or why it is ignored;
    what the Shoot is going through; and what the Extension contract reads (the generic kubeconfig Secret, a
    failed last operation, force deletion, the Kubernetes version)."""

    model_config = ConfigDict(frozen=True)

    name: str = ""  # the shoot's control namespace
    shoot: Shoot | None = None
    problem: str | None = None  # set when the Cluster exists but its Shoot cannot be read
    provider_config: PreservationConfig | None = None
    provider_config_path: str = ""  # e.g. spec.extensions[0].providerConfig
    provider_config_problem: str | None = None  # set when the providerConfig does not decode
    lifecycle: ShootLifecycle = ShootLifecycle()
    failed: bool = False  # the shoot's last operation failed: Gardener's extensions leave it alone
    kubeconfig_secret: str = ""  # the generic token kubeconfig Secret's name
    # The Shoot is annotated for force deletion: its Extension is force-deleted (nothing may wait for the shoot).
    force_deletion: bool = False
    kubernetes_version: str = ""  # the Shoot's `spec.kubernetes.version`; empty where the Cluster carries none
    # The Shoot as the Cluster carries it, cut to what is read (`cluster_as_read`): its pools judge a providerConfig.
    shoot_document: dict[str, Any] | None = None


def read_cluster(raw: Any) -> ClusterView:
    """Read a `Cluster` object as the API serves it; never raises. `spec.cloudProfile` and `spec.seed` are not
    needed and are not read."""
    if not isinstance(raw, Mapping):
        return ClusterView(problem="the Cluster is not a JSON object")
    metadata = mapping_of(raw.get("metadata"))
    name = metadata.get("name")
    name = name if isinstance(name, str) else ""
    secret = mapping_of(metadata.get("annotations")).get(GENERIC_KUBECONFIG_ANNOTATION)
    read: dict[str, Any] = {"name": name, "kubeconfig_secret": secret if isinstance(secret, str) else ""}
    shoot, problem = _shoot_of(raw, name)
    if shoot is None:
        return ClusterView(**read, problem=problem)
    carried = {"spec": {"shoot": shoot}}
    read |= {
        "lifecycle": shoot_lifecycle(carried),
        "failed": contract.shoot_failed(carried),
        "force_deletion": _go_bool(_shoot_annotations(shoot).get(FORCE_DELETION_ANNOTATION)),
        "kubernetes_version": _kubernetes_version(shoot),
        "shoot_document": _trimmed_shoot(shoot),
    }
    try:
        model = Shoot.model_validate(dict(shoot))
    except (ValidationError, RecursionError) as error:
        return ClusterView(**read, problem=f"Cluster {name}: spec.shoot cannot be read ({_first_line(error)})")
    extension = preservation_extension(shoot)
    if extension is None or extension.provider_config is None:
        return ClusterView(**read, shoot=model)
    path = str(extension.path)
    try:
        config = parse_preservation_config(extension.provider_config, path=extension.path)
    except InvalidPreservationConfig as error:
        problem = f"Shoot {model.metadata.name} {path} is ignored, it does not decode: {error}"
        return ClusterView(**read, shoot=model, provider_config_path=path, provider_config_problem=problem)
    return ClusterView(**read, shoot=model, provider_config=config, provider_config_path=path)


def _shoot_of(raw: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any] | None, str | None]:
    """The Shoot a Cluster carries, or why there is none to read."""
    spec = raw.get("spec")
    shoot: Any = spec.get("shoot") if isinstance(spec, Mapping) else None
    if shoot is None:
        return None, f"Cluster {name} has no spec.shoot"
    if isinstance(shoot, (str, bytes)):  # raw JSON as a string, as some clients write a RawExtension
        try:
            shoot = json.loads(shoot)
        except (ValueError, RecursionError):
            return None, f"Cluster {name}: spec.shoot is not valid JSON"
    if not isinstance(shoot, Mapping):
        return None, f"Cluster {name}: spec.shoot is not a JSON object"
    return shoot, None


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


def cluster_as_read(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a `Cluster` that `read_cluster` and `shoot_lifecycle` read, as the API serves them, so that
    both read the same from it as from the whole: its name and generic kubeconfig annotation; the Shoot's metadata
    (without managedFields), its workers, extensions, hibernation, Kubernetes version and last operation. What a
    cache of every shoot's Cluster keeps: a Cluster also carries the shoot's whole CloudProfile and Seed."""
    metadata = mapping_of(raw.get("metadata"))
    trimmed: dict[str, Any] = {"metadata": {"name": metadata.get("name")}}
    annotations = mapping_of(metadata.get("annotations"))
    if GENERIC_KUBECONFIG_ANNOTATION in annotations:
        trimmed["metadata"]["annotations"] = {GENERIC_KUBECONFIG_ANNOTATION: annotations[GENERIC_KUBECONFIG_ANNOTATION]}
    spec = raw.get("spec")
    if not isinstance(spec, Mapping) or "shoot" not in spec:
        return trimmed
    shoot = spec["shoot"]
    if not isinstance(shoot, Mapping):  # e.g. raw JSON as a string, as some clients write a RawExtension: kept whole
        return {**trimmed, "spec": {"shoot": shoot}}
    return {**trimmed, "spec": {"shoot": _trimmed_shoot(shoot)}}


def _trimmed_shoot(shoot: Mapping[str, Any]) -> dict[str, Any]:
    """The Shoot's metadata (without managedFields), workers, extensions, hibernation, Kubernetes version and last
    operation (type and state)."""
    kept: dict[str, Any] = {}
    if "metadata" in shoot:
        shoot_metadata = shoot["metadata"]
        kept["metadata"] = (
            {key: value for key, value in shoot_metadata.items() if key != "managedFields"}
            if isinstance(shoot_metadata, Mapping)
            else shoot_metadata
        )
    if "spec" in shoot:
        shoot_spec = shoot["spec"]
        if isinstance(shoot_spec, Mapping):
            kept_spec = {key: shoot_spec[key] for key in ("hibernation", "extensions") if key in shoot_spec}
            if "kubernetes" in shoot_spec:
                kubernetes = shoot_spec["kubernetes"]
                kept_spec["kubernetes"] = (
                    {key: kubernetes[key] for key in ("version",) if key in kubernetes}
                    if isinstance(kubernetes, Mapping)
                    else kubernetes
                )
            if "provider" in shoot_spec:
                provider = shoot_spec["provider"]
                kept_spec["provider"] = (
                    {"workers": provider.get("workers")} if isinstance(provider, Mapping) else provider
                )
            kept["spec"] = kept_spec
        else:
            kept["spec"] = shoot_spec
    last_operation = mapping_of(mapping_of(shoot.get("status")).get("lastOperation"))
    if kept_operation := {key: last_operation[key] for key in ("type", "state") if key in last_operation}:
        kept["status"] = {"lastOperation": kept_operation}
    return kept


def _kubernetes_version(shoot: Any) -> str:
    spec = shoot.get("spec") if isinstance(shoot, Mapping) else None
    version = mapping_of(mapping_of(spec).get("kubernetes")).get("version")
    return version if isinstance(version, str) else ""


def _shoot_annotations(shoot: Any) -> Mapping[str, Any]:
    metadata = shoot.get("metadata") if isinstance(shoot, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _go_bool(value: Any) -> bool:
    """True where Go's strconv.ParseBool says true (as Gardener's ShootNeedsForceDeletion reads the annotation)."""
    return value in ("1", "t", "T", "TRUE", "true", "True")


# --- Zones ------------------------------------------------------------------------------------------------


def distribute_over_zones(*, total: int, zone_count: int) -> tuple[int, ...]:
    if zone_count <= 0:
        return ()
    share, remainder = divmod(total, zone_count)
    return tuple(share + (1 if index < remainder else 0) for index in range(zone_count))


def system_components_allowed(components: Any) -> bool:
    """Gardener: a pool's nil `systemComponents` counts as allowed; otherwise its `allow` flag decides."""
    return components is None or (isinstance(components, Mapping) and components.get("allow") is True)


def auto_preserve_bound(*, maximum: int, system_components: Any) -> int:
    """Gardener's bound on a pool's `autoPreserveFailedMachineMax`: its `maximum`, less the one machine that must
    stay for system components where the pool allows them."""
    return maximum - 1 if system_components_allowed(system_components) and maximum > 0 else maximum


def zone_share(*, total: int, zone_count: int, index: int | None) -> int:
    """This zone's part of the pool's `total`, as Gardener spreads it; the smallest part when `index` is None."""
    if zone_count <= 1:
        return total
    shares = distribute_over_zones(total=total, zone_count=zone_count)
    return shares[index] if index is not None else min(shares)
