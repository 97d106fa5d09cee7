"""Helpers for the controller's integration tests: aio clients, object builders, eventual polling, and the
shared fixtures (`api`, `node_names`; tests/integration/conftest.py makes them available)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.events import NODE_EVENT_NAMESPACE, EventRecorder
from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.preservation.apply import Writer
from machine_preservation.controller.preservation.drain import Drainer
from machine_preservation.controller.preservation.evidence import EvidenceKeeper
from machine_preservation.controller.preservation.node_pods import NodePods
from machine_preservation.controller.preservation.reader import CacheReader
from machine_preservation.controller.preservation.reconcile import LiveNodes, MachineReconciler
from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import DEFAULT_MAX_PRESERVE_TIMEOUT, PreservationConfig
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.polling import eventually_async

GROUP, VERSION = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION


async def aio_client(kubeconfig: Path) -> client.ApiClient:
    return await new_api_client(kubeconfig=kubeconfig)


def machine_body(
    name: str,
    *,
    node: str = "",
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"node": node} if node else {}}
    if annotations:
        metadata["annotations"] = annotations
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Machine",
        "metadata": metadata,
        "spec": {"class": {"kind": "TestMachineClass", "name": "c"}, **(spec or {})},
    }


async def create_machine(
    api: client.CustomObjectsApi, namespace: str, name: str, *, phase: str = "Running", **kwargs: Any
) -> dict[str, Any]:
    await api.create_namespaced_custom_object(GROUP, VERSION, namespace, "machines", machine_body(name, **kwargs))
    status = {
        "status": {"currentStatus": {"phase": phase, "lastUpdateTime": format_timestamp(dt.datetime.now(dt.UTC))}}
    }
    result: dict[str, Any] = await api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "machines", name, status, _content_type="application/merge-patch+json"
    )
    return result


async def get_machine(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = await api.get_namespaced_custom_object(GROUP, VERSION, namespace, "machines", name)
    return result


async def create_node(core: client.CoreV1Api, name: str, *, ready: bool = True, **metadata: Any) -> client.V1Node:
    await core.create_node({"metadata": {"name": name, **metadata}})
    now = format_timestamp(dt.datetime.now(dt.UTC))
    condition = {
        "type": "Ready",
        "status": "True" if ready else "Unknown",
        "reason": "KubeletReady" if ready else "NodeStatusUnknown",
        "message": "",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    node: client.V1Node = await core.patch_node_status(name, {"status": {"conditions": [condition]}})
    return node


async def read_raw(response_coroutine: Awaitable[Any]) -> dict[str, Any]:
    """The JSON of a `*_without_preload_content` call (the server's own field names, no None fill-ins)."""
    response = await response_coroutine
    body = await response.read()
    assert response.status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


async def read_node_model(core: client.CoreV1Api, name: str) -> Node:
    return Node.model_validate(await read_raw(core.read_node_without_preload_content(name)))


# --- shared fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An aio client with the control plane's admin identity."""
    api_client = await aio_client(control_plane.kubeconfig)
    yield api_client
    await api_client.close()


@pytest.fixture
async def node_names(api: client.ApiClient) -> AsyncIterator[list[str]]:
    """Nodes are cluster-scoped: the ones a test made with `new_node` are deleted afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ApiException):
            await client.CoreV1Api(api).delete_node(name)


# --- objects and their state -------------------------------------------------------------------------------


async def new_node(api: client.ApiClient, names: list[str], *, ready: bool, **metadata: Any) -> str:
    """A Node with a fresh name, recorded in `names` (the `node_names` fixture) for clean-up."""
    name = f"n-{uuid.uuid4().hex[:8]}"
    names.append(name)
    await create_node(client.CoreV1Api(api), name, ready=ready, **metadata)
    return name


async def machine_model(api: client.ApiClient, namespace: str, name: str) -> Machine | None:
    """The Machine as our model reads it; None once it is gone."""
    try:
        return Machine.model_validate(await get_machine(client.CustomObjectsApi(api), namespace, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def preserved_until(
    machine: Machine | None, *, max_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT
) -> dt.datetime | None:
    """The expiry in force of the machine's preservation record (its annotations, capped at since + max);
    None when it has no record (or is gone)."""
    record = machine.preservation if machine is not None else None
    return record.expiry(max_timeout=max_timeout) if record is not None else None


def is_preserved(machine: Machine | None, *, max_timeout: dt.timedelta = DEFAULT_MAX_PRESERVE_TIMEOUT) -> bool:
    """Preserved by the controller: the record is in the annotations, and its expiry is mirrored into
    `status.currentStatus.preserveExpiryTime` (the test control plane's Machine CRD keeps that field)."""
    until = preserved_until(machine, max_timeout=max_timeout)
    return machine is not None and until is not None and machine.mirrored_expiry == until


def is_unpreserved(machine: Machine | None) -> bool:
    """Not preserved: neither a record nor a mirrored expiry."""
    return machine is not None and machine.preservation is None and machine.mirrored_expiry is None


async def machines_of(api: client.ApiClient, namespace: str) -> dict[str, Machine]:
    listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, namespace, "machines")
    assert isinstance(listed, dict)
    return {m.metadata.name: m for m in map(Machine.model_validate, listed["items"])}


def owner_reference(kind: str, created: dict[str, Any]) -> dict[str, Any]:
    """A controller ownerReference to `created` (a custom object as the API returned it)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "name": created["metadata"]["name"],
        "uid": created["metadata"]["uid"],
        "controller": True,
    }


async def create_custom(
    api: client.ApiClient,
    namespace: str,
    kind: str,
    name: str,
    *,
    spec: dict[str, Any] | None = None,
    owner: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A MachineSet or MachineDeployment (kind), optionally owned and annotated."""
    metadata: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if owner:
        metadata["ownerReferences"] = [owner]
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": metadata, "spec": spec or {}}
    created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, f"{kind.lower()}s", body
    )
    assert isinstance(created, dict)
    return created


