"""The end-to-end harness: real MCM (both processes, as MCM's own identity) for one test's namespace, with
the node side played by the test (`FakeKubelets`) and helpers to build and watch worker pools."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core.durations import parse_go_duration_nanoseconds
from machine_preservation.localcluster import mcm_pool
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.mcm import mcm_versions
from machine_preservation.localcluster.mcm_pool import GROUP, VERSION, ConditionStatus, FakeKubelets
from machine_preservation.localcluster.mcm_runner import McmRunner

logger = logging.getLogger(__name__)

# For `@pytest.mark.parametrize("mcm_version", ALL_MCM_VERSIONS, indirect=True)`.
ALL_MCM_VERSIONS = mcm_versions()
MACHINE_KINDS = ("machines", "machinesets", "machinedeployments", "machineclasses")


@dataclass(frozen=True)
class MachineEvent:
    """One observed state of a Machine: when (monotonic seconds), the watch event, phase, node, deleting."""

    at: float
    type: str
    name: str
    phase: str
    node: str
    deleting: bool


async def follow(
    *,
    list_page: Callable[[], Awaitable[dict[str, Any]]],
    watch_from: Callable[[str], Awaitable[Any]],
    record: Callable[[str, dict[str, Any]], None],
    listed: asyncio.Event,
) -> None:
    """List, then watch from the list's resourceVersion, for ever: `record(type, object)` for each object listed
    (type `LISTED`) and each watch event but bookmarks; an expired watch lists again. `listed` is set after the
    first list."""
    resource_version = ""
    while True:
        try:
            if not resource_version:
                page = await list_page()
                for item in page["items"]:
                    record("LISTED", item)
                resource_version = page["metadata"]["resourceVersion"]
                listed.set()
            response = await watch_from(resource_version)
            try:
                async for line in response.content:
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        resource_version = ""  # expired: list again
                        break
                    resource_version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        record(event["type"], event["object"])
            finally:
                response.release()
        except (ApiException, OSError, ValueError) as error:
            logger.warning("watch: %s", error)
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def following(loop: Callable[[asyncio.Event], Awaitable[None]], *, name: str) -> AsyncIterator[None]:
    """Run `loop` (a `follow` of some kind) in a task from its first list until the block ends."""
    listed = asyncio.Event()
    task = asyncio.create_task(loop(listed), name=name)
    try:
        await asyncio.wait_for(listed.wait(), 30)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass
class MachineRecorder:
    """Watches the namespace's Machines and records every state it sees, so a test can tell what happened
    (a phase that lasted milliseconds included) rather than only where things ended."""

    api: client.ApiClient
    namespace: str
    events: list[MachineEvent] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[MachineRecorder]:
        async with following(self._loop, name=f"machine-recorder-{self.namespace}"):
            yield self

    def history(self, name: str) -> list[str]:
        """The machine's phases in order, repeats folded, `deleted` at the end once it is gone."""
        phases: list[str] = []
        for event in self.events:
            if event.name != name:
                continue
            phase = "deleted" if event.type == "DELETED" else event.phase or "-"
            if not phases or phases[-1] != phase:
                phases.append(phase)
        return phases

    def first(self, name: str, *, phase: str | None = None, event_type: str | None = None) -> MachineEvent | None:
        return next(
            (
                e
                for e in self.events
                if e.name == name
                and (phase is None or e.phase == phase)
                and (event_type is None or e.type == event_type)
            ),
            None,
        )

    def _record(self, kind: str, machine: dict[str, Any]) -> None:
        self.events.append(
            MachineEvent(
                at=time.monotonic(),
                type=kind,
                name=machine["metadata"]["name"],
                phase=mcm_pool.machine_phase(machine),
                node=mcm_pool.machine_node(machine),
                deleting=bool(machine["metadata"].get("deletionTimestamp")),
            )
        )

    async def _loop(self, listed: asyncio.Event) -> None:
        custom = client.CustomObjectsApi(self.api)

        async def list_page() -> dict[str, Any]:
            page: dict[str, Any] = await custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "machines"
            )
            return page

        async def watch_from(resource_version: str) -> Any:
            return await custom.list_namespaced_custom_object_without_preload_content(
                GROUP,
                VERSION,
                self.namespace,
                "machines",
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
            )

        await follow(list_page=list_page, watch_from=watch_from, record=self._record, listed=listed)


