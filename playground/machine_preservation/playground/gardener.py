"""The Gardener playground (`make run`): a local seed with two shoots, one installation of the product, and the use
cases walked through over both shoots, showing what a Gardener operator sees.

The seed is a real kube-apiserver with Gardener's seed CRDs; the product is installed once, as gardenlet installs
it (the seed chart rendered with gardenlet's values, its webhook and extension processes under the chart's
ServiceAccounts, `localcluster/gardener_landscape.py`). Each shoot has its own kube-apiserver, its real
gardener-resource-manager and its real machine-controller-manager v0.61.3 (Machines in the shoot namespace of the
seed, Nodes in the shoot). The playground plays gardenlet (shoot namespaces, `Cluster`s, `Extension`s, judged
ready as gardenlet does) and the shoots' kubelets; everything else is the real thing.

Shoot a sets its pool's `machinePreserveTimeout` in the extension's `providerConfig` (Gardener ≤ v1.146), shoot b
in the Shoot's own worker fields (Gardener ≥ v1.147).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener.shoot_resources import (
    MANAGED_RESOURCE,
    SHOOT_ACCESS_SECRET,
    WEBHOOK_CONFIGURATION,
)
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster import gardener_landscape as landscape
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import (
    POOL_LABEL,
    create_pool,
    list_machines,
    machine_node,
    machine_phase,
    wait_for_pool,
)
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.playground.stack import MCM_SETTINGS
from machine_preservation.playground.timeline import Timeline
from machine_preservation.playground.walkthrough import (
    KEPT_DENIAL,
    Step,
    StepFailed,
    kubectl,
    run_steps,
    summary_table,
    wait_until,
)

POOL = "worker1"
REPLICAS = 2
# Short names: MCM's client certificate carries `system:serviceaccount:<namespace>:machine-controller-manager`.
SHOOTS = {"a": gardener.shoot_namespace_name("dev", "a"), "b": gardener.shoot_namespace_name("dev", "b")}
PROVIDER_CONFIG_TIMEOUT = dt.timedelta(hours=1)  # shoot a, in the Extension's providerConfig
WORKER_FIELD_TIMEOUT = dt.timedelta(hours=2)  # shoot b, in the Shoot's worker fields
PROVIDER_CONFIG: dict[str, Any] = {
    "apiVersion": "machine-preservation.extensions.gardener.cloud/v1alpha1",
    "kind": "PreservationConfig",
    "workers": [{"name": POOL, "machinePreserveTimeout": format_go_duration(PROVIDER_CONFIG_TIMEOUT)}],
}
WAIT_LIMIT = 60.0
SETUP_LIMIT = 120.0


@dataclass
class Landscape:
    directory: Path
    toolchain: Toolchain
    seed_plane: ControlPlane
    seed: client.ApiClient
    installation: landscape.Installation
    shoots: dict[str, landscape.Shoot]
    announcer: Timeline  # says what happens, with the time since the start
    timelines: dict[str, Timeline] = field(default_factory=dict)  # one per shoot: its Machines and Nodes

    def say(self, text: str) -> None:
        self.announcer.say(text)

    def check_processes(self) -> None:
        """Raise if a component died, with the end of its log."""
        problem = self.installation.exited()
        if problem is not None:
            raise RuntimeError(problem)
        for key, shoot in self.shoots.items():
            if not shoot.mcm.running():
                raise RuntimeError(f"machine-controller-manager of shoot {key} exited:\n{shoot.mcm.log_tail(20)}")
            if not shoot.grm.running():
                raise RuntimeError(f"gardener-resource-manager of shoot {key} exited:\n{shoot.grm.log_tail(20)}")

    async def observe(self) -> None:
        for timeline in self.timelines.values():
            await timeline.observe()
        self.check_processes()

    async def wait_for(self, description: str, check: Callable[[], Awaitable[bool]], *, limit: float) -> None:
        await wait_until(description, check, limit=limit, meanwhile=self.observe)

    async def kubectl(self, *args: str, kubeconfig: Path, who: str = "") -> tuple[int, str]:
        return await kubectl(
            self.toolchain.kubectl, *args, kubeconfig=kubeconfig, cache=self.directory / "kube-cache",
            say=self.say, who=who,
        )  # fmt: skip


@contextlib.asynccontextmanager
async def started(directory: Path, toolchain: Toolchain, *, start: float) -> AsyncIterator[Landscape]:
    """The seed, the installation and both shoots with a Running pool each; torn down in reverse."""
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        plane = await asyncio.to_thread(
            stack.enter_context, landscape.seed_plane(directory=directory / "cluster", bin_dir=toolchain.bin_dir)
        )
        seed = await stack.enter_async_context(landscape.seed_client(plane))
        announcer = Timeline(api=seed, namespace="", started=start)
        say = announcer.say
        say("seed running: kube-apiserver, etcd, kube-controller-manager, with Gardener's seed CRDs")
        installed = await stack.enter_async_context(
            landscape.installation(plane, seed, toolchain, directory / "installation")
        )
        say(
            f"the product installed once, as gardenlet installs the seed chart: webhook (the shoots' and the "
            f"seed's routes, one process each) and extension in namespace {installed.namespace}, as the chart's "
            f"ServiceAccounts"
        )
        shoots = {}
        for key, namespace in SHOOTS.items():
            shoot = await stack.enter_async_context(
                landscape.new_shoot(
                    plane, seed, directory / "shoots" / key,
                    workers=[_worker(key)],
                    provider_config=PROVIDER_CONFIG if key == "a" else None,
                    mcm_settings=MCM_SETTINGS,
                    namespace=namespace,
                )
            )  # fmt: skip
            shoots[key] = shoot
            say(
                f"shoot {key} ({namespace}): its own kube-apiserver, gardener-resource-manager and "
                f"machine-controller-manager {DEFAULT_MCM_VERSION}; its Cluster {_settings_source(key)}"
            )
        result = Landscape(
            directory=directory, toolchain=toolchain, seed_plane=plane, seed=seed, installation=installed,
            shoots=shoots, announcer=announcer,
        )  # fmt: skip
        result.timelines = {
            key: Timeline(api=seed, namespace=s.namespace, started=start, node_api=s.api, label=key)
            for key, s in shoots.items()
        }
        for shoot in shoots.values():
            await create_pool(
                seed, shoot.namespace, POOL, replicas=REPLICAS,
                machine_deployment_labels={POOL_LABEL: POOL}, node_labels={POOL_LABEL: POOL},
            )  # fmt: skip
        for key, shoot in shoots.items():
            try:
                await wait_for_pool(seed, shoot.namespace, POOL, REPLICAS, target=shoot.api, limit=SETUP_LIMIT)
            except TimeoutError as error:
                raise StepFailed(f"shoot {key}: {error}") from None
        await result.observe()
        say(
            f"MCM: pool {POOL} of each shoot Running, {REPLICAS} machines with Ready nodes ({loop.time() - start:.0f}s)"
        )
        try:
            yield result
        finally:
            say("tearing down")


def _worker(key: str) -> dict[str, Any]:
    if key == "a":
        return gardener.worker(POOL, maximum=3)
    return gardener.worker(POOL, maximum=3, machine_preserve_timeout=format_go_duration(WORKER_FIELD_TIMEOUT))


def _settings_source(key: str) -> str:
    if key == "a":
        timeout = format_go_duration(PROVIDER_CONFIG_TIMEOUT)
        return f"enables the extension with providerConfig machinePreserveTimeout {timeout}"
    return f"has the Shoot's worker field machinePreserveTimeout {format_go_duration(WORKER_FIELD_TIMEOUT)}"


# --- what a Gardener operator sees ----------------------------------------------------------------------------------


def describe_condition(found: dict[str, Any]) -> str:
    if not found:
        return "-"
    text = f"{found.get('status')} ({found.get('reason', '')})"
    return f"{text}: {found['message']}" if found.get("message") else text


def operator_view(key: str, extension: dict[str, Any] | None, managed: dict[str, Any] | None) -> list[str]:
    """The lines a Gardener operator reads off a shoot's Extension and ManagedResource."""
    namespace = SHOOTS[key]
    if extension is None:
        lines = [f"shoot {key}: Extension {namespace}/{gardener.EXTENSION_TYPE}: not found"]
    else:
        status = extension.get("status") or {}
        last = status.get("lastOperation") or {}
        error = status.get("lastError")
        ready_reason = gardener.extension_ready(extension)
        healthy = describe_condition(landscape.condition(extension, contract.CONTROL_PLANE_HEALTHY))
        lines = [
            f"shoot {key}: Extension {namespace}/{gardener.EXTENSION_TYPE}: "
            f"{'Ready' if ready_reason is None else 'not ready: ' + ready_reason} (as gardenlet judges it)",
            f"    lastOperation: {last.get('type')} {last.get('state')} {last.get('progress')}% "
            f'"{last.get("description", "")}" at {last.get("lastUpdateTime")}',
            f"    lastError: {error.get('description') if error else 'none'}",
            f"    {contract.CONTROL_PLANE_HEALTHY}: {healthy}",
        ]
    if managed is None:
        lines.append(f"shoot {key}: ManagedResource {namespace}/{MANAGED_RESOURCE}: not found")
    else:
        lines.append(f"shoot {key}: ManagedResource {namespace}/{MANAGED_RESOURCE}:")
        for kind in ("ResourcesApplied", "ResourcesHealthy"):
            lines.append(f"    {kind}: {describe_condition(landscape.condition(managed, kind))}")
    return lines


