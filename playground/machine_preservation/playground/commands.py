"""`python -m machine_preservation.playground`: start everything, seed a landscape, walk through the use cases.

By default the Gardener playground (`playground/gardener.py`: a seed, two shoots, one installation of the
extension); `--standalone` runs the product as installed without Gardener (one control namespace, the
`machine-preservation` chart's webhook and controller, `stack.py`, `landscape.py`, `walkthrough.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.clock import system_clock
from machine_preservation.core.duration_arguments import go_duration_argument
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    WORKER_POOL_LABEL,
)
from machine_preservation.core.models import Node
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.localcluster import hosts
from machine_preservation.localcluster.grm import ensure_grm_binary
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION, ensure_mcm_binaries
from machine_preservation.localcluster.toolchain import ToolchainError, ensure_toolchain
from machine_preservation.playground import gardener, landscape
from machine_preservation.playground.stack import Stack, start_stack
from machine_preservation.playground.timeline import Timeline
from machine_preservation.playground.walkthrough import StepFailed, Walkthrough, summary_table

logger = logging.getLogger(__name__)
SEED_LIMIT = 120.0


async def seed(stack: Stack, timeline: Timeline, *, preserve_timeout: dt.timedelta) -> None:
    """Namespaces, the Shoot and its `Cluster` resource, the pools real MCM turns into Machines and Nodes, and
    workloads on those Nodes."""
    api = stack.admin
    core, custom, apps, policy = (
        client.CoreV1Api(api), client.CustomObjectsApi(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    )  # fmt: skip
    # The control namespace exists already: the stack put the chart's Roles into it.
    for namespace in (landscape.GARDEN_NAMESPACE, landscape.WORKLOAD_NAMESPACE):
        await core.create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
    shoot: dict[str, Any] = await custom.create_namespaced_custom_object(  # type: ignore[assignment]
        v.SHOOT_API_GROUP, v.SHOOT_API_VERSION, landscape.GARDEN_NAMESPACE, "shoots",
        landscape.shoot(preserve_timeout=preserve_timeout),
    )  # fmt: skip
    timeline.say(f"Shoot {landscape.GARDEN_NAMESPACE}/{landscape.SHOOT_NAME} created (2 worker pools)")
    await custom.create_cluster_custom_object(
        CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL, landscape.cluster(shoot)
    )
    timeline.say(
        f"Cluster {landscape.CONTROL_NAMESPACE} created: the Shoot as the seed sees it, with each pool's "
        f"machinePreserveTimeout {format_go_duration(preserve_timeout)} and autoPreserveFailedMachineMax"
    )
    for deployment in landscape.deployments():
        secret, machine_class, machine_deployment = landscape.pool_objects(deployment)
        await core.create_namespaced_secret(landscape.CONTROL_NAMESPACE, secret)  # type: ignore[arg-type]
        for plural, body in (("machineclasses", machine_class), ("machinedeployments", machine_deployment)):
            await custom.create_namespaced_custom_object(
                v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, landscape.CONTROL_NAMESPACE, plural, body
            )
        timeline.say(
            f"MachineDeployment {deployment.name} (pool {deployment.pool.name}, zone {deployment.zone}): "
            f"replicas {deployment.pool.machines_per_zone}, auto-preservation share "
            f"{deployment.auto_preserve_share} of {deployment.pool.auto_preserve_max}"
        )

    walkthrough = Walkthrough(stack=stack, timeline=timeline, preserve_timeout=preserve_timeout)

    async def all_running() -> bool:
        machines = [m for d in landscape.deployments() for m in await walkthrough.machines_of(d)]
        expected = sum(pool.machines_per_zone * len(pool.zones) for pool in landscape.POOLS)
        if len(machines) != expected or any(m.phase != v.MachinePhase.RUNNING for m in machines):
            return False
        names = [m.node_name for m in machines if m.node_name]
        nodes = [await walkthrough.node(name) for name in names]
        labelled = [WORKER_POOL_LABEL in await walkthrough.node_labels(name) for name in names]
        return len(nodes) == expected and all(map(_ready, nodes)) and all(labelled)

    await walkthrough.wait_for("MCM: every machine Running with a Ready node", all_running, limit=SEED_LIMIT)

    daemon_set = await apps.create_namespaced_daemon_set(landscape.WORKLOAD_NAMESPACE, landscape.daemon_set())  # type: ignore[arg-type]
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent",
             "uid": daemon_set.metadata.uid if daemon_set.metadata else "", "controller": True}  # fmt: skip
    budget: Any = landscape.pod_disruption_budget()
    await policy.create_namespaced_pod_disruption_budget(landscape.WORKLOAD_NAMESPACE, budget)
    core_nodes = [m.node_name for d in landscape.deployments(landscape.CORE) for m in await walkthrough.machines_of(d)]
    all_nodes = [m.node_name for d in landscape.deployments() for m in await walkthrough.machines_of(d)]
    pods = [landscape.pod(name=f"node-agent-{n}", node=n, labels={"app": "node-agent"}, owner=owner) for n in all_nodes]
    pods += [landscape.pod(name=f"web-{n}", node=n, labels={"app": "web"}) for n in core_nodes]
    for pod in pods:
        await core.create_namespaced_pod(landscape.WORKLOAD_NAMESPACE, pod)  # type: ignore[arg-type]
        await _mark_ready(core, pod["metadata"]["name"])
    timeline.say(f"{len(pods)} pods running: a DaemonSet pod per node, web pods (PDB minAvailable 1) on {core_nodes}")


def _ready(node: Node | None) -> bool:
    """Ready; with its pool's label too (MCM puts the node template's labels on a little after it joined)."""
    if node is None:
        return False
    ready = node.condition("Ready")
    return ready is not None and ready.status == "True"


async def _mark_ready(core: client.CoreV1Api, name: str) -> None:
    # What a kubelet would report; there is none here.
    now = format_timestamp(system_clock())
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}
    await core.patch_namespaced_pod_status(name, landscape.WORKLOAD_NAMESPACE, {"status": status})


def print_try_this(stack: Stack) -> None:
    kubectl, kubeconfig = stack.toolchain.kubectl, stack.admin_kubeconfig
    node = "<node>"
    print(
        f"""
