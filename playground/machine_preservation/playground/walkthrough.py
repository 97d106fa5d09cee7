"""The documented use cases, run one after another against the live stack, each checked.

Every step does what an SRE or Shoot author would do — mostly with kubectl, whose output (denials,
warnings) is shown as is — then waits for the objects to reach the documented state. A step passes
only if that state is reached within its time limit. Machines, their replacements and their Nodes come
from real MCM; the only thing played here is a node's health (its kubelet stops reporting Ready).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.models import Machine, Node
from machine_preservation.localcluster import mcm_pool
from machine_preservation.localcluster.mcm_runner import MACHINE_CONTROLLER
from machine_preservation.playground import landscape
from machine_preservation.playground.stack import Stack
from machine_preservation.playground.timeline import Timeline

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
# What kubectl shows for a denied delete, and what MCM's delete of a kept machine gets.
KEPT_DENIAL = "is Failed and preserved until"
Step = tuple[str, Callable[[], Awaitable[str]]]


@dataclass
class StepResult:
    number: int
    title: str
    passed: bool
    detail: str
    seconds: float


class StepFailed(Exception):
    """A use case did not behave as documented; the message says what was expected."""


@dataclass
class Walkthrough:
    stack: Stack
    timeline: Timeline
    preserve_timeout: dt.timedelta
    # A failed machine that is not kept is replaced by MCM within about 45 s (its termination walks
    # drain, VM, Node and finalizers a few seconds apart, then a new Machine starts): room for a busy machine.
    wait_limit: float = 150.0
    # Machines later steps build on.
    now_preserved: str = ""
    now_expiry: dt.datetime = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    when_failed_preserved: str = ""
    when_failed_expiry: dt.datetime = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    auto_preserved: str = ""
    waiting: str = ""
    ca_preserved: str = ""

    @property
    def api(self) -> client.ApiClient:
        return self.stack.admin

    # --- primitives -----------------------------------------------------------------------------

    async def kubectl(self, *args: str, kubeconfig: Path | None = None, who: str = "") -> tuple[int, str]:
        """Run kubectl as the SRE (admin) would, or as `who` with `kubeconfig`; echo the command and its
        output into the timeline."""
        return await kubectl(
            self.stack.toolchain.kubectl, *args,
            kubeconfig=kubeconfig or self.stack.admin_kubeconfig, cache=self.stack.directory / "kube-cache",
            say=self.timeline.say, who=who,
        )  # fmt: skip

    async def mcm_deletes(self, name: str) -> tuple[int, str]:
        """Ask the API server, as MCM and without deleting anything, what MCM's delete of the machine gets."""
        return await self.kubectl(
            "delete", "machine", name, "-n", landscape.CONTROL_NAMESPACE, "--dry-run=server",
            kubeconfig=self.stack.kubeconfigs["mcm"], who="MCM",
        )  # fmt: skip

    async def wait_for(self, description: str, check: Callable[[], Awaitable[bool]], *, limit: float) -> None:
        """Poll `check` (observing the timeline meanwhile) until true; a spinner shows the wait on a TTY."""

        async def observe() -> None:
            await self.timeline.observe()
            self.stack.check_processes()

        await wait_until(description, check, limit=limit, meanwhile=observe)

    async def machine(self, name: str) -> Machine | None:
        custom = client.CustomObjectsApi(self.api)
        raw = await custom.get_namespaced_custom_object_without_preload_content(
            v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, landscape.CONTROL_NAMESPACE, "machines", name
        )
        return Machine.model_validate(json.loads(await raw.read())) if raw.status == 200 else None

    async def node(self, name: str) -> Node | None:
        raw = await self._raw_node(name)
        return Node.model_validate(raw) if raw is not None else None

    async def node_labels(self, name: str) -> dict[str, str]:
        """The Node's labels (the product's Node model does not keep them)."""
        raw = await self._raw_node(name)
        return dict((raw or {}).get("metadata", {}).get("labels") or {})

    async def _raw_node(self, name: str) -> dict[str, Any] | None:
        raw = await client.CoreV1Api(self.api).read_node_without_preload_content(name)
        return json.loads(await raw.read()) if raw.status == 200 else None

    async def node_of(self, machine: str) -> Node | None:
        found = await self.machine(machine)
        return await self.node(found.node_name) if found is not None and found.node_name else None

    async def machines_of(self, deployment: landscape.Deployment) -> list[Machine]:
        """The MachineDeployment's machines (its MachineSets' selector label), by name."""
        raw = await mcm_pool.list_machines(self.api, landscape.CONTROL_NAMESPACE, pool=deployment.name)
        return [Machine.model_validate(item) for item in raw]

    async def running_machine(self, deployment: landscape.Deployment, *, exclude: tuple[str, ...] = ()) -> str:
        """A Running machine of the MachineDeployment (waiting for one: MCM may still be replacing one)."""
        found: list[str] = []

        async def running() -> bool:
            names = [
                m.metadata.name
                for m in await self.machines_of(deployment)
                if m.phase == v.MachinePhase.RUNNING and m.metadata.name not in exclude
            ]
            found[:] = names[:1]
            return bool(names)

        await self.wait_for(f"a Running machine in {deployment.name}", running, limit=self.wait_limit)
        return found[0]

    async def fail_node(self, machine: str) -> str:
        """The machine's kubelet stops reporting Ready (and keeps not doing so); returns the node's name."""
        found = await self.machine(machine)
        if found is None or not found.node_name:
            raise StepFailed(f"machine {machine} has no node to fail")
        self.timeline.say(f"(simulating a failure: node {found.node_name} stops reporting Ready)")
        await self.stack.kubelets.set_ready(found.node_name, False)
        return found.node_name

    async def event_time(self, machine: str, reason: str) -> dt.datetime | None:
        """When the controller first recorded the Event `reason` about the machine, if it did."""
        events = await client.CoreV1Api(self.api).list_namespaced_event(
            landscape.CONTROL_NAMESPACE, field_selector=f"involvedObject.name={machine},reason={reason}"
        )
        times = [e.first_timestamp or e.event_time for e in events.items]
        found = [t for t in times if isinstance(t, dt.datetime)]
        return min(found) if found else None

    async def event_reasons(self, machine: str) -> list[str]:
        """The reasons of the Events about the machine, oldest first (for a failure's message)."""
        events = await client.CoreV1Api(self.api).list_namespaced_event(
            landscape.CONTROL_NAMESPACE, field_selector=f"involvedObject.name={machine}"
        )
        ordered = sorted(events.items, key=lambda e: str(e.first_timestamp or e.event_time or ""))
        return [f"{e.reason} x{e.count or 1}" for e in ordered]

    # --- expectations ---------------------------------------------------------------------------

    async def preserved(self, name: str, *, reason: str, drained: bool = False) -> bool:
        machine = await self.machine(name)
        node = await self.node(machine.node_name) if machine is not None and machine.node_name else None
        if machine is None or machine.preservation is None or node is None:
            return False
        condition = node.preserved_condition
        message = v.DRAINED_SUCCESSFULLY_MESSAGE if drained else v.PRESERVED_UNTIL_MESSAGE_PREFIX
        return (
            condition is not None
            and condition.status == "True"
            and condition.reason == reason
            and condition.message.startswith(message)
            and node.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
            and node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT) == drained
        )

    async def stopped(self, name: str) -> bool:
        machine, node = await self.machine(name), await self.node_of(name)
        if machine is None or node is None or machine.preservation is not None:
            return False
        condition = node.preserved_condition
        return (
            condition is not None
            and condition.reason == v.ConditionReason.PRESERVATION_STOPPED
            and v.CA_SCALE_DOWN_DISABLED_ANNOTATION not in node.metadata.annotations
            and v.PRESERVE_ANNOTATION not in node.metadata.annotations
            and not node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        )

    async def expiry_of(self, name: str) -> dt.datetime:
        machine = await self.machine(name)
        record = machine.preservation if machine is not None else None
        if record is None:
            raise StepFailed(f"{name} lost its preservation record right after being preserved")
        return record.until

    async def replaced(self, deployment: landscape.Deployment, gone: str, *, keep: tuple[str, ...] = ()) -> bool:
        """`gone` is deleted and the MachineDeployment has its replicas again, `keep` among them."""
        names = [m.metadata.name for m in await self.machines_of(deployment)]
        return gone not in names and all(k in names for k in keep) and len(names) == deployment.pool.machines_per_zone

    # --- the use cases --------------------------------------------------------------------------

    async def preserve_running_node(self) -> str:
        core = landscape.deployments(landscape.CORE)[0]
        name = await self.running_machine(core)
        await self.kubectl("annotate", "node", name, f"{v.PRESERVE_ANNOTATION}=now")
        await self.wait_for(
            f"{name} preserved (expiry, CA annotation, condition True, no taint)",
            lambda: self.preserved(name, reason=v.ConditionReason.PRESERVED_BY_USER),
            limit=self.wait_limit,
        )
        machine = await self.machine(name)
        record = machine.preservation if machine is not None else None
        if record is None:
            raise StepFailed(f"{name} lost its preservation record right after being preserved")
        granted = record.until - record.since
        if granted != self.preserve_timeout:
            raise StepFailed(
                f"{name} is preserved for {format_go_duration(granted)}, not for the pool's machinePreserveTimeout "
                f"{format_go_duration(self.preserve_timeout)} from the Shoot in the Cluster resource"
            )
        self.now_preserved, self.now_expiry = name, record.until
        return (
            f"{name} preserved until {record.until:%H:%M:%S} (the pool's machinePreserveTimeout "
            f"{format_go_duration(granted)}, read from the Shoot); its node is kept from scale-down"
        )

    async def when_failed_then_failure(self) -> str:
        core = landscape.deployments(landscape.CORE)[0]
        name = await self.running_machine(core, exclude=(self.now_preserved,))
        await self.kubectl("annotate", "node", name, f"{v.PRESERVE_ANNOTATION}=when-failed")
        await asyncio.sleep(2)  # give the controller a chance to (wrongly) act
        machine = await self.machine(name)
        if machine is None or machine.preservation is not None:
            raise StepFailed(f"{name} must not be preserved while it is healthy")
        node = await self.fail_node(name)
        await self.wait_for(
            f"{name} Failed, preserved, tainted and drained",
            lambda: self.preserved(name, reason=v.ConditionReason.PRESERVED_BY_USER, drained=True),
            limit=self.wait_limit,
        )
        pods = await client.CoreV1Api(self.api).list_namespaced_pod(
            landscape.WORKLOAD_NAMESPACE, field_selector=f"spec.nodeName={node}"
        )
        left = sorted(str(p.metadata.name) for p in pods.items if p.metadata and p.metadata.deletion_timestamp is None)
        if left != [f"node-agent-{node}"]:
            raise StepFailed(f"after the drain only the DaemonSet pod should stay on {node}, found {left}")
        # MCM's MachineSet controller keeps trying to delete the Failed machine to replace it.
        code, output = await self.mcm_deletes(name)
        if code == 0 or KEPT_DENIAL not in output:
            raise StepFailed(f"MCM's delete of the preserved Failed machine {name} must be denied, naming the expiry")
        machine = await self.machine(name)
        if machine is None or machine.phase != v.MachinePhase.FAILED:
            raise StepFailed(f"{name} must stay, Failed, while it is preserved")
        self.when_failed_preserved, self.when_failed_expiry = name, await self.expiry_of(name)
        return (
            f"{name} Failed and kept for analysis; pods evicted through the PDB, the DaemonSet pod stayed; "
            "MCM's delete (to replace it) is denied"
        )

    async def auto_preservation(self) -> str:
        zone1, zone2 = landscape.deployments(landscape.EDGE)
        first = await self.running_machine(zone1)
        other_zone = await self.running_machine(zone2)
        for name in (first, other_zone):
            await self.fail_node(name)
        for name in (first, other_zone):
            await self.wait_for(f"{name} auto-preserved", partial(self.auto_kept, name), limit=self.wait_limit)
        # Zone z1's share is used. MCM v0.61.3 marks one machine of a MachineDeployment Failed at a time and
        # counts the kept one: the next failure there waits, Unknown, neither preserved nor replaced.
        waiting = await self.running_machine(zone1, exclude=(first,))
        await self.fail_node(waiting)
        await self.wait_for(
            f"MCM holding {waiting} Unknown (its one-replacement-at-a-time limit)",
            lambda: self.held_by_mcm(waiting),
            limit=self.wait_limit,
        )
        machine = await self.machine(waiting)
        if machine is None or machine.phase != v.MachinePhase.UNKNOWN or machine.preservation is not None:
            raise StepFailed(f"{waiting} must wait Unknown and unpreserved while {first} is kept")
        self.auto_preserved, self.waiting = first, waiting
        return (
            f"{first} (zone {zone1.zone}) and {other_zone} (zone {zone2.zone}) auto-preserved: the pool's max "
            f"{zone1.pool.auto_preserve_max} is {zone1.auto_preserve_share} per zone; the next failure in "
            f"{zone1.zone}, {waiting}, is not preserved (MCM holds it Unknown while {first} is kept)"
        )

    async def auto_kept(self, name: str) -> bool:
        """Failed, preserved by the auto value, drained."""
        machine = await self.machine(name)
        value = machine.metadata.annotations.get(v.PRESERVE_ANNOTATION) if machine else None
        return value == v.PreserveValue.AUTO and await self.preserved(
            name, reason=v.ConditionReason.PRESERVED_BY_MCM, drained=True
        )

    async def held_by_mcm(self, machine: str) -> bool:
        """MCM said it cannot mark the machine Failed because another machine of its MachineDeployment is
        being replaced (MCM v0.61.3's log; the rule is internal to MCM, so its word is the evidence)."""
        log = self.stack.mcm.log(MACHINE_CONTROLLER)
        text = log.read_text(errors="replace") if log.exists() else ""
        return f'Cannot mark `Unknown` machine="{machine}" as `Failed`' in text

    async def release_with_false(self) -> str:
        name, waiting = self.auto_preserved, self.waiting
        zone1 = landscape.deployments(landscape.EDGE)[0]
        await self.kubectl(
            "annotate", "machine", name, "-n", landscape.CONTROL_NAMESPACE, f"{v.PRESERVE_ANNOTATION}=false",
            "--overwrite",
        )  # fmt: skip
        await self.wait_for(
            f"{name} released and replaced by MCM", lambda: self.replaced(zone1, name), limit=self.wait_limit
        )
        # Now MCM lets the machine it held fail, and the zone's share is free again.
        await self.wait_for(
            f"{waiting} Failed and auto-preserved",
            partial(self.auto_kept, waiting),
            limit=self.wait_limit,
        )
        return (
            f"{name} released early with `false`: the controller deleted it and MCM replaced it; then MCM let "
            f"{waiting} fail, and it took the zone's free share"
        )

    async def expiry(self) -> str:
        name, expiry = self.now_preserved, self.now_expiry
        remaining = (expiry - dt.datetime.now(dt.UTC)).total_seconds()
        if remaining > 0:
            self.timeline.say(f"(waiting for {name}'s preservation to end at {expiry:%H:%M:%S}, in {remaining:.0f}s)")

        async def expired() -> bool:
            reported = await self.event_time(name, v.EventReason.PRESERVATION_EXPIRED) is not None
            return reported and await self.stopped(name)

        try:
            await self.wait_for(f"{name} expired, cleaned up and reported", expired, limit=max(remaining, 0) + 30)
        except StepFailed as failure:
            raise StepFailed(f"{failure}; Events about it: {await self.event_reasons(name)}") from None
        node = await self.node_of(name)
        if node is None or v.PRESERVE_ANNOTATION in node.metadata.annotations:
            raise StepFailed(f"the expired `now` annotation must be removed from {name}'s node")
        stopped_at = await self.event_time(name, v.EventReason.PRESERVATION_EXPIRED)
        assert stopped_at is not None
        machine = await self.machine(name)
        if machine is None or machine.phase != v.MachinePhase.RUNNING:
            raise StepFailed(f"{name} is healthy: it must stay Running after its preservation expired")
        # The Failed machine preserved with `when-failed` expires, too: it goes, and MCM replaces it.
        failed, core = self.when_failed_preserved, landscape.deployments(landscape.CORE)[0]
        remaining = (self.when_failed_expiry - dt.datetime.now(dt.UTC)).total_seconds()
        await self.wait_for(
            f"{failed} (Failed) expired, deleted and replaced by MCM",
            lambda: self.replaced(core, failed, keep=(name,)),
            limit=max(remaining, 0) + self.wait_limit,
        )
        late = max((stopped_at - expiry).total_seconds(), 0)
        return (
            f"{name} stopped {late:.0f}s after its expiry (Event {v.EventReason.PRESERVATION_EXPIRED}): annotation, "
            f"CA annotation and condition cleaned up, the machine kept running; the Failed {failed} "
            "was deleted at its expiry and MCM replaced it"
        )

    async def rejections(self) -> str:
        target = await self.running_machine(landscape.deployments(landscape.EDGE)[1])
        code, output = await self.kubectl("annotate", "node", target, f"{v.PRESERVE_ANNOTATION}=forever")
        if code == 0 or "when-failed" not in output:
            raise StepFailed("a bad preserve value must be denied with the allowed values")
        code, output = await self.kubectl(
            "patch", "shoot", landscape.SHOOT_NAME, "-n", landscape.GARDEN_NAMESPACE, "--type=json",
            "-p", '[{"op": "replace", "path": "/spec/provider/workers/1/machineControllerManager/'
            'autoPreserveFailedMachineMax", "value": 9}]',
        )  # fmt: skip
        if code == 0 or "spec.provider.workers[1].machineControllerManager.autoPreserveFailedMachineMax" not in output:
            raise StepFailed("a Shoot with autoPreserveFailedMachineMax above maximum must be denied with its path")
        return "bad annotation and bad Shoot denied, each naming the field and what is allowed"

    async def ca_annotation_restored(self) -> str:
        name = await self.running_machine(landscape.deployments(landscape.EDGE)[1])
        await self.kubectl("annotate", "node", name, f"{v.PRESERVE_ANNOTATION}=now")
        await self.wait_for(
            f"{name} preserved",
            lambda: self.preserved(name, reason=v.ConditionReason.PRESERVED_BY_USER),
            limit=self.wait_limit,
        )
        code, output = await self.kubectl(
            "annotate", "node", name, f"{v.CA_SCALE_DOWN_DISABLED_ANNOTATION}=false", "--overwrite"
        )
        node = await self.node(name)
        value = node.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) if node else None
        if code != 0 or "Warning" not in output or value != "true":
            raise StepFailed(f'the CA annotation must be restored to "true" with a warning, found {value!r}')
        self.ca_preserved = name
        return f'the user\'s "false" on {name} was turned back into "true", with a warning'

    async def scale_to_zero(self) -> str:
        edge = landscape.deployments(landscape.EDGE)
        zone2 = edge[1]
        kept_running = self.ca_preserved
        # A Failed machine kept in the zone: the one auto-preserved earlier if it is still kept, else a new failure.
        kept_failed = next(
            (
                m.metadata.name
                for m in await self.machines_of(zone2)
                if m.phase == v.MachinePhase.FAILED and m.preservation is not None
            ),
            "",
        )
        if not kept_failed:
            kept_failed = await self.running_machine(zone2, exclude=(kept_running,))
            await self.fail_node(kept_failed)
            await self.wait_for(
                f"{kept_failed} auto-preserved (zone {zone2.zone}'s share)",
                partial(self.auto_kept, kept_failed),
                limit=self.wait_limit,
            )
        for name in (kept_running, kept_failed):
            machine = await self.machine(name)
            if machine is None or machine.preservation is None:
                raise StepFailed(f"{name} must still be preserved when the pool is scaled to zero (timeout too short?)")
        machines = {m.metadata.name: m.node_name for d in edge for m in await self.machines_of(d)}
        await self.kubectl(
            "scale", "machinedeployment", *(d.name for d in edge), "--replicas=0", "-n", landscape.CONTROL_NAMESPACE
        )

        async def all_gone() -> bool:
            left = [m for d in edge for m in await self.machines_of(d)]
            nodes = [n for n in machines.values() if n and await self.node(n) is not None]
            return not left and not nodes

        await self.wait_for(
            f"every machine of pool {landscape.EDGE.name} and its node gone", all_gone, limit=self.wait_limit
        )
        return (
            f"pool {landscape.EDGE.name} scaled to 0: all {len(machines)} machines went, the preserved "
            f"{kept_running} (Running, `now`) and {kept_failed} (Failed, auto-preserved) included: the deletion "
            "guard lets MCM's delete through when the replica count needs it"
        )

    def steps(self) -> list[Step]:
        return [
            ("Preserve a Running node with `now`", self.preserve_running_node),
            ("`when-failed`, then a failure", self.when_failed_then_failure),
            ("Auto-preservation: each zone's share", self.auto_preservation),
            ("Early release with `false`", self.release_with_false),
            ("Expiry", self.expiry),
            ("Bad annotation and bad Shoot rejected", self.rejections),
            ("CA annotation flipped by a user is restored", self.ca_annotation_restored),
            ("Scale to zero takes preserved machines too", self.scale_to_zero),
        ]

    async def run(self) -> list[StepResult]:
        return await run_steps(self.steps(), say=self.timeline.say)


