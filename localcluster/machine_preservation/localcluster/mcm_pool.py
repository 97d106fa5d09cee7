"""What surrounds a real MCM in a local cluster: worker pools to manage, and the node side nobody else plays.

- A pool is what Gardener's worker extension would create: a Secret with `userData`, a MachineClass with
  `provider: fake` (served by our driver) and a MachineDeployment labelled with its pool name. Pools are
  named `name` throughout (Secret, MachineClass, MachineDeployment); their Machines carry `name=<pool>`.
- There is no kubelet: `FakeKubelets` keeps each Node's `Ready` condition where the test put it (through the
  status subresource) and finishes the termination of pods deleted or evicted from the pool's Nodes (a
  kubelet would confirm it; here a delete with grace period 0 does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core.clock import system_clock
from machine_preservation.core.preservation_record import format_timestamp

logger = logging.getLogger(__name__)

GROUP, VERSION = "machine.sapcloud.io", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
POOL_LABEL = "worker.gardener.cloud/pool"
POOL_SELECTOR_LABEL = "name"
PROVIDER = "fake"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"

ConditionStatus = Literal["True", "False", "Unknown"]


def pool_objects(
    namespace: str,
    name: str,
    *,
    replicas: int,
    user_data: str = "#!/bin/sh\necho fake VM\n",
    max_surge: int | str = 1,
    max_unavailable: int | str = 0,
    machine_deployment_labels: dict[str, str] | None = None,
    node_labels: dict[str, str] | None = None,
    template_spec: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The Secret, MachineClass and MachineDeployment of a pool (not yet created)."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {"userData": user_data},
    }
    machine_class = {
        "apiVersion": API_VERSION,
        "kind": "MachineClass",
        "metadata": {"name": name, "namespace": namespace},
        "provider": PROVIDER,
        "providerSpec": {"pool": name},
        "secretRef": {"name": name, "namespace": namespace},
        "credentialsSecretRef": {"name": name, "namespace": namespace},
    }
    machine_deployment = {
        "apiVersion": API_VERSION,
        "kind": "MachineDeployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {POOL_LABEL: name, **(machine_deployment_labels or {})},
        },
        "spec": {
            "replicas": replicas,
            "minReadySeconds": 0,
            "selector": {"matchLabels": {POOL_SELECTOR_LABEL: name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
            },
            "template": {
                "metadata": {"labels": {POOL_SELECTOR_LABEL: name}},
                "spec": {
                    "class": {"kind": "MachineClass", "name": name},
                    "nodeTemplate": {"metadata": {"labels": {POOL_LABEL: name, **(node_labels or {})}}},
                    **(template_spec or {}),
                },
            },
        },
    }
    return secret, machine_class, machine_deployment


async def create_pool(api: client.ApiClient, namespace: str, name: str, *, replicas: int, **options: Any) -> None:
    """Create a pool's Secret, MachineClass and MachineDeployment (see `pool_objects` for the options)."""
    secret, machine_class, machine_deployment = pool_objects(namespace, name, replicas=replicas, **options)
    await client.CoreV1Api(api).create_namespaced_secret(namespace, client.V1Secret.model_validate(secret))
    custom = client.CustomObjectsApi(api)
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "machineclasses", machine_class)
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "machinedeployments", machine_deployment)


async def scale_pool(api: client.ApiClient, namespace: str, name: str, replicas: int) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machinedeployments",
        name,
        {"spec": {"replicas": replicas}},
        _content_type=MERGE_PATCH,
    )


async def list_machines(api: client.ApiClient, namespace: str, *, pool: str | None = None) -> list[dict[str, Any]]:
    """The Machines of `namespace` (of one pool if given), as the API server returns them, by name."""
    selector = f"{POOL_SELECTOR_LABEL}={pool}" if pool else ""
    listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "machines", label_selector=selector
    )
    assert isinstance(listed, dict)
    items: list[dict[str, Any]] = listed["items"]
    return sorted(items, key=lambda m: m["metadata"]["name"])


def machine_phase(machine: dict[str, Any]) -> str:
    phase: str = ((machine.get("status") or {}).get("currentStatus") or {}).get("phase", "")
    return phase


def machine_node(machine: dict[str, Any]) -> str:
    node: str = (machine["metadata"].get("labels") or {}).get("node", "")
    return node


