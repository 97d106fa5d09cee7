"""`machine-preservation controller` (standalone) and `machine-preservation extension` (Gardener, one per seed): run
until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from machine_preservation.controller.gardener.seed import DEFAULT_NODE_BUDGET, SeedController, SeedOptions
from machine_preservation.controller.machinery.heap import keep_heap
from machine_preservation.controller.preservation.crd_check import CrdCheckFailed
from machine_preservation.controller.preservation.runtime import (
    DEFAULT_DRAIN_ATTEMPT_TIMEOUT,
    DEFAULT_EVIDENCE_GRACE,
    RuntimeOptions,
)
from machine_preservation.controller.standalone import Controller, ControllerOptions
from machine_preservation.core.config import (
    DEFAULT_DRAIN_RETRY_INTERVAL,
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_PRESERVE_TIMEOUT,
    DEFAULT_PRESERVE_TIMEOUT,
    PreservationConfig,
)
from machine_preservation.core.duration_arguments import go_duration_argument
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.mcm_generation import NativePreservationMode

logger = logging.getLogger(__name__)

EXIT_BAD_SETUP = 2
DEFAULT_MCM_RECHECK_PERIOD = dt.timedelta(seconds=SeedOptions.mcm_recheck_period)


def _runtime_from(args: argparse.Namespace, *, node_budget: int | None = None) -> RuntimeOptions:
    """What every namespace's lifecycle runs with, from the arguments both commands take
    (`_add_lifecycle_arguments`, `--workers`)."""
    if args.drain_attempt_timeout <= dt.timedelta(0):
        raise ValueError(
            f"--drain-attempt-timeout must be positive, got {format_go_duration(args.drain_attempt_timeout)}"
        )
    return RuntimeOptions(
        preservation=PreservationConfig(
            default_preserve_timeout=args.machine_preserve_timeout,
            drain_timeout=args.machine_drain_timeout,
            drain_retry_interval=args.drain_retry_interval,
            max_preserve_timeout=args.max_preserve_timeout,
        ),
        native_preservation=args.mcm_native_preservation,
        max_drain_attempt=args.drain_attempt_timeout,
        evidence_grace=args.evidence_grace,
        workers=args.workers,
        node_budget=node_budget,
    )


def options_from(args: argparse.Namespace) -> ControllerOptions:
    return ControllerOptions(
        namespace=args.namespace,
        control_kubeconfig=args.control_kubeconfig,
        target_kubeconfig=args.target_kubeconfig,
        runtime=_runtime_from(args),
        leader_elect=args.leader_elect,
        leader_election_namespace=args.leader_election_namespace,
        metrics_host=args.metrics_bind_address,
        metrics_port=args.metrics_port,
    )


async def serve(options: ControllerOptions) -> int:
    """Run the controller; SIGTERM and SIGINT stop it gracefully."""
    return await _until_signalled(Controller(options=options).run)


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_SETUP
    try:
        return asyncio.run(serve(options))
    except CrdCheckFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_SETUP


def _add_lifecycle_arguments(parser: argparse.ArgumentParser) -> None:
    """The preservation settings both the standalone controller and the Gardener extension take."""
    parser.add_argument(
        "--machine-preserve-timeout",
        type=go_duration_argument(accept="any"),
        default=DEFAULT_PRESERVE_TIMEOUT,
        help=f"how long a preservation lasts unless the Machine sets spec.machinePreserveTimeout "
        f"(default {format_go_duration(DEFAULT_PRESERVE_TIMEOUT)})",
    )
    parser.add_argument(
        "--max-preserve-timeout",
        type=go_duration_argument(accept="any"),
        default=DEFAULT_MAX_PRESERVE_TIMEOUT,
        help="no preservation lasts longer, whoever set its timeout or expiry; shared with the webhook "
        f"(default {format_go_duration(DEFAULT_MAX_PRESERVE_TIMEOUT)})",
    )
    parser.add_argument(
        "--mcm-native-preservation",
        type=NativePreservationMode,
        choices=list(NativePreservationMode),
        default=NativePreservationMode.AUTO,
        help="whether MCM preserves machines itself (v0.62+): then the controller hands over and only observes; "
        "auto decides from MCM's Deployment image, else its CRDs (default auto)",
    )
    parser.add_argument(
        "--machine-drain-timeout",
        type=go_duration_argument(accept="any"),
        default=DEFAULT_DRAIN_TIMEOUT,
        help="how long evictions are retried after a preserved node's drain first fails, unless the Machine "
        f"sets spec.drainTimeout; then they stop (default {format_go_duration(DEFAULT_DRAIN_TIMEOUT)})",
    )
    parser.add_argument(
        "--drain-attempt-timeout",
        type=go_duration_argument(accept="any"),
        default=DEFAULT_DRAIN_ATTEMPT_TIMEOUT,
        help=f"the longest one drain attempt runs (default {format_go_duration(DEFAULT_DRAIN_ATTEMPT_TIMEOUT)})",
    )
    parser.add_argument(
        "--drain-retry-interval",
        type=go_duration_argument(accept="any"),
        default=DEFAULT_DRAIN_RETRY_INTERVAL,
        help=f"pause between two drain attempts (default {format_go_duration(DEFAULT_DRAIN_RETRY_INTERVAL)})",
    )
    parser.add_argument(
        "--evidence-grace",
        type=go_duration_argument(accept="not negative"),
        default=DEFAULT_EVIDENCE_GRACE,
        help="how long the evidence of a failure (the ConfigMap kube-system/machine-preservation-evidence-<node> in "
        "the target cluster) is kept after its preservation ended; 0 deletes it then "
        f"(default {format_go_duration(DEFAULT_EVIDENCE_GRACE)})",
    )


def _namespaced_name(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


def seed_options_from(args: argparse.Namespace) -> SeedOptions:
    if not args.namespace:
        raise ValueError("--namespace is required (or $POD_NAMESPACE)")
    return SeedOptions(
        namespace=args.namespace,
        webhook_url=args.webhook_url,
        ca_secret=args.ca_secret,
        kubeconfig=args.kubeconfig,
        runtime=_runtime_from(args, node_budget=args.shoot_node_budget * 2**20 if args.shoot_node_budget > 0 else None),
        extension_workers=args.extension_workers,
        max_reconciles=args.max_concurrent_reconciles,
        leader_elect=args.leader_elect,
        metrics_host=args.metrics_bind_address,
        metrics_port=args.metrics_port,
        mcm_recheck_period=args.mcm_recheck_period.total_seconds(),
    )


async def _until_signalled(run: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run a component; SIGTERM and SIGINT stop it gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    heap = asyncio.create_task(keep_heap(), name="keep-heap")
    try:
        return await run(stop)
    finally:
        heap.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def run_extension(args: argparse.Namespace) -> int:
    try:
        options = seed_options_from(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_SETUP
    return asyncio.run(_until_signalled(SeedController(options=options).run))


def register(subcommands: argparse._SubParsersAction[Any]) -> None:
    _register_controller(subcommands)
    _register_extension(subcommands)


def _add_process_arguments(parser: argparse.ArgumentParser, *, lease: str, workers: str) -> None:
    """Leader election, the metrics server and the workers: what both processes take, in their words."""
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"elect a leader on a {lease} before reconciling (default: on)",
    )
    parser.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics, /healthz, /readyz")
    parser.add_argument("--metrics-bind-address", default="127.0.0.1", help="address of the metrics server")
    parser.add_argument("--workers", type=int, default=4, help=workers)


def _register_controller(subcommands: argparse._SubParsersAction[Any]) -> None:
    parser = subcommands.add_parser(
        "controller",
        help="run the preservation controller (Machines in the control cluster, Nodes in the target cluster)",
    )
    parser.add_argument(
        "--control-kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig of the cluster holding the Machines (default: in-cluster)",
    )
    parser.add_argument(
        "--target-kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig of the cluster holding the Nodes (default: in-cluster)",
    )
    parser.add_argument("--namespace", required=True, help="namespace of the Machines in the control cluster")
    _add_lifecycle_arguments(parser)
    _add_process_arguments(parser, lease="coordination.k8s.io Lease", workers="concurrent Machine reconciles")
    parser.add_argument(
        "--leader-election-namespace", default=None, help="namespace of the Lease (default: --namespace)"
    )
    parser.set_defaults(handler=run)


def _register_extension(subcommands: argparse._SubParsersAction[Any]) -> None:
    extension = subcommands.add_parser(
        "extension",
        help="run the Gardener extension of a seed: the Extension resources of every shoot, and each enabled "
        "shoot's preservation lifecycle",
    )
    extension.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig of the seed (default: in-cluster)")
    extension.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="the extension's namespace: its Leases (default: $POD_NAMESPACE)",
    )
    extension.add_argument(
        "--webhook-url",
        required=True,
        help="the base URL at which the shoots' API servers reach the webhook, e.g. https://<service>.<namespace>.svc",
    )
    extension.add_argument(
        "--ca-secret",
        type=_namespaced_name,
        required=True,
        metavar="NAMESPACE/NAME",
        help="the certs manager's Secret: its CA goes into every shoot's webhook configurations",
    )
    _add_lifecycle_arguments(extension)
    _add_process_arguments(extension, lease="Lease in --namespace", workers="concurrent Machine reconciles per shoot")
    _add_seed_arguments(extension)
    extension.set_defaults(handler=run_extension)


def _add_seed_arguments(extension: argparse.ArgumentParser) -> None:
    """How the extension shares one process among the shoots of a seed."""
    extension.add_argument(
        "--extension-workers", type=int, default=10, help="concurrent Extension reconciles over all shoots"
    )
    extension.add_argument(
        "--max-concurrent-reconciles",
        type=int,
        default=20,
        help="Machine, MachineSet and MachineDeployment reconciles at once over all shoots, taken in turn; a "
        "drain waiting for pods to leave does not count (default 20)",
    )
    extension.add_argument(
        "--mcm-recheck-period",
        type=go_duration_argument(accept="positive"),
        default=DEFAULT_MCM_RECHECK_PERIOD,
        help="how often each shoot's MCM is inspected again while its lifecycle runs; a changed verdict on native "
        "preservation (MCM upgraded) restarts that shoot's lifecycle "
        f"(default {format_go_duration(DEFAULT_MCM_RECHECK_PERIOD)})",
    )
    extension.add_argument(
        "--shoot-node-budget",
        type=int,
        default=DEFAULT_NODE_BUDGET // 2**20,
        metavar="MiB",
        help="how many MiB of JSON one shoot's Nodes may come to as read; past it, that shoot is reported not served "
        "(ShootNotServed, machine_preservation_shoot_nodes_over_budget) and the other shoots go on; 0: no budget "
        f"(default {DEFAULT_NODE_BUDGET // 2**20})",
    )