@dataclass
class RealMcm:
    """What a test gets from the `real_mcm` fixture. `api` is an administrator's client."""

    version: str
    namespace: str
    plane: ControlPlane
    api: client.ApiClient
    runner: McmRunner
    kubelets: FakeKubelets
    recorder: MachineRecorder

    async def create_pool(self, name: str, *, replicas: int, **options: Any) -> None:
        await mcm_pool.create_pool(self.api, self.namespace, name, replicas=replicas, **options)

    async def scale(self, pool: str, replicas: int) -> None:
        await mcm_pool.scale_pool(self.api, self.namespace, pool, replicas)

    async def wait_for_pool(self, pool: str, replicas: int, *, limit: float = 120.0) -> list[dict[str, Any]]:
        """Exactly `replicas` Machines of the pool, each Running with a Ready Node."""
        try:
            return await mcm_pool.wait_for_pool(self.api, self.namespace, pool, replicas, limit=limit)
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{self.runner.log_tail()}") from None

    async def machines(self, pool: str | None = None) -> list[dict[str, Any]]:
        return await mcm_pool.list_machines(self.api, self.namespace, pool=pool)

    async def machine(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "machines", name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    async def node(self, name: str) -> dict[str, Any] | None:
        return await mcm_pool.read_node(self.api, name)

    async def set_node_ready(self, node: str, ready: bool | ConditionStatus) -> None:
        """Set the Node's Ready condition and keep it so (True/False, or "Unknown")."""
        await self.kubelets.set_ready(node, ready)

    async def restart(self, *, keep_vms: bool = True) -> None:
        await asyncio.to_thread(self.runner.restart, keep_vms=keep_vms)

    async def stop(self) -> None:
        await asyncio.to_thread(self.runner.stop)

    def log_tail(self, lines: int = 40) -> str:
        return self.runner.log_tail(lines)

    def logs(self) -> str:
        """Both processes' whole logs (for assertions on what MCM said)."""
        return "\n".join(
            self.runner.log(b).read_text(errors="replace") for b in ("machine-controller-manager", "machine-controller")
        )

    async def tear_down(self) -> None:
        """Stop MCM, then remove what it leaves behind: finalizers on its objects and the pool's Nodes (which
        are cluster-scoped and would outlive the namespace)."""
        await self.stop()
        custom = client.CustomObjectsApi(self.api)
        core = client.CoreV1Api(self.api)
        nodes: set[str] = set()
        for kind in MACHINE_KINDS:
            listed = await custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, kind)
            for item in listed["items"]:
                if kind == "machines":
                    nodes.add(mcm_pool.machine_node(item))
                if item["metadata"].get("finalizers"):
                    with contextlib.suppress(ApiException):
                        await custom.patch_namespaced_custom_object(
                            GROUP,
                            VERSION,
                            self.namespace,
                            kind,
                            item["metadata"]["name"],
                            {"metadata": {"finalizers": None}},
                            _content_type=mcm_pool.MERGE_PATCH,
                        )
        if self.runner.vm_state.exists():
            nodes.update(json.loads(self.runner.vm_state.read_text()))
        for name in sorted(nodes - {""}):
            with contextlib.suppress(ApiException):
                await core.patch_node(name, {"metadata": {"finalizers": None}}, _content_type=mcm_pool.MERGE_PATCH)
            with contextlib.suppress(ApiException):
                await core.delete_node(name)


# --- small helpers for reading and writing MCM's objects as an administrator ----------------------------------


async def _patch_machine_metadata(real_mcm: RealMcm, name: str, metadata: dict[str, Any]) -> None:
    await client.CustomObjectsApi(real_mcm.api).patch_namespaced_custom_object(
        GROUP, VERSION, real_mcm.namespace, "machines", name, {"metadata": metadata}, _content_type=mcm_pool.MERGE_PATCH
    )


async def annotate_machine(real_mcm: RealMcm, name: str, annotations: dict[str, str | None]) -> None:
    await _patch_machine_metadata(real_mcm, name, {"annotations": annotations})


async def annotate_node(real_mcm: RealMcm, name: str, annotations: dict[str, str | None]) -> None:
    await client.CoreV1Api(real_mcm.api).patch_node(
        name, {"metadata": {"annotations": annotations}}, _content_type=mcm_pool.MERGE_PATCH
    )


async def machine_annotations(real_mcm: RealMcm, name: str) -> dict[str, str]:
    machine = await real_mcm.machine(name)
    assert machine is not None, f"machine {name} is gone"
    found: dict[str, str] = machine["metadata"].get("annotations") or {}
    return found


async def nudge_machine(real_mcm: RealMcm, name: str) -> None:
    """Change a label of the Machine: MCM's MachineSet controller syncs on every Machine update, so this
    stands in for its periodic resync (10 minutes) where a test cannot wait that long."""
    nudged = {"e2e.machine-preservation/nudged": str(time.monotonic_ns())}
    await _patch_machine_metadata(real_mcm, name, {"labels": nudged})


async def patch_machine_deployment(real_mcm: RealMcm, name: str, patch: dict[str, Any]) -> None:
    await client.CustomObjectsApi(real_mcm.api).patch_namespaced_custom_object(
        GROUP, VERSION, real_mcm.namespace, "machinedeployments", name, patch, _content_type=mcm_pool.MERGE_PATCH
    )


def preserve_expiry(machine: dict[str, Any]) -> dt.datetime | None:
    """`status.currentStatus.preserveExpiryTime` (where MCM v0.62 keeps a preservation's expiry), if set."""
    text = ((machine.get("status") or {}).get("currentStatus") or {}).get("preserveExpiryTime")
    return dt.datetime.fromisoformat(text) if text else None


def preserved_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    """The Node's `Preserved` condition, if it has one."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Preserved":
            found: dict[str, Any] = condition
            return found
    return None


async def fail_machine(real_mcm: RealMcm, name: str, *, limit: float = 90.0) -> None:
    """Take the machine's node out of service as a dying node would, and wait until MCM marks it Failed.

    Ready turns False (the kubelet says so); once MCM has had the machine Unknown for longer than its health
    timeout, Ready turns Unknown (the node lifecycle controller's mark for a kubelet that stopped posting). MCM
    checks a machine's health again at once on that change; without it, a check that ran before the timeout
    was up is repeated only a minute later."""
    await real_mcm.set_node_ready(name, False)
    timeout = parse_go_duration_nanoseconds(real_mcm.runner.settings.machine_health_timeout) / 1e9
    deadline = time.monotonic() + limit
    marked_unknown = False
    while real_mcm.recorder.first(name, phase="Failed") is None:
        unknown = real_mcm.recorder.first(name, phase="Unknown")
        if not marked_unknown and unknown is not None and time.monotonic() > unknown.at + timeout + 0.5:
            await real_mcm.set_node_ready(name, "Unknown")
            marked_unknown = True
        if time.monotonic() > deadline:
            raise AssertionError(f"machine {name} not Failed within {limit:.0f}s: {real_mcm.recorder.history(name)}")
        await asyncio.sleep(0.25)