async def machine_set_owner(api: client.ApiClient, namespace: str, name: str = "ms", **spec: Any) -> dict[str, Any]:
    """Create a MachineSet with `spec`; returns the ownerReference its Machines carry."""
    return owner_reference("MachineSet", await create_custom(api, namespace, "MachineSet", name, spec=spec))


async def running_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    *,
    node: str,
    labels: dict[str, str] | None = None,
    **metadata: Any,
) -> None:
    """A pod bound to `node` and shown Running and Ready (as its kubelet would report it), so the Eviction API
    applies PodDisruptionBudgets to it (a Pending pod may be evicted regardless)."""
    await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": labels or {}, **metadata},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "registry.invalid/none"}],
            },
        },
    )
    now = format_timestamp(dt.datetime.now(dt.UTC))
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}
    await core.patch_namespaced_pod_status(name, namespace, {"status": status})


async def pdb_settled(policy: client.PolicyV1Api, namespace: str, name: str, *, allowed: int) -> bool:
    """The disruption controller has counted the PDB's pods and allows `allowed` disruptions."""
    pdb = await policy.read_namespaced_pod_disruption_budget(name, namespace)
    status = pdb.status
    return bool(
        status
        and status.observed_generation == pdb.metadata.generation
        and status.current_healthy == status.expected_pods
        and status.disruptions_allowed == allowed
    )


async def guarded_pods(api: client.ApiClient, namespace: str, node: str, *names: str) -> None:
    """Running pods `names` on `node` under a PodDisruptionBudget ("guard") that allows no disruption,
    once the disruption controller has it in force."""
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    for name in names:
        await running_pod(core, namespace, name, node=node, labels={"app": "guarded"})
    selector = {"matchLabels": {"app": "guarded"}}
    budget = {"metadata": {"name": "guard"}, "spec": {"minAvailable": len(names), "selector": selector}}
    await policy.create_namespaced_pod_disruption_budget(namespace, budget)
    await eventually_async(lambda: pdb_settled(policy, namespace, "guard", allowed=0))


async def events_about(api: client.ApiClient, namespace: str, kind: str, name: str) -> list[client.CoreV1Event]:
    """The Events regarding one Machine (in its namespace) or Node (in `default`), oldest first."""
    where = namespace if kind == "Machine" else NODE_EVENT_NAMESPACE
    listed = await client.CoreV1Api(api).list_namespaced_event(
        where, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    items: list[client.CoreV1Event] = listed.items
    return items


def machine_reconciler(
    api: client.ApiClient, namespace: str, *, caches: CacheReader, node_pods: NodePods, **options: Any
) -> MachineReconciler:
    """The Machine reconciler wired as a runtime wires it, with one API server as control and target."""
    recorder = EventRecorder(control=api, target=api, machine_namespace=namespace, instance="test")
    return MachineReconciler(
        caches=caches,
        writer=Writer(control=api, target=api, namespace=namespace, recorder=recorder),
        drainer=Drainer(target=api, pods=node_pods),
        live_nodes=LiveNodes(target=api),
        node_pods=node_pods,
        metrics=Metrics(),
        **{"config": PreservationConfig(), "evidence": EvidenceKeeper(target=api, recorder=recorder), **options},
    )
