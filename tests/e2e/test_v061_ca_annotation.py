"""The cluster-autoscaler annotation of a preserved node survives real MCM v0.61.3's MachineDeployment syncs.

MCM v0.61 disables scale-down on every node of a MachineDeployment during a rollout
(`scale-down-disabled` with its marker `…-by-mcm`) and, on every sync of a complete MachineDeployment, removes
both from each of its nodes that carries that marker. The controller marks its own CA annotation with a marker of
its own; MCM's marker is kept off the nodes it preserves (at admission, else by the controller), so MCM's clean-up
never touches them; MCM's own rollout annotations on the other nodes are still cleaned up by MCM.

A watch on the Nodes records every version of every node: once a node is preserved, no version of it may lack
`scale-down-disabled: "true"`, not even one watch event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.localcluster.mcm_pool import machine_phase
from machine_preservation.localcluster.mcm_runner import McmSettings
from tests.e2e.harness import RealMcm, follow, following, patch_machine_deployment, preserved_condition
from tests.e2e.product import Product, Write
from tests.e2e.test_v061_lifecycle import fail_machine, owner_set, set_node_preserve, setup_pool, wait_replaced
from tests.polling import eventually_async

logger = logging.getLogger(__name__)

CA = v.CA_SCALE_DOWN_DISABLED_ANNOTATION
OURS = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
MCMS = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
ROLLOUT_LIMIT = 300.0


@pytest.fixture(autouse=True)
def only_v061(real_mcm: RealMcm) -> None:
    assert real_mcm.version == "v0.61.3"


@pytest.fixture
def mcm_settings() -> McmSettings:
    # MCM logs its rollout annotations (and their removal) at verbosity 3.
    return McmSettings(verbosity=3)


@dataclass
class NodeVersions:
    """Every version of every Node the API server's watch delivers, in order."""

    api: client.ApiClient
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[NodeVersions]:
        async with following(self._loop, name="node-versions"):
            yield self

    def since_preserved(self, name: str) -> list[dict[str, Any]]:
        """The node's versions from the first one our controller marked as preserved (its marker or its
        condition) to the last one seen."""
        versions = self.seen.get(name, [])
        start = next((i for i, node in enumerate(versions) if _marked_preserved(node)), len(versions))
        return versions[start:]

    async def _loop(self, listed: asyncio.Event) -> None:
        core = client.CoreV1Api(self.api)

        async def list_page() -> dict[str, Any]:
            response = await core.list_node_without_preload_content()
            page: dict[str, Any] = json.loads(await response.read())
            return page

        async def watch_from(resource_version: str) -> Any:
            return await core.list_node_without_preload_content(
                watch=True, resource_version=resource_version, allow_watch_bookmarks=True, timeout_seconds=300
            )

        await follow(list_page=list_page, watch_from=watch_from, record=self._add, listed=listed)

    def _add(self, event_type: str, node: dict[str, Any]) -> None:
        if event_type != "DELETED":
            self.seen.setdefault(node["metadata"]["name"], []).append(node)


def _annotations(node: dict[str, Any] | None) -> dict[str, str]:
    return dict(((node or {}).get("metadata") or {}).get("annotations") or {})


def _marked_preserved(node: dict[str, Any]) -> bool:
    condition = preserved_condition(node)
    return OURS in _annotations(node) or (condition is not None and condition.get("status") == "True")


def de_annotated(logs: str) -> set[str]:
    """The nodes MCM says it removed its CA annotations from."""
    return set(re.findall(r'De-annotated the node "([^"]+)"', logs))


def marker(write: Write) -> bool:
    """The write sets or removes MCM's marker (an update sends the whole object: it carries the marker)."""
    return f"metadata.annotations[{MCMS}]" in write.fields


def assert_protected_throughout(versions: NodeVersions, name: str) -> None:
    history = versions.since_preserved(name)
    assert history, f"{name} was never seen preserved"
    missing = [node["metadata"]["resourceVersion"] for node in history if _annotations(node).get(CA) != "true"]
    assert missing == [], f"{name}: versions without {CA}=true after it was preserved: {missing}"


async def sole_protected_by_us(real_mcm: RealMcm, name: str) -> bool:
    """The node carries the CA annotation with our marker only."""
    found = _annotations(await real_mcm.node(name))
    return found.get(CA) == "true" and found.get(OURS) == "true" and MCMS not in found


