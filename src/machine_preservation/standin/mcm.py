"""A small MCM stand-in: just enough of machine-controller-manager for end-to-end runs.

It plays MCM's machine controller (phases from node health), its MachineSet controller (replicas,
deleting Failed machines that are not preserved, scale-down order) and the cloud provider and kubelet
(a new Machine gets a Ready Node). It is a polling loop over lists, not a real controller: clarity over
efficiency. What it deliberately shares with real MCM, because the product depends on it:

- it authenticates as MCM's identity, so the webhook's deletion guard applies to its deletes, and a
  denied delete (the machine is, or is about to be, preserved) is simply retried on a later pass;
- it never deletes a Failed machine whose preserveExpiryTime is in the future;
- scale-down deletes unpreserved machines first and lower `machinepriority.machine.sapcloud.io` first,
  but always honours the replica count.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import DEFAULT_MAX_PRESERVE_TIMEOUT
from machine_preservation.core.models import Machine, MachineSet, Node
from machine_preservation.core.priority import parse_priority

logger = logging.getLogger(__name__)

MCM_USERNAME = "system:serviceaccount:kube-system:machine-controller-manager"
_GROUP, _VERSION = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION
_MERGE_PATCH = "application/merge-patch+json"
# Scale-down order within equal preservation and priority (reference §8: Failed go first).
_PHASE_ORDER = {"Terminating": 0, "Failed": 1, "CrashLoopBackOff": 2, "Unknown": 3, "Pending": 4, "Running": 6}


async def _json(response: Any) -> dict[str, Any]:
    """The JSON body of a `*_without_preload_content` call (raw dicts: parsed by our own models)."""
    body = await response.read()
    if response.status >= 400:
        raise ApiException(status=response.status, reason=response.reason, body=body)
    parsed: dict[str, Any] = json.loads(body)
    return parsed


def _timestamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ready(node: Node | None) -> bool:
    condition = node.condition("Ready") if node is not None else None
    return condition is not None and condition.status == "True"


@dataclass
class McmStandIn:
    api: client.ApiClient  # authenticated as MCM_USERNAME
    namespace: str
    health_timeout: dt.timedelta = dt.timedelta(seconds=10)
    # Real MCM moves a Failed machine back to Running when its node is healthy again; turning that off
    # shows the controller doing it for preserved machines (DESIGN.md §3).
    recover_failed: bool = True
    interval: float = 0.5
    deletions_denied: int = field(default=0, init=False)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.sync(now=dt.datetime.now(dt.UTC))
            except ApiException as error:
                logger.warning("MCM stand-in pass failed: %s %s", error.status, error.reason)
            try:
                await asyncio.wait_for(stopping.wait(), timeout=self.interval)
            except TimeoutError:
                continue

    async def sync(self, *, now: dt.datetime) -> None:
        """One pass over every Machine and MachineSet of the namespace."""
        custom = client.CustomObjectsApi(self.api)
        machines = [Machine.model_validate(m) for m in (await self._list(custom, "machines"))]
        machine_sets = [MachineSet.model_validate(m) for m in (await self._list(custom, "machinesets"))]
        node_list = await _json(await client.CoreV1Api(self.api).list_node_without_preload_content())
        nodes = {node.metadata.name: node for node in (Node.model_validate(n) for n in node_list["items"])}
        for machine in machines:
            await self._update_phase(machine=machine, node=nodes.get(machine.node_name), now=now)
        for machine_set in machine_sets:
            owned = [
                m
                for m in machines
                if (owner := m.metadata.controller_owner()) is not None and owner.uid == machine_set.metadata.uid
            ]
            await self._sync_replicas(machine_set=machine_set, machines=owned, now=now)

    async def _list(self, custom: client.CustomObjectsApi, plural: str) -> list[dict[str, Any]]:
        response = await custom.list_namespaced_custom_object_without_preload_content(
            _GROUP, _VERSION, self.namespace, plural
        )
        items: list[dict[str, Any]] = (await _json(response))["items"]
        return items

    # --- machine controller: phases from node health ------------------------------------------------

    async def _update_phase(self, *, machine: Machine, node: Node | None, now: dt.datetime) -> None:
        if machine.metadata.deletion_timestamp is not None or not machine.node_name:
            return
        phase, ready = machine.phase, _ready(node)
        since = machine.status.current_status.last_update_time or machine.metadata.creation_timestamp or now
        new_phase = phase
        recoverable = ("", "Pending", "Unknown", "Failed") if self.recover_failed else ("", "Pending", "Unknown")
        if ready and phase in recoverable:
            new_phase = "Running"
        elif not ready and phase in ("", "Pending", "Running"):
            new_phase = "Unknown"
        elif not ready and phase == "Unknown" and now - since >= self.health_timeout:
            new_phase = "Failed"
        if new_phase != phase:
            await self._set_phase(machine=machine, phase=new_phase, now=now)

    async def _set_phase(self, *, machine: Machine, phase: str, now: dt.datetime) -> None:
        # Like MCM's health check, the expiry is carried over unchanged (merge patch leaves it alone).
        body = {
            "status": {
                "currentStatus": {"phase": phase, "lastUpdateTime": _timestamp(now)},
                "lastOperation": {
                    "state": "Failed" if phase == "Failed" else "Successful",
                    "type": "HealthCheck",
                    "description": f"Machine {machine.metadata.name} is {phase}",
                    "lastUpdateTime": _timestamp(now),
                },
            }
        }
        await client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
            _GROUP, _VERSION, self.namespace, "machines", machine.metadata.name, body, _content_type=_MERGE_PATCH
        )
        logger.info("MCM stand-in: machine %s %s -> %s", machine.metadata.name, machine.phase or "-", phase)

    # --- MachineSet controller ---------------------------------------------------------------------

    async def _sync_replicas(self, *, machine_set: MachineSet, machines: list[Machine], now: dt.datetime) -> None:
        live = [m for m in machines if m.metadata.deletion_timestamp is None]
        for machine in [m for m in live if m.phase == "Failed" and not self._actively_preserved(m, now)]:
            if await self.delete_machine(machine):
                live.remove(machine)
        missing = machine_set.spec.replicas - len(live)
        for _ in range(missing):
            await self.create_machine(machine_set=machine_set)
        if missing < 0:
            for machine in sorted(live, key=lambda m: self._deletion_rank(m, now))[:-missing]:
                await self.delete_machine(machine)

    @staticmethod
    def _actively_preserved(machine: Machine, now: dt.datetime) -> bool:
        return (
            machine.preservation is not None
            and machine.preservation.expiry(max_timeout=DEFAULT_MAX_PRESERVE_TIMEOUT) > now
        )

    def _deletion_rank(self, machine: Machine, now: dt.datetime) -> tuple[bool, int, int, dt.datetime]:
        return (
            self._actively_preserved(machine, now),
            parse_priority(machine.metadata.annotations.get(v.MACHINE_PRIORITY_ANNOTATION)),
            _PHASE_ORDER.get(machine.phase, 5),
            machine.metadata.creation_timestamp or now,
        )

    async def create_machine(self, *, machine_set: MachineSet) -> str:
        """A Machine of the set, with a Ready Node of the same name (the cloud provider and kubelet)."""
        name = f"{machine_set.metadata.name}-{secrets.token_hex(3)}"
        template: Mapping[str, Any] = machine_set.spec.template
        labels = {**(template.get("metadata") or {}).get("labels", {}), v.NODE_LABEL: name}
        body = {
            "apiVersion": f"{_GROUP}/{_VERSION}",
            "kind": "Machine",
            "metadata": {
                "name": name,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": f"{_GROUP}/{_VERSION}",
                        "kind": "MachineSet",
                        "name": machine_set.metadata.name,
                        "uid": machine_set.metadata.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**(template.get("spec") or {}), "providerID": f"standin:///{name}"},
        }
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            _GROUP, _VERSION, self.namespace, "machines", body
        )
        await self.create_ready_node(name=name, zone=labels.get("topology.kubernetes.io/zone", ""))
        logger.info("MCM stand-in: created machine %s", name)
        return name

    async def create_ready_node(self, *, name: str, zone: str = "") -> None:
        core = client.CoreV1Api(self.api)
        labels = {"kubernetes.io/hostname": name, **({"topology.kubernetes.io/zone": zone} if zone else {})}
        await core.create_node({"metadata": {"name": name, "labels": labels}})  # type: ignore[arg-type]
        await set_node_ready(self.api, name=name, ready=True)

    async def delete_machine(self, machine: Machine) -> bool:
        """Delete the machine (as MCM), then its node and pods. False when the webhook denied it."""
        name = machine.metadata.name
        try:
            await client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                _GROUP, _VERSION, self.namespace, "machines", name
            )
        except ApiException as error:
            if error.status == 404:
                return True
            if error.status == 403:
                self.deletions_denied += 1
                logger.info("MCM stand-in: deleting machine %s was denied: %s", name, error.body)
                return False
            raise
        logger.info("MCM stand-in: deleted machine %s (%s)", name, machine.phase)
        if machine.node_name:
            await self._delete_node(machine.node_name)
        return True

    async def _delete_node(self, name: str) -> None:
        core = client.CoreV1Api(self.api)
        pods = await _json(
            await core.list_pod_for_all_namespaces_without_preload_content(field_selector=f"spec.nodeName={name}")
        )
        for pod in pods["items"]:
            metadata = pod["metadata"]
            # No kubelet finishes a graceful delete here.
            try:
                await core.delete_namespaced_pod(metadata["name"], metadata["namespace"], grace_period_seconds=0)
            except ApiException as error:
                if error.status != 404:
                    raise
        try:
            await core.delete_node(name)
        except ApiException as error:
            if error.status != 404:
                raise


async def set_node_ready(api: client.ApiClient, *, name: str, ready: bool) -> None:
    """Write the Ready condition as a kubelet would (also how a test or the playground fails a node)."""
    now = _timestamp(dt.datetime.now(dt.UTC))
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "kubelet is posting ready status" if ready else "node stopped responding (simulated)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    await client.CoreV1Api(api).patch_node_status(name, {"status": {"conditions": [condition]}})