The playground is running. In another shell:

  export KUBECONFIG={kubeconfig} KUBECACHEDIR={stack.directory / "kube-cache"}
  alias kubectl={kubectl}
  kubectl get machinedeployments,machinesets,machines -n {landscape.CONTROL_NAMESPACE}
  kubectl get nodes
  kubectl annotate node {node} {v.PRESERVE_ANNOTATION}=now            # preserve a healthy node
  kubectl annotate node {node} {v.PRESERVE_ANNOTATION}=when-failed    # preserve it if it fails
  kubectl annotate node {node} {v.PRESERVE_ANNOTATION}=false --overwrite
  kubectl patch node {node} --subresource=status \\
    -p '{{"status":{{"conditions":[{{"type":"Ready","status":"False","reason":"KubeletNotReady"}}]}}}}'  # fail it
  kubectl get node {node} -o jsonpath='{{.status.conditions[?(@.type=="Preserved")]}}'
  kubectl scale machinedeployment -n {landscape.CONTROL_NAMESPACE} <name> --replicas=0
  kubectl get events -n {landscape.CONTROL_NAMESPACE}

Nothing plays the kubelets: a node stays as its status was last written. MCM {DEFAULT_MCM_VERSION} replaces a
Failed machine that is not preserved within about a minute.
Logs (webhook, controller, MCM): {stack.directory / "logs"}, {stack.mcm.logs_dir}
Controller metrics: http://127.0.0.1:{stack.controller_metrics_port}/metrics
Press Ctrl-C to tear everything down.
""",
        flush=True,
    )


async def _playground(args: argparse.Namespace, stopping: asyncio.Event) -> int:
    if args.standalone:
        return await _standalone_playground(args, stopping)
    toolchain = await asyncio.to_thread(ensure_toolchain)
    # Built from their Go modules on the first run (minutes), cached afterwards.
    await asyncio.to_thread(ensure_mcm_binaries, DEFAULT_MCM_VERSION)
    await asyncio.to_thread(ensure_grm_binary)
    return await gardener.playground(args, stopping, toolchain)


async def _standalone_playground(args: argparse.Namespace, stopping: asyncio.Event) -> int:
    toolchain = await asyncio.to_thread(ensure_toolchain)
    # Built from its Go module on the first run (minutes), cached afterwards.
    mcm_bin = await asyncio.to_thread(ensure_mcm_binaries, DEFAULT_MCM_VERSION)
    loop = asyncio.get_running_loop()
    started = loop.time()
    stack = await start_stack(
        directory=args.dir,
        toolchain=toolchain,
        namespace=landscape.CONTROL_NAMESPACE,
        mcm_bin=mcm_bin,
    )
    timeline = Timeline(api=stack.admin, namespace=landscape.CONTROL_NAMESPACE, started=started)
    timeline.say(
        f"control plane, webhook, controller and machine-controller-manager {DEFAULT_MCM_VERSION} running "
        f"(state in {args.dir})"
    )
    try:
        await seed(stack, timeline, preserve_timeout=args.preserve_timeout)
        if args.interactive:
            print_try_this(stack)
            observer = asyncio.create_task(timeline.run(stopping))
            await stopping.wait()
            await observer
            return 0
        walkthrough = Walkthrough(stack=stack, timeline=timeline, preserve_timeout=args.preserve_timeout)
        results = await walkthrough.run()
        total = len(walkthrough.steps())
        print("\n" + summary_table(results, total_steps=total), flush=True)
        passed = len(results) == total and all(r.passed for r in results)
        print("\nEvery use case behaved as documented." if passed else "\nSome use case did not behave as documented.")
        return 0 if passed else 1
    except StepFailed as failure:
        print(f"\nplayground setup failed: {failure}", file=sys.stderr)
        return 1
    finally:
        timeline.say("tearing down")
        await stack.stop()


async def _run_until_signal(args: argparse.Namespace) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.create_task(_playground(args, stopping))

    def interrupt() -> None:
        if args.interactive and not stopping.is_set():
            stopping.set()  # the interactive session ends normally
        else:
            main.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt)
    try:
        return await main
    except asyncio.CancelledError:
        print("\ninterrupted; everything was torn down", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    args.dir = args.dir.resolve()
    if (args.dir / "cluster" / "state.json").exists():
        print(f"error: {args.dir} is in use by another playground", file=sys.stderr)
        return 1
    try:
        code = asyncio.run(_run_until_signal(args))
    except ToolchainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if code == 0 and not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    elif args.dir.exists():
        print(f"state and logs kept in {args.dir}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m machine_preservation.playground",
        description="Run everything locally and walk through the documented use cases: by default on a local "
        "Gardener seed with two shoots and one installation of the extension; --standalone without Gardener.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--dir", type=Path, default=Path(".local/playground"), help="state directory")
    parser.add_argument(
        "--preserve-timeout", type=go_duration_argument(accept="positive"), default=dt.timedelta(seconds=90),
        help="standalone: machinePreserveTimeout of the Shoot's pools (Go duration, default 90s)",
    )  # fmt: skip
    parser.add_argument(
        "--standalone", action="store_true",
        help="the product without Gardener (one control namespace, the machine-preservation chart) instead",
    )  # fmt: skip
    parser.add_argument("--interactive", action="store_true", help="keep running for kubectl; Ctrl-C tears down")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs) after a successful run")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # The shoots' API servers are reached by their Service names through a private hosts file, which only a process
    # with one thread can set up (localcluster.hosts); without root, starting a shoot says why.
    with contextlib.suppress(hosts.HostsError):
        hosts.make_private()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(args))
