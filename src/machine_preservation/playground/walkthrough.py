"""The documented use cases, run one after another against the live stack, each checked.

Every step does what an SRE or Shoot author would do — mostly with kubectl, whose output (denials,
warnings) is shown as is — then waits for the objects to reach the documented state. A step passes
only if that state is reached within its time limit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node
from machine_preservation.playground import landscape
from machine_preservation.playground.stack import Stack
from machine_preservation.playground.timeline import Timeline
from machine_preservation.standin.mcm import set_node_ready

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


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
    wait_limit: float = 90.0
    # Machines later steps build on.
    now_preserved: str = ""
    now_expiry: dt.datetime = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    auto_preserved: str = ""

    @property
    def api(self) -> client.ApiClient:
        return self.stack.admin

    # --- primitives -----------------------------------------------------------------------------

    async def kubectl(self, *args: str) -> tuple[int, str]:
        """Run kubectl as the SRE (admin) would; echo the command and its output into the timeline."""
        self.timeline.say("$ kubectl " + " ".join(args))
        env = {**os.environ, "KUBECACHEDIR": str(self.stack.directory / "kube-cache")}
        process = await asyncio.create_subprocess_exec(
            str(self.stack.toolchain.kubectl), f"--kubeconfig={self.stack.admin_kubeconfig}", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )  # fmt: skip
        output, _ = await process.communicate()
        text = output.decode(errors="replace").strip()
        for line in text.splitlines():
            self.timeline.say(f"  | {line}")
        return process.returncode or 0, text

    async def wait_for(self, description: str, check: Callable[[], Awaitable[bool]], *, limit: float) -> None:
        """Poll `check` (observing the timeline meanwhile) until true; a spinner shows the wait on a TTY."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        tick = 0
        while True:
            await self.timeline.observe()
            self.stack.check_processes()
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
            await asyncio.sleep(0.25)

    async def machine(self, name: str) -> Machine | None:
        custom = client.CustomObjectsApi(self.api)
        raw = await custom.get_namespaced_custom_object_without_preload_content(
            v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, landscape.CONTROL_NAMESPACE, "machines", name
        )
        return Machine.model_validate(json.loads(await raw.read())) if raw.status == 200 else None

    async def node(self, name: str) -> Node | None:
        raw = await client.CoreV1Api(self.api).read_node_without_preload_content(name)
        return Node.model_validate(json.loads(await raw.read())) if raw.status == 200 else None

    async def machines_of(self, machine_set: str) -> list[Machine]:
        custom = client.CustomObjectsApi(self.api)
        raw = await custom.list_namespaced_custom_object_without_preload_content(
            v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, landscape.CONTROL_NAMESPACE, "machines"
        )
        items = [Machine.model_validate(item) for item in json.loads(await raw.read())["items"]]
        owned = [m for m in items if (o := m.metadata.controller_owner()) is not None and o.name == machine_set]
        return sorted(owned, key=lambda m: m.metadata.name)

    async def running_machine(self, machine_set: str, *, exclude: tuple[str, ...] = ()) -> str:
        for machine in await self.machines_of(machine_set):
            if machine.phase == v.MachinePhase.RUNNING and machine.metadata.name not in exclude:
                return machine.metadata.name
        raise StepFailed(f"no Running machine left in {machine_set}")

    async def fail_node(self, name: str) -> None:
        self.timeline.say(f"(simulating a failure: node {name} stops reporting Ready)")
        await set_node_ready(self.api, name=name, ready=False)

    # --- expectations ---------------------------------------------------------------------------

    async def preserved(self, name: str, *, reason: str, drained: bool = False) -> bool:
        machine, node = await self.machine(name), await self.node(name)
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
        machine, node = await self.machine(name), await self.node(name)
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

    # --- the use cases --------------------------------------------------------------------------

    async def preserve_running_node(self) -> str:
        core_set = landscape.machine_set_name(landscape.POOLS[1], 0)
        name = await self.running_machine(core_set)
        await self.kubectl("annotate", "node", name, f"{v.PRESERVE_ANNOTATION}=now")
        await self.wait_for(
            f"{name} preserved (expiry, CA annotation, condition True, no taint)",
            lambda: self.preserved(name, reason=v.ConditionReason.PRESERVED_BY_USER),
            limit=self.wait_limit,
        )
        machine = await self.machine(name)
        expiry = machine.preservation.until if machine is not None and machine.preservation is not None else None
        if expiry is None:
            raise StepFailed(f"{name} lost its expiry right after being preserved")
        self.now_preserved, self.now_expiry = name, expiry
        return f"{name} preserved until {self.now_expiry:%H:%M:%S}; its node is kept from scale-down"

    async def when_failed_then_failure(self) -> str:
        core_set = landscape.machine_set_name(landscape.POOLS[1], 0)
        name = await self.running_machine(core_set, exclude=(self.now_preserved,))
        await self.kubectl("annotate", "node", name, f"{v.PRESERVE_ANNOTATION}=when-failed")
        await asyncio.sleep(2)  # give the controller a chance to (wrongly) act
        machine = await self.machine(name)
        if machine is None or machine.preservation is not None:
            raise StepFailed(f"{name} must not be preserved while it is healthy")
        await self.fail_node(name)
        await self.wait_for(
            f"{name} Failed, preserved, tainted and drained",
            lambda: self.preserved(name, reason=v.ConditionReason.PRESERVED_BY_USER, drained=True),
            limit=self.wait_limit,
        )
        pods = await client.CoreV1Api(self.api).list_namespaced_pod(
            landscape.WORKLOAD_NAMESPACE, field_selector=f"spec.nodeName={name}"
        )
        left = sorted(str(p.metadata.name) for p in pods.items if p.metadata and p.metadata.deletion_timestamp is None)
        if left != [f"node-agent-{name}"]:
            raise StepFailed(f"after the drain only the DaemonSet pod should stay on {name}, found {left}")
        return f"{name} kept for analysis; pods evicted through the PDB, the DaemonSet pod stayed"

    async def auto_preservation(self) -> str:
        edge_set = landscape.machine_set_name(landscape.POOLS[0], 0)
        first = await self.running_machine(edge_set)
        await self.fail_node(first)
        await self.wait_for(
            f"{first} auto-preserved",
            lambda: self.preserved(first, reason=v.ConditionReason.PRESERVED_BY_MCM, drained=True),
            limit=self.wait_limit,
        )
        second = await self.running_machine(edge_set, exclude=(first,))
        await self.fail_node(second)

        async def replaced() -> bool:
            names = [m.metadata.name for m in await self.machines_of(edge_set)]
            return second not in names and first in names and len(names) == 2

        await self.wait_for(
            f"{second} replaced (the MachineSet's budget of 1 is used)", replaced, limit=self.wait_limit
        )
        self.auto_preserved = first
        return f"{first} auto-preserved; the next failure, {second}, was replaced"

    async def release_with_false(self) -> str:
        name = self.auto_preserved
        namespace = landscape.CONTROL_NAMESPACE
        await self.kubectl(
            "annotate", "machine", name, "-n", namespace, f"{v.PRESERVE_ANNOTATION}=false", "--overwrite"
        )
        edge_set = landscape.machine_set_name(landscape.POOLS[0], 0)

        async def released_and_replaced() -> bool:
            names = [m.metadata.name for m in await self.machines_of(edge_set)]
            return name not in names and len(names) == 2

        await self.wait_for(f"{name} released and replaced", released_and_replaced, limit=self.wait_limit)
        return f"{name} released early with `false`; MCM replaced it"

    async def expiry(self) -> str:
        name, expiry = self.now_preserved, self.now_expiry
        remaining = (expiry - dt.datetime.now(dt.UTC)).total_seconds()
        if remaining > 0:
            self.timeline.say(f"(waiting for {name}'s preservation to end at {expiry:%H:%M:%S}, in {remaining:.0f}s)")
        await self.wait_for(f"{name} expired and cleaned up", lambda: self.stopped(name), limit=max(remaining, 0) + 30)
        late = (dt.datetime.now(dt.UTC) - expiry).total_seconds()
        node = await self.node(name)
        if node is None or v.PRESERVE_ANNOTATION in node.metadata.annotations:
            raise StepFailed(f"the expired `now` annotation must be removed from {name}")
        return f"{name} stopped at most {late:.1f}s after its expiry; annotation, CA annotation, condition cleaned up"

    async def rejections(self) -> str:
        target = await self.running_machine(landscape.machine_set_name(landscape.POOLS[0], 1))
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
        name = await self.running_machine(landscape.machine_set_name(landscape.POOLS[0], 1))
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
        return f'the user\'s "false" on {name} was turned back into "true", with a warning'

    def steps(self) -> list[tuple[str, Callable[[], Awaitable[str]]]]:
        return [
            ("Preserve a Running node with `now`", self.preserve_running_node),
            ("`when-failed`, then a failure", self.when_failed_then_failure),
            ("Auto-preservation up to the limit", self.auto_preservation),
            ("Early release with `false`", self.release_with_false),
            ("Expiry", self.expiry),
            ("Bad annotation and bad Shoot rejected", self.rejections),
            ("CA annotation flipped by a user is restored", self.ca_annotation_restored),
        ]

    async def run(self) -> list[StepResult]:
        results = []
        loop = asyncio.get_running_loop()
        for number, (title, step) in enumerate(self.steps(), start=1):
            self.timeline.say(f"── {number}. {title}")
            start = loop.time()
            try:
                detail = await step()
            except StepFailed as failure:
                results.append(StepResult(number, title, False, str(failure), loop.time() - start))
                self.timeline.say(f"✗ {failure}")
                break  # later steps build on earlier ones
            results.append(StepResult(number, title, True, detail, loop.time() - start))
            self.timeline.say(f"✓ {detail}")
        return results


def summary_table(results: list[StepResult], *, total_steps: int) -> str:
    rows = [(str(r.number), r.title, "passed" if r.passed else "FAILED", f"{r.seconds:.0f}s") for r in results]
    rows += [(str(n), "(not run)", "skipped", "-") for n in range(len(results) + 1, total_steps + 1)]
    header = ("#", "use case", "result", "time")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