async def test_a_preserved_nodes_ca_annotation_survives_syncs_and_rollouts(real_mcm: RealMcm, product: Product) -> None:
    preserved, *others = await setup_pool(real_mcm, product, replicas=3, preserve_timeout="30m")
    async with NodeVersions(real_mcm.api).running() as versions:
        await set_node_preserve(product, real_mcm, preserved, "now")
        await eventually_async(lambda: sole_protected_by_us(real_mcm, preserved), limit=30)

        # The MachineDeployment is synced over and over: a scale-up, a scale-down (the preserved machine has
        # the higher priority, so another one goes), a failure and its replacement.
        await real_mcm.scale("pool", 4)
        await real_mcm.wait_for_pool("pool", 4)
        await real_mcm.scale("pool", 3)
        machines = await real_mcm.wait_for_pool("pool", 3)
        assert preserved in {m["metadata"]["name"] for m in machines}
        victim = next(m["metadata"]["name"] for m in machines if m["metadata"]["name"] != preserved)
        await fail_machine(real_mcm, victim)
        await wait_replaced(real_mcm, "pool", victim, 3)
        assert await sole_protected_by_us(real_mcm, preserved)
        assert_protected_throughout(versions, preserved)
        assert preserved not in de_annotated(real_mcm.logs())

        # A rolling update: MCM marks every node of the MachineDeployment while it runs. A machine of the new
        # MachineSet is preserved while the rollout still runs, then the rollout completes.
        old_set = owner_set(next(m for m in machines if m["metadata"]["name"] == preserved))
        await patch_machine_deployment(
            real_mcm,
            "pool",
            {"spec": {"template": {"metadata": {"labels": {"rollout": "2"}}}}},
        )

        async def first_of_new_set() -> str | None:
            for machine in await real_mcm.machines("pool"):
                name = machine["metadata"]["name"]
                node = await real_mcm.node(name)
                if owner_set(machine) != old_set and machine_phase(machine) == "Running" and node is not None:
                    return name
            return None

        try:
            newcomer: str = await eventually_async(first_of_new_set, limit=120, interval=0.25)
        except AssertionError as error:
            state = [(m["metadata"]["name"], owner_set(m), machine_phase(m)) for m in await real_mcm.machines()]
            raise AssertionError(f"{error}; old set {old_set}; machines {state}\n{real_mcm.log_tail(60)}") from None
        await set_node_preserve(product, real_mcm, newcomer, "now")
        await eventually_async(lambda: sole_protected_by_us(real_mcm, newcomer), limit=30)

        async def rolled_out() -> list[dict[str, Any]] | None:
            machines = await real_mcm.machines("pool")
            running = [m for m in machines if machine_phase(m) == "Running"]
            done = len(machines) == len(running) == 3 and all(owner_set(m) != old_set for m in machines)
            return machines if done else None

        rolled: list[dict[str, Any]] = await eventually_async(rolled_out, limit=ROLLOUT_LIMIT, interval=0.5)
        rest = [m["metadata"]["name"] for m in rolled if m["metadata"]["name"] != newcomer]

        # MCM cleans up its own rollout annotations on the nodes nobody preserves: no leftovers.
        async def cleaned_up() -> bool:
            nodes = [await real_mcm.node(name) for name in rest]
            return all(not ({CA, MCMS, OURS} & set(_annotations(node))) for node in nodes)

        await eventually_async(cleaned_up, limit=60, interval=0.5)
        assert await sole_protected_by_us(real_mcm, newcomer)

    logs = real_mcm.logs()
    removed = de_annotated(logs)
    assert set(rest) <= removed, f"MCM removed its rollout annotations from {removed}, expected {rest}"
    assert not {preserved, newcomer} & removed, f"MCM removed the CA annotation of a preserved node: {removed}"
    # The preserved nodes were protected in every version the watch delivered (the first one until the rollout
    # deleted its machine with its old MachineSet, the newcomer since its preservation).
    assert_protected_throughout(versions, preserved)
    assert_protected_throughout(versions, newcomer)
    assert others  # the pool had machines besides the preserved one throughout
    # No fight with MCM: its rollout's marker is kept off the preserved nodes at admission, so the controller
    # takes it off at most once, when it takes over a newcomer MCM marked before its preservation. Two things race
    # with that on a busy machine, and neither is a fight:
    # - a write made on a view MCM (or anyone) changed meanwhile is answered 409 and changes nothing; the
    #   controller plans again and writes once more: only the writes that took effect count;
    # - our node webhooks fail open (failurePolicy Ignore, a node webhook never blocks): one of MCM's writes our
    #   webhook could not answer in time puts the marker on the node, and the controller takes it off again, as
    #   the product promises. Each such write allows one take-over more, and only such writes do.
    controller_writes = await product.controller_writes()
    mcm_writes = await product.writes_by(product.mcm_user)

    def marker_writes(name: str) -> list[Write]:
        return [w for w in controller_writes if w.kind == "Node" and w.name == name and marker(w) and w.code < 300]

    def unanswered(name: str) -> list[Write]:
        return [w for w in mcm_writes if w.kind == "Node" and w.name == name and marker(w) and w.failed_open]

    assert len(marker_writes(preserved)) <= len(unanswered(preserved)), marker_writes(preserved)
    assert len(marker_writes(newcomer)) <= 1 + len(unanswered(newcomer)), marker_writes(newcomer)
    product.check_running()