async def read_node(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """The Node as JSON (the server's own field names), or None if there is none."""
    response = await client.CoreV1Api(api).read_node_without_preload_content(name)
    body = await response.read()
    if response.status == 404:
        return None
    if response.status != 200:
        raise ApiException(status=response.status, reason=body.decode(errors="replace"))
    node: dict[str, Any] = json.loads(body)
    return node


def node_ready_status(node: dict[str, Any]) -> str:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            status: str = condition.get("status", "")
            return status
    return ""


async def set_node_condition(api: client.ApiClient, name: str, status: ConditionStatus) -> None:
    """Write the Node's Ready condition through the status subresource, as a kubelet (True, False) or the
    node lifecycle controller (Unknown) would. The transition time moves only when the status changes."""
    node = await read_node(api, name)
    if node is None:
        raise LookupError(f"node {name} does not exist")
    now = format_timestamp(system_clock())
    current = next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    reasons = {
        "True": ("KubeletReady", "kubelet is posting ready status"),
        "False": ("KubeletNotReady", "node is not ready (set by the test)"),
        "Unknown": ("NodeStatusUnknown", "kubelet stopped posting node status (set by the test)"),
    }
    reason, message = reasons[status]
    condition = {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": current["lastTransitionTime"]
        if current and current.get("status") == status and current.get("lastTransitionTime")
        else now,
    }
    await client.CoreV1Api(api).patch_node_status(
        name, {"status": {"conditions": [condition]}}, _content_type=STRATEGIC_MERGE_PATCH
    )


class FakeKubelets:
    """The kubelets of one namespace's machines: keep Ready conditions as set, finish terminating pods.

    `set_ready` writes at once and records the wish; a background loop (`running()`) re-asserts it if
    anything else changed the condition, and deletes with grace period 0 the pods that are terminating on
    the Nodes of the namespace's Machines (an eviction or delete leaves them terminating: nobody else
    confirms it)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        interval: float = 0.5,
        finish_pod_termination: bool = True,
        target: client.ApiClient | None = None,
    ) -> None:
        self.api = api
        # The cluster of the Nodes and Pods (a Gardener shoot's own API server), else `api`'s.
        self.target = target or api
        self.namespace = namespace
        self.interval = interval
        self.finish_pod_termination = finish_pod_termination
        self.desired: dict[str, ConditionStatus] = {}
        self.finished_pods: list[str] = []

    async def set_ready(self, node: str, ready: bool | ConditionStatus) -> None:
        status: ConditionStatus = ("True" if ready else "False") if isinstance(ready, bool) else ready
        self.desired[node] = status
        await set_node_condition(self.target, node, status)

    def forget(self, node: str) -> None:
        """Stop keeping the node's condition (it reports whatever is written next)."""
        self.desired.pop(node, None)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FakeKubelets]:
        task = asyncio.create_task(self._loop(), name=f"fake-kubelets-{self.namespace}")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def tick(self) -> None:
        """One round: re-assert conditions, finish terminating pods."""
        for name, status in list(self.desired.items()):
            node = await read_node(self.target, name)
            if node is not None and node_ready_status(node) != status and self.desired.get(name) == status:
                logger.info("fake kubelet: node %s drifted from Ready=%s; writing it again", name, status)
                await set_node_condition(self.target, name, status)
        if self.finish_pod_termination:
            await self._finish_terminating_pods()

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except (ApiException, LookupError, OSError) as error:  # the next round tries again
                logger.warning("fake kubelets of %s: %s", self.namespace, error)
            await asyncio.sleep(self.interval)

    async def _finish_terminating_pods(self) -> None:
        nodes = {machine_node(m) for m in await list_machines(self.api, self.namespace)} - {""}
        if not nodes:
            return
        core = client.CoreV1Api(self.target)
        response = await core.list_pod_for_all_namespaces_without_preload_content()
        body = await response.read()
        if response.status != 200:
            raise ApiException(status=response.status, reason=body.decode(errors="replace"))
        pods: list[dict[str, Any]] = json.loads(body)["items"]
        for pod in pods:
            metadata = pod["metadata"]
            if not metadata.get("deletionTimestamp") or pod["spec"].get("nodeName") not in nodes:
                continue
            try:
                await core.delete_namespaced_pod(metadata["name"], metadata["namespace"], grace_period_seconds=0)
            except ApiException as error:
                if error.status != 404:
                    raise
            else:
                self.finished_pods.append(f"{metadata['namespace']}/{metadata['name']}")


async def wait_for_pool(
    api: client.ApiClient,
    namespace: str,
    pool: str,
    replicas: int,
    *,
    limit: float = 120.0,
    target: client.ApiClient | None = None,
) -> list[dict[str, Any]]:
    """Wait until the pool has exactly `replicas` Machines, each Running with a Ready Node (in `target`, else in
    `api`'s cluster); returns them."""
    deadline = time.monotonic() + limit
    last = ""
    while True:
        machines = await list_machines(api, namespace, pool=pool)
        summary = []
        ready = 0
        for machine in machines:
            node_name = machine_node(machine)
            node = await read_node(target or api, node_name) if node_name else None
            node_status = node_ready_status(node) if node else "-"
            summary.append(
                f"{machine['metadata']['name']}:{machine_phase(machine) or '-'}/{node_name or '-'}:{node_status}"
            )
            if machine_phase(machine) == "Running" and node_status == "True":
                ready += 1
        last = ", ".join(summary) or "no machines"
        if len(machines) == replicas and ready == replicas:
            return machines
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool {namespace}/{pool} not {replicas} Running machines in {limit}s: {last}")
        await asyncio.sleep(0.25)