# --- the walk-through -----------------------------------------------------------------------------------------------


@dataclass
class GardenerWalkthrough:
    land: Landscape
    now_preserved: str = ""  # shoot a
    when_failed_preserved: str = ""  # shoot b

    @property
    def seed(self) -> client.ApiClient:
        return self.land.seed

    def shoot(self, key: str) -> landscape.Shoot:
        return self.land.shoots[key]

    async def show_operator_view(self, key: str) -> None:
        namespace = SHOOTS[key]
        extension = await landscape.read_extension(self.seed, namespace)
        managed = await landscape.managed_resource(self.seed, namespace)
        for line in operator_view(key, extension, managed):
            self.land.say(line)

    async def served(self, key: str) -> bool:
        """Ready by gardenlet's check, ControlPlaneHealthy, and the ManagedResource applied and healthy."""
        namespace = SHOOTS[key]
        extension = await landscape.read_extension(self.seed, namespace)
        if extension is None or gardener.extension_ready(extension) is not None:
            return False
        if landscape.condition(extension, contract.CONTROL_PLANE_HEALTHY).get("status") != "True":
            return False
        managed = await landscape.managed_resource(self.seed, namespace)
        return all(
            landscape.condition(managed, kind).get("status") == "True"
            for kind in ("ResourcesApplied", "ResourcesHealthy")
        )

    async def running_machine(self, key: str, *, exclude: tuple[str, ...] = ()) -> tuple[str, str]:
        """A Running machine of the shoot's pool and its node."""
        for found in await list_machines(self.seed, SHOOTS[key], pool=POOL):
            name = found["metadata"]["name"]
            if machine_phase(found) == v.MachinePhase.RUNNING and machine_node(found) and name not in exclude:
                return name, machine_node(found)
        raise StepFailed(f"shoot {key} has no Running machine in pool {POOL}")

    async def node_state(self, key: str, machine: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        found = await landscape.machine(self.seed, SHOOTS[key], machine)
        node = await landscape.node(self.shoot(key), machine_node(found)) if found and machine_node(found) else None
        return found, node

    async def preserved(self, key: str, machine: str, *, failed: bool) -> bool:
        """The machine's record in the seed; its node in the shoot with the Preserved condition and the CA
        annotation; a Failed one Failed and tainted, a healthy one Running and not tainted."""
        found, node = await self.node_state(key, machine)
        if found is None or node is None or v.PRESERVED_UNTIL_ANNOTATION not in landscape.annotations_of(found):
            return False
        conditions = (node.get("status") or {}).get("conditions") or []
        preserved: dict[str, Any] = next((c for c in conditions if c.get("type") == v.PRESERVED_CONDITION_TYPE), {})
        phase = v.MachinePhase.FAILED if failed else v.MachinePhase.RUNNING
        return (
            preserved.get("status") == "True"
            and preserved.get("reason") == v.ConditionReason.PRESERVED_BY_USER
            and landscape.annotations_of(node).get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
            and machine_phase(found) == phase
            and landscape.tainted(node) == failed
        )

    async def record_of(self, key: str, machine: str) -> dict[str, str]:
        record = landscape.annotations_of(await landscape.machine(self.seed, SHOOTS[key], machine))
        if v.PRESERVED_UNTIL_ANNOTATION not in record:
            raise StepFailed(f"shoot {key}: {machine} lost its preservation record")
        return record

    # --- the use cases ----------------------------------------------------------------------------------------------

    async def enable(self) -> str:
        for key, namespace in SHOOTS.items():
            self.land.say(f"(gardenlet) Extension {namespace}/{gardener.EXTENSION_TYPE} created, operation reconcile")
            await gardener.apply_extension(
                self.seed, namespace, provider_config=PROVIDER_CONFIG if key == "a" else None
            )
        start = asyncio.get_running_loop().time()
        for key in SHOOTS:
            await self.land.wait_for(
                f"shoot {key}'s Extension Ready, ControlPlaneHealthy, its ManagedResource applied and healthy",
                lambda key=key: self.served(key),  # type: ignore[misc]
                limit=WAIT_LIMIT,
            )
        took = asyncio.get_running_loop().time() - start
        for key, namespace in SHOOTS.items():
            await self.land.kubectl(
                "get", "extensions,managedresources", "-n", namespace, kubeconfig=self.land.seed_plane.kubeconfig
            )
            await self.show_operator_view(key)
        for key in SHOOTS:
            webhooks = await client.AdmissionregistrationV1Api(
                self.shoot(key).api
            ).list_validating_webhook_configuration()
            if not [w for w in webhooks.items if w.metadata and w.metadata.name == WEBHOOK_CONFIGURATION]:
                raise StepFailed(f"shoot {key} has no node webhook configuration {WEBHOOK_CONFIGURATION}")
        return (
            f"both Extensions Ready {took:.0f}s after gardenlet created them; each shoot's ManagedResource put the "
            "node webhooks into the shoot"
        )

    async def bad_value_denied(self) -> str:
        _, node = await self.running_machine("a")
        code, output = await self.land.kubectl(
            "annotate", "node", node, f"{v.PRESERVE_ANNOTATION}=sometimes",
            kubeconfig=self.shoot("a").plane.kubeconfig, who="shoot a's owner",
        )  # fmt: skip
        if code == 0 or "when-failed" not in output:
            raise StepFailed("shoot a's API server must deny a bad preserve value, naming the allowed values")
        return "shoot a's own API server denied `sometimes`, naming the allowed values (its node webhook, via the seed)"

    async def preserve_now(self) -> str:
        machine, node = await self.running_machine("a")
        await self.land.kubectl(
            "annotate", "node", node, f"{v.PRESERVE_ANNOTATION}=now",
            kubeconfig=self.shoot("a").plane.kubeconfig, who="shoot a's owner",
        )  # fmt: skip
        await self.land.wait_for(
            f"shoot a: {machine} preserved (record in the seed, condition and CA annotation on its node)",
            lambda: self.preserved("a", machine, failed=False),
            limit=WAIT_LIMIT,
        )
        self.now_preserved = machine
        until = landscape.preserved_until(await self.record_of("a", machine))
        return f"shoot a: {machine} preserved until {until:%H:%M:%S} UTC, Running and untainted; kept from scale-down"

    async def when_failed(self) -> str:
        machine, node = await self.running_machine("b")
        shoot = self.shoot("b")
        await self.land.kubectl(
            "annotate", "node", node, f"{v.PRESERVE_ANNOTATION}=when-failed",
            kubeconfig=shoot.plane.kubeconfig, who="shoot b's owner",
        )  # fmt: skip
        self.land.say(f"(simulating a failure: shoot b's node {node} stops reporting Ready)")
        await shoot.kubelets.set_ready(node, False)
        await self.land.wait_for(
            f"shoot b: {machine} Failed, preserved and tainted",
            lambda: self.preserved("b", machine, failed=True),
            limit=WAIT_LIMIT,
        )
        self.when_failed_preserved = machine
        code, output = await self.land.kubectl(
            "delete", "machine", machine, "-n", SHOOTS["b"], "--dry-run=server",
            kubeconfig=shoot.mcm.directory / "mcm.kubeconfig", who="shoot b's MCM",
        )  # fmt: skip
        if code == 0 or KEPT_DENIAL not in output:
            raise StepFailed(f"the seed must deny MCM's delete of the preserved Failed machine {machine}")
        await asyncio.sleep(3)  # room for MCM to (wrongly) replace it
        await self.land.observe()
        machines = await list_machines(self.seed, SHOOTS["b"], pool=POOL)
        kept = [m for m in machines if m["metadata"]["name"] == machine]
        if not kept or machine_phase(kept[0]) != v.MachinePhase.FAILED or len(machines) != REPLICAS:
            raise StepFailed(f"shoot b: {machine} must stay, Failed, and MCM must not replace it")
        return (
            f"shoot b: {machine} Failed and kept for analysis, its node tainted; the seed's webhook denies MCM's "
            "delete, so MCM does not replace it"
        )

    async def sre_view(self) -> str:
        """What each shoot's SRE sees with `kubectl preservation` (the plugin the package installs, found by kubectl
        on PATH): both shoots' preserved nodes, and the failed node's preservation and evidence."""
        nodes = {}
        for key, machine, value in (("a", self.now_preserved, "now"), ("b", self.when_failed_preserved, "when-failed")):
            found, _ = await self.node_state(key, machine)
            nodes[key] = machine_node(found) if found else ""
            code, output = await self.land.kubectl(
                "preservation", "list", kubeconfig=self.shoot(key).plane.kubeconfig, who=f"shoot {key}'s SRE"
            )
            row = next((line.split() for line in output.splitlines() if line.startswith(nodes[key] + " ")), [])
            if code != 0 or row[1:2] != [value]:
                raise StepFailed(f"shoot {key}: `kubectl preservation list` must show {nodes[key]} with {value}")

        async def pointed() -> bool:  # the evidence is written once the drain is over, the Node then pointed at it
            _, found = await self.node_state("b", self.when_failed_preserved)
            return v.PRESERVED_EVIDENCE_ANNOTATION in landscape.annotations_of(found)

        await self.land.wait_for("shoot b: the failed node pointed at its evidence", pointed, limit=30)
        code, output = await self.land.kubectl(
            "preservation", "show", nodes["b"], kubeconfig=self.shoot("b").plane.kubeconfig, who="shoot b's SRE"
        )
        if code != 0 or "Value:                 when-failed" not in output:
            raise StepFailed(f"shoot b: `kubectl preservation show {nodes['b']}` must show its preservation")
        return (
            f"`kubectl preservation list` shows {nodes['a']} (now) in shoot a and {nodes['b']} (when-failed, Failed) "
            "in shoot b; `show` gives the failed node's preservation and evidence"
        )

    async def pool_settings(self) -> str:
        a = await self.record_of("a", self.now_preserved)
        b = await self.record_of("b", self.when_failed_preserved)
        shown = []
        for key, record, expected, source in (
            ("a", a, PROVIDER_CONFIG_TIMEOUT, "the Extension's providerConfig"),
            ("b", b, WORKER_FIELD_TIMEOUT, "the Shoot's worker fields"),
        ):
            granted = landscape.preserved_for(record)
            self.land.say(
                f"shoot {key}: preserved until {record[v.PRESERVED_UNTIL_ANNOTATION]} "
                f"(since {record[v.PRESERVED_SINCE_ANNOTATION]}: {format_go_duration(granted)}, from {source})"
            )
            if granted != expected:
                raise StepFailed(
                    f"shoot {key}: preserved for {format_go_duration(granted)}, not {format_go_duration(expected)} "
                    f"from {source}"
                )
            shown.append(f"shoot {key} {format_go_duration(granted)} ({source})")
        return "pool machinePreserveTimeout: " + ", ".join(shown)

    async def disable(self) -> str:
        namespace, machine = SHOOTS["a"], self.now_preserved
        shoot = self.shoot("a")
        self.land.say(f"(gardenlet) Extension {namespace}/{gardener.EXTENSION_TYPE} deletion confirmed and deleted")
        await gardener.delete_extension(self.seed, namespace)

        async def released() -> bool:
            found, node = await self.node_state("a", machine)
            if found is None or node is None or v.PRESERVED_UNTIL_ANNOTATION in landscape.annotations_of(found):
                return False
            if landscape.tainted(node) or v.CA_SCALE_DOWN_DISABLED_ANNOTATION in landscape.annotations_of(node):
                return False
            return await landscape.read_extension(self.seed, namespace) is None

        async def objects_gone() -> bool:
            if await landscape.managed_resource(self.seed, namespace) is not None:
                return False
            secrets = await client.CoreV1Api(self.seed).list_namespaced_secret(namespace)
            if [s for s in secrets.items if s.metadata and s.metadata.name == SHOOT_ACCESS_SECRET]:
                return False
            webhooks = await client.AdmissionregistrationV1Api(shoot.api).list_validating_webhook_configuration()
            return not [w for w in webhooks.items if w.metadata and w.metadata.name == WEBHOOK_CONFIGURATION]

        await self.land.wait_for(
            f"shoot a: {machine}'s preservation ended, the Extension gone", released, limit=WAIT_LIMIT
        )
        await self.land.wait_for(
            "shoot a: ManagedResource, shoot-access Secret and node webhooks gone", objects_gone, limit=WAIT_LIMIT
        )
        await self.land.kubectl(
            "get", "extensions,managedresources", "-n", namespace, kubeconfig=self.land.seed_plane.kubeconfig
        )
        await self.show_operator_view("a")
        if not await self.served("b"):
            raise StepFailed("shoot b must stay served while shoot a is disabled")
        if not await self.preserved("b", self.when_failed_preserved, failed=True):
            raise StepFailed(f"shoot b: {self.when_failed_preserved} must stay preserved")
        await self.show_operator_view("b")
        return (
            f"shoot a: Extension deleted, {machine}'s preservation ended (record, condition, CA annotation), "
            "ManagedResource, shoot-access Secret and node webhooks gone; shoot b untouched"
        )

    def steps(self) -> list[Step]:
        return [
            ("Enable the extension in both shoots", self.enable),
            ("Bad preserve value denied by shoot a's API server", self.bad_value_denied),
            ("Shoot a: `now` on a healthy node", self.preserve_now),
            ("Shoot b: `when-failed`, then a failure", self.when_failed),
            ("The SRE's view: `kubectl preservation`", self.sre_view),
            ("Pool settings: providerConfig (a), Shoot worker fields (b)", self.pool_settings),
            ("Disable the extension in shoot a", self.disable),
        ]


def print_try_this(land: Landscape) -> None:
    kubectl_path = land.toolchain.kubectl
    a, b = land.shoots["a"], land.shoots["b"]
    print(
        f"""
The Gardener playground is running: one seed, shoots a and b, the extension enabled in both. In another shell:

  alias kubectl={kubectl_path}
  export KUBECACHEDIR={land.directory / "kube-cache"}
  export PATH={Path(sys.executable).parent}:$PATH    # kubectl finds the plugin kubectl-preservation there
  SEED={land.seed_plane.kubeconfig}
  SHOOT_A={a.plane.kubeconfig}
  SHOOT_B={b.plane.kubeconfig}

  kubectl --kubeconfig=$SEED get extensions,managedresources -A            # what the operator sees
  kubectl --kubeconfig=$SEED get extension -n {a.namespace} {gardener.EXTENSION_TYPE} -o yaml
  kubectl --kubeconfig=$SEED get machines -n {a.namespace}
  kubectl --kubeconfig=$SHOOT_A get nodes
  kubectl preservation list --kubeconfig=$SHOOT_B                        # what the shoot's SRE sees
  kubectl preservation show <node> --kubeconfig=$SHOOT_B
  kubectl --kubeconfig=$SHOOT_A annotate node <node> {v.PRESERVE_ANNOTATION}=now
  kubectl --kubeconfig=$SHOOT_B annotate node <node> {v.PRESERVE_ANNOTATION}=when-failed
  kubectl --kubeconfig=$SHOOT_B patch node <node> --subresource=status \\
    -p '{{"status":{{"conditions":[{{"type":"Ready","status":"False","reason":"KubeletNotReady"}}]}}}}'  # fail it

Nothing plays the kubelets: a node stays as its status was last written.
Logs: {land.installation.logs} (webhook, seed-webhook, extension); {land.directory / "shoots"}/<a|b>/{{grm,mcm}}/logs
Press Ctrl-C to tear everything down.
""",
        flush=True,
    )


async def playground(args: argparse.Namespace, stopping: asyncio.Event, toolchain: Toolchain) -> int:
    start = asyncio.get_running_loop().time()
    try:
        async with started(args.dir, toolchain, start=start) as land:
            walkthrough = GardenerWalkthrough(land)
            if args.interactive:
                results = await run_steps(walkthrough.steps()[:1], say=land.say)
                if not results[0].passed:
                    return 1
                print_try_this(land)
                observers = [asyncio.create_task(t.run(stopping)) for t in land.timelines.values()]
                await stopping.wait()
                await asyncio.gather(*observers)
                return 0
            results = await run_steps(walkthrough.steps(), say=land.say)
            total = len(walkthrough.steps())
            print("\n" + summary_table(results, total_steps=total), flush=True)
            passed = len(results) == total and all(r.passed for r in results)
            print(
                "\nEvery use case behaved as documented." if passed else "\nSome use case did not behave as documented."
            )
            if not passed:
                print(f"\nThe installation's logs:\n{land.installation.log_tail(30)}", flush=True)
            return 0 if passed else 1
    except StepFailed as failure:
        print(f"\nplayground setup failed: {failure}", flush=True)
        return 1
