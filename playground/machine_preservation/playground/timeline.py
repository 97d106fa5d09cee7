"""A readable timeline: what changed on which object, as the playground observes it.

A background task lists Machines and Nodes every half second, reduces each to the few fields that
matter for preservation, and prints the differences with the time since the playground started.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node

View = dict[str, str]


def machine_view(machine: Machine) -> View:
    annotations = machine.metadata.annotations
    expiry = machine.preservation.until if machine.preservation is not None else None
    return {
        "phase": machine.phase or "-",
        "preserve": annotations.get(v.PRESERVE_ANNOTATION, "-"),
        "preserved until": expiry.strftime("%H:%M:%S") if expiry else "-",
        "priority": annotations.get(v.MACHINE_PRIORITY_ANNOTATION, "-"),
    }


def node_view(node: Node) -> View:
    annotations = node.metadata.annotations
    condition = node.preserved_condition
    ready = node.condition("Ready")
    return {
        "ready": ready.status if ready else "-",
        "preserve": annotations.get(v.PRESERVE_ANNOTATION, "-"),
        "scale-down-disabled": annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION, "-"),
        "taint": "preserved:NoSchedule" if node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT) else "-",
        "Preserved": f"{condition.status} ({' '.join(filter(None, (condition.reason, condition.message)))})"
        if condition
        else "-",
    }


def diff(kind: str, before: Mapping[str, View], after: Mapping[str, View]) -> list[str]:
    """One line per created, deleted or changed object, fields in a stable order."""
    lines = []
    for name in sorted(after.keys() - before.keys()):
        shown = ", ".join(f"{k}={val}" for k, val in after[name].items() if val != "-")
        lines.append(f"{kind} {name} created" + (f": {shown}" if shown else ""))
    for name in sorted(before.keys() - after.keys()):
        lines.append(f"{kind} {name} deleted")
    for name in sorted(before.keys() & after.keys()):
        changes = [f"{k} {before[name][k]} → {val}" for k, val in after[name].items() if before[name].get(k) != val]
        if changes:
            lines.append(f"{kind} {name}: " + "; ".join(changes))
    return lines


@dataclass
class Timeline:
    api: client.ApiClient
    namespace: str
    started: float
    out: TextIO = sys.stdout
    interval: float = 0.5
    node_filter: Callable[[str], bool] = lambda name: True
    # Where the Nodes are when not in `api`'s cluster (a Gardener shoot's own API server), and a prefix for the
    # lines about this timeline's objects (the shoot's name, when there are several).
    node_api: client.ApiClient | None = None
    label: str = ""
    _machines: dict[str, View] = field(default_factory=dict)
    _nodes: dict[str, View] = field(default_factory=dict)

    def say(self, text: str) -> None:
        elapsed = asyncio.get_running_loop().time() - self.started
        self.out.write(f"{elapsed:7.1f}s  {text}\n")
        self.out.flush()

    async def observe(self) -> None:
        """One look at the objects; prints what changed since the last one."""
        custom = client.CustomObjectsApi(self.api)
        raw = await custom.list_namespaced_custom_object_without_preload_content(
            v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, self.namespace, "machines"
        )
        machines = {
            m.metadata.name: machine_view(m)
            for m in (Machine.model_validate(item) for item in _items(await raw.read()))
        }
        raw_nodes = await client.CoreV1Api(self.node_api or self.api).list_node_without_preload_content()
        nodes = {
            n.metadata.name: node_view(n)
            for n in (Node.model_validate(item) for item in _items(await raw_nodes.read()))
            if self.node_filter(n.metadata.name)
        }
        for line in diff("machine", self._machines, machines) + diff("node", self._nodes, nodes):
            self.say(f"[{self.label}] {line}" if self.label else line)
        self._machines, self._nodes = machines, nodes

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.observe()
            try:
                async with asyncio.timeout(self.interval):
                    await stopping.wait()
            except TimeoutError:
                continue


def _items(body: bytes) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(body)["items"]
    return items
