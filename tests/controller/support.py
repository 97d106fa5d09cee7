"""Helpers for the controller's integration tests: aio clients, object builders, eventual polling."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes.aio import client

from machine_preservation.controller.clients import new_api_client
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Node

T = TypeVar("T")

GROUP, VERSION = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION


async def aio_client(kubeconfig: Path) -> client.ApiClient:
    return await new_api_client(kubeconfig=kubeconfig)


async def eventually(check: Callable[[], Awaitable[T] | T], *, limit: float = 30.0, interval: float = 0.1) -> T:
    """Poll until `check` returns something truthy (or stops raising AssertionError); else fail."""
    deadline = time.monotonic() + limit
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
        except AssertionError as error:
            last = error
        else:
            if result:
                return result  # type: ignore[return-value]
            last = result
        await asyncio.sleep(interval)
    raise AssertionError(f"not reached within {limit}s; last outcome: {last!r}")


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    status = {"status": {"currentStatus": {"phase": phase, "lastUpdateTime": rfc3339(dt.datetime.now(dt.UTC))}}}
    result: dict[str, Any] = await api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "machines", name, status, _content_type="application/merge-patch+json"
    )
    return result


async def get_machine(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = await api.get_namespaced_custom_object(GROUP, VERSION, namespace, "machines", name)
    return result


async def create_node(core: client.CoreV1Api, name: str, *, ready: bool = True, **metadata: Any) -> client.V1Node:
    await core.create_node({"metadata": {"name": name, **metadata}})
    now = rfc3339(dt.datetime.now(dt.UTC))
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
