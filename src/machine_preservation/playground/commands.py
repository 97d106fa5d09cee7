"""`machine-preservation playground`: start everything, seed a landscape, walk through the use cases."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.cluster.toolchain import ToolchainError, ensure_toolchain
from machine_preservation.core import vocabulary as v
from machine_preservation.core.durations import InvalidDuration, parse_go_duration
from machine_preservation.playground import landscape
from machine_preservation.playground.stack import Stack, start_stack
from machine_preservation.playground.timeline import Timeline
from machine_preservation.playground.walkthrough import StepFailed, Walkthrough, summary_table

logger = logging.getLogger(__name__)
SEED_LIMIT = 120.0


async def seed(stack: Stack, timeline: Timeline, *, preserve_timeout: dt.timedelta) -> None:
    """Namespaces, the Shoot, MachineDeployments + MachineSets, and workloads on the Nodes MCM creates."""
    api = stack.admin
    core, custom, apps, policy = (
        client.CoreV1Api(api), client.CustomObjectsApi(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    )  # fmt: skip
    # The control namespace exists already: the stack put the chart's Roles into it.
    for namespace in (landscape.GARDEN_NAMESPACE, landscape.WORKLOAD_NAMESPACE):
        await core.create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
    await custom.create_namespaced_custom_object(
        v.SHOOT_API_GROUP, v.SHOOT_API_VERSION, landscape.GARDEN_NAMESPACE, "shoots",
        landscape.shoot(preserve_timeout=preserve_timeout),
    )  # fmt: skip
    timeline.say(f"Shoot {landscape.GARDEN_NAMESPACE}/{landscape.SHOOT_NAME} created (2 worker pools)")
    group, version, namespace = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, landscape.CONTROL_NAMESPACE
    for deployment in landscape.machine_deployments(preserve_timeout=preserve_timeout):
        created: dict[str, Any] = await custom.create_namespaced_custom_object(  # type: ignore[assignment]
            group, version, namespace, "machinedeployments", deployment
        )
        machine_set = landscape.machine_set(deployment, deployment_uid=created["metadata"]["uid"])
        await custom.create_namespaced_custom_object(group, version, namespace, "machinesets", machine_set)
        spec = deployment["spec"]
        timeline.say(
            f"MachineDeployment + MachineSet {deployment['metadata']['name']}: replicas {spec['replicas']}, "
            f"autoPreserveFailedMachineMax {spec['autoPreserveFailedMachineMax']}"
        )

    expected = sum(pool.machines_per_zone * len(pool.zones) for pool in landscape.POOLS)
    walkthrough = Walkthrough(stack=stack, timeline=timeline, preserve_timeout=preserve_timeout)

    async def all_running() -> bool:
        names = [m for ms in _machine_set_names() for m in await walkthrough.machines_of(ms)]
        return len(names) == expected and all(m.phase == v.MachinePhase.RUNNING for m in names)

    await walkthrough.wait_for(f"{expected} machines Running", all_running, limit=SEED_LIMIT)

    daemon_set = await apps.create_namespaced_daemon_set(landscape.WORKLOAD_NAMESPACE, landscape.daemon_set())  # type: ignore[arg-type]
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent",
             "uid": daemon_set.metadata.uid if daemon_set.metadata else "", "controller": True}  # fmt: skip
    budget: Any = landscape.pod_disruption_budget()
    await policy.create_namespaced_pod_disruption_budget(landscape.WORKLOAD_NAMESPACE, budget)
    core_set = landscape.machine_set_name(landscape.POOLS[1], 0)
    core_nodes = [m.metadata.name for m in await walkthrough.machines_of(core_set)]
    all_nodes = [m.metadata.name for ms in _machine_set_names() for m in await walkthrough.machines_of(ms)]
    pods = [landscape.pod(name=f"node-agent-{n}", node=n, labels={"app": "node-agent"}, owner=owner) for n in all_nodes]
    pods += [landscape.pod(name=f"web-{n}", node=n, labels={"app": "web"}) for n in core_nodes]
    for pod in pods:
        await core.create_namespaced_pod(landscape.WORKLOAD_NAMESPACE, pod)  # type: ignore[arg-type]
        await _mark_ready(core, pod["metadata"]["name"])
    timeline.say(f"{len(pods)} pods running: a DaemonSet pod per node, web pods (PDB minAvailable 1) on {core_nodes}")


async def _mark_ready(core: client.CoreV1Api, name: str) -> None:
    # What a kubelet would report; there is none here.
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}
    await core.patch_namespaced_pod_status(name, landscape.WORKLOAD_NAMESPACE, {"status": status})


def _machine_set_names() -> list[str]:
    return [landscape.machine_set_name(pool, i) for pool in landscape.POOLS for i in range(len(pool.zones))]


def print_try_this(stack: Stack) -> None:
    kubectl, kubeconfig = stack.toolchain.kubectl, stack.admin_kubeconfig
    node = "<node>"
    print(
        f"""
The playground is running. In another shell:

  export KUBECONFIG={kubeconfig} KUBECACHEDIR={stack.directory / "kube-cache"}
  alias kubectl={kubectl}
  kubectl get machines -n {landscape.CONTROL_NAMESPACE}
  kubectl get nodes
  kubectl annotate node {node} {v.PRESERVE_ANNOTATION}=now            # preserve a healthy node
  kubectl annotate node {node} {v.PRESERVE_ANNOTATION}=when-failed    # preserve it if it fails
  kubectl annotate node {node} {v.PRESERVE_ANNOTATION}=false --overwrite
  kubectl get node {node} -o jsonpath='{{.status.conditions[?(@.type=="Preserved")]}}'
  kubectl get events -n {landscape.CONTROL_NAMESPACE}

Logs: {stack.directory / "logs"}   Controller metrics: http://127.0.0.1:{stack.controller_metrics_port}/metrics
Press Ctrl-C to tear everything down.
""",
        flush=True,
    )


async def _playground(args: argparse.Namespace, stopping: asyncio.Event) -> int:
    toolchain = await asyncio.to_thread(ensure_toolchain)
    loop = asyncio.get_running_loop()
    started = loop.time()
    stack = await start_stack(
        directory=args.dir,
        toolchain=toolchain,
        namespace=landscape.CONTROL_NAMESPACE,
        preserve_timeout=args.preserve_timeout,
    )
    timeline = Timeline(api=stack.admin, namespace=landscape.CONTROL_NAMESPACE, started=started)
    timeline.say(f"control plane, webhook, controller and MCM stand-in running (state in {args.dir})")
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


def _duration(text: str) -> dt.timedelta:
    try:
        value = parse_go_duration(text)
    except InvalidDuration as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value <= dt.timedelta(0):
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def register(subcommands: argparse._SubParsersAction[Any]) -> None:
    parser = subcommands.add_parser(
        "playground", help="run everything locally and walk through the documented use cases"
    )
    parser.add_argument("--dir", type=Path, default=Path(".local/playground"), help="state directory")
    parser.add_argument(
        "--preserve-timeout", type=_duration, default=dt.timedelta(seconds=90),
        help="machinePreserveTimeout of the Shoot's pools (Go duration, default 90s)",
    )  # fmt: skip
    parser.add_argument("--interactive", action="store_true", help="keep running for kubectl; Ctrl-C tears down")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs) after a successful run")
    parser.set_defaults(handler=run)