async def kubectl(
    binary: Path, *args: str, kubeconfig: Path, cache: Path, say: Callable[[str], None], who: str = ""
) -> tuple[int, str]:
    """Run kubectl with `kubeconfig` (as `who`, if said); echo the command and its output through `say`."""
    say(("(as " + who + ") " if who else "") + "$ kubectl " + " ".join(args))
    # The virtualenv's scripts first: kubectl finds the package's plugin (`kubectl preservation`) there.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "KUBECACHEDIR": str(cache), "PATH": path}
    # The kubeconfig flag after the arguments: kubectl takes no flag before a plugin's name.
    process = await asyncio.create_subprocess_exec(
        str(binary), *args, f"--kubeconfig={kubeconfig}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    output, _ = await process.communicate()
    text = output.decode(errors="replace").strip()
    for line in text.splitlines():
        say(f"  | {line}")
    return process.returncode or 0, text


async def run_steps(steps: list[Step], *, say: Callable[[str], None]) -> list[StepResult]:
    """Run the steps in order, announcing each and its outcome; stop at the first that fails (later steps build
    on earlier ones)."""
    results = []
    loop = asyncio.get_running_loop()
    for number, (title, step) in enumerate(steps, start=1):
        say(f"── {number}. {title}")
        start = loop.time()
        try:
            detail = await step()
        except StepFailed as failure:
            results.append(StepResult(number, title, False, str(failure), loop.time() - start))
            say(f"✗ {failure}")
            break
        results.append(StepResult(number, title, True, detail, loop.time() - start))
        say(f"✓ {detail}")
    return results


async def wait_until(
    description: str,
    check: Callable[[], Awaitable[bool]],
    *,
    limit: float,
    meanwhile: Callable[[], Awaitable[None]],
    interval: float = 0.25,
) -> None:
    """Poll `check` (calling `meanwhile` before each look: observe, check the processes) until true, else
    StepFailed; a spinner shows the wait on a TTY."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tick = 0
    while True:
        await meanwhile()
        if await check():
            if sys.stdout.isatty():
                sys.stdout.write("\r\033[K")
            return
        waited = loop.time() - start
        if waited > limit:
            raise StepFailed(f"timed out after {waited:.0f}s waiting for: {description}")
        if sys.stdout.isatty():
            sys.stdout.write(f"\r{SPINNER[tick % len(SPINNER)]} waiting {waited:4.0f}s: {description}\033[K")
            sys.stdout.flush()
        tick += 1
        await asyncio.sleep(interval)


def summary_table(results: list[StepResult], *, total_steps: int) -> str:
    rows = [(str(r.number), r.title, "passed" if r.passed else "FAILED", f"{r.seconds:.0f}s") for r in results]
    rows += [(str(n), "(not run)", "skipped", "-") for n in range(len(results) + 1, total_steps + 1)]
    header = ("#", "use case", "result", "time")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
