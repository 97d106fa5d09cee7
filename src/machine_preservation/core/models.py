"""Pydantic models of the parts of Kubernetes, MCM and Gardener objects this product reads.

Lenient on purpose: unknown fields are ignored, missing ones take Kubernetes' zero values, so a model
can be built from any real object (admission request, watch event, list item). Models are frozen: the
core decides on snapshots and returns desired changes; it never mutates its inputs.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from machine_preservation.core import vocabulary as v


class KubeModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class OwnerReference(KubeModel):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(KubeModel):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: dt.datetime | None = None
    deletion_timestamp: dt.datetime | None = None
    owner_references: list[OwnerReference] = Field(default_factory=list)

    def controller_owner(self) -> OwnerReference | None:
        return next((ref for ref in self.owner_references if ref.controller), None)


class Taint(KubeModel):
    key: str
    value: str = ""
    effect: str
    time_added: dt.datetime | None = None


class NodeCondition(KubeModel):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: dt.datetime | None = None
    last_heartbeat_time: dt.datetime | None = None


class NodeSpec(KubeModel):
    taints: list[Taint] = Field(default_factory=list)
    unschedulable: bool = False


class NodeStatus(KubeModel):
    conditions: list[NodeCondition] = Field(default_factory=list)


class Node(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)

    def condition(self, condition_type: str) -> NodeCondition | None:
        return next((c for c in self.status.conditions if c.type == condition_type), None)

    @property
    def preserved_condition(self) -> NodeCondition | None:
        return self.condition(v.PRESERVED_CONDITION_TYPE)

    def has_taint(self, key: str, effect: str) -> bool:
        return any(t.key == key and t.effect == effect for t in self.spec.taints)


class MachineCurrentStatus(KubeModel):
    phase: str = ""
    timeout_active: bool | None = None
    last_update_time: dt.datetime | None = None
    preserve_expiry_time: dt.datetime | None = None


class LastOperation(KubeModel):
    description: str = ""
    state: str = ""
    type: str = ""
    last_update_time: dt.datetime | None = None


class MachineStatus(KubeModel):
    current_status: MachineCurrentStatus = Field(default_factory=MachineCurrentStatus)
    last_operation: LastOperation = Field(default_factory=LastOperation)
    conditions: list[NodeCondition] = Field(default_factory=list)


class MachineSpec(KubeModel):
    provider_id: str = Field(default="", alias="providerID")
    machine_preserve_timeout: str | None = None
    drain_timeout: str | None = None
    max_evict_retries: int | None = None


class Machine(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineSpec = Field(default_factory=MachineSpec)
    status: MachineStatus = Field(default_factory=MachineStatus)

    @property
    def phase(self) -> str:
        return self.status.current_status.phase

    @property
    def preserve_expiry_time(self) -> dt.datetime | None:
        return self.status.current_status.preserve_expiry_time

    @property
    def node_name(self) -> str:
        return self.metadata.labels.get(v.NODE_LABEL, "")


class MachineSetSpec(KubeModel):
    replicas: int = 0
    auto_preserve_failed_machine_max: int = 0
    template: dict[str, Any] = Field(default_factory=dict)


class MachineSetStatus(KubeModel):
    replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    auto_preserve_failed_machine_count: int = 0
    preserved_failed_replicas: int = 0


class MachineSet(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineSetSpec = Field(default_factory=MachineSetSpec)
    status: MachineSetStatus = Field(default_factory=MachineSetStatus)


class MachineDeploymentSpec(KubeModel):
    replicas: int = 0
    auto_preserve_failed_machine_max: int = 0
    paused: bool = False
    template: dict[str, Any] = Field(default_factory=dict)


class MachineDeploymentStatus(KubeModel):
    replicas: int = 0
    updated_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    unavailable_replicas: int = 0
    preserved_failed_replicas: int = 0


class MachineDeployment(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineDeploymentSpec = Field(default_factory=MachineDeploymentSpec)
    status: MachineDeploymentStatus = Field(default_factory=MachineDeploymentStatus)


class PodSpec(KubeModel):
    node_name: str = ""


class Pod(KubeModel):
    """The parts of a Pod a drain reads: owner (DaemonSet), mirror annotation, node, deletion state."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec = Field(default_factory=PodSpec)
