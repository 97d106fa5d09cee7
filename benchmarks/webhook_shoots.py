"""The webhook serving every shoot of a seed: N shoot API servers' keep-alive pools against one replica on one core.

Starts a seed control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager; MCM v0.61.3's CRDs) with N
shoot namespaces, each labelled as gardenlet does and holding MCM's Deployment (what the webhook reads to decide
native preservation per namespace), renders the seed chart (`helm template`, gardenlet's values), creates its
ServiceAccounts and RBAC, and runs the real `machine-preservation webhook` with the chart's arguments (host, port
and certificate directory changed for loopback; `--kubeconfig` with a token of the chart's webhook
ServiceAccount), single-threaded, on CPU 0 with `--pin`.

This process then plays N shoot API servers: each has its own pool of `--connections-per-shoot` keep-alive TLS
connections (an HTTP/1.1 client that opens no more, as a Go transport keeps a few to a webhook that does not speak
HTTP/2) and sends ~66 KB Node UPDATE reviews (webhook_load.py's) to its own `/shoots/<namespace>/validate-preserve-
annotation`. Per server, in order: RSS at start; every pool opened (each connection sends one review, so every
namespace's decision is read); RSS with all connections open and idle; a 2 s warm-up at 200/s; `--rate` reviews/s
(open loop, spread round-robin over the shoots, latency from each request's scheduled send time) for `--seconds`;
RSS (VmRSS, VmHWM) after the load. The same against webhook_load.py's calibration floor (a minimal aiohttp handler,
asyncio's own TLS) with as many connections, for the p99 ratio. Connections open are counted from /proc/net/tcp
(no extra connection), server CPU from /proc/PID/stat, the webhook's reads of the seed from the kube-apiserver's
`apiserver_request_total` (GETs of Deployments and CRDs), refused connections from the webhook's /metrics once
the load generator is gone. With several `--shoots` sizes the RSS with connections open is fitted linearly.

    .venv/bin/python benchmarks/webhook_shoots.py --quick                      # 20 shoots, 3 s; a smoke run
    .venv/bin/python benchmarks/webhook_shoots.py --pin                        # 20, 100 and 200 shoots
    .venv/bin/python benchmarks/webhook_shoots.py --pin --shoots 200 --max-connections 1000

Everything binds to 127.0.0.1, is stopped at the end and dies with this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from local_webhook import HOST, write_certificates
from machine_preservation.core.webhook_configurations import shoot_path
from scale_common import gather_limited, log, proc_memory
from webhook_load import (
    CLIENT_CPU,
    ENDPOINT,
    SERVER_CPU,
    Phase,
    cpu_seconds,
    review_body,
    run_spread_phase,
    start_server,
)

SIZES = (20, 100, 200)
CONNECTIONS_PER_SHOOT = 2
TARGET_RATE = 500
P99_RATIO_LIMIT = 1.3
# Go's http.Transport closes idle connections after 90 s; the pools must outlive the pauses between phases.
CLIENT_IDLE_SECONDS = 90.0
WARM_UP = (200, 2.0)  # rate, seconds: webhook_load.py's
# Shoots opening their pools at the same time: API servers come up over minutes, not all in one instant.
OPENING_SHOOTS = 20
RELEASE_NAMESPACE = "extension-machine-preservation-bench"
SEED_READS = (("deployments", "GET"), ("customresourcedefinitions", "GET"))

if TYPE_CHECKING:
    from machine_preservation.localcluster.controlplane import ControlPlane


# --- the seed ----------------------------------------------------------------------------------------------------


@dataclass
class Seed:
    server: str
    pki: Path
    namespaces: list[str]
    webhook_flags: list[str]


@contextlib.contextmanager
def seed(directory: Path, shoots: int) -> Iterator[Seed]:
    """A seed API server with `shoots` shoot namespaces (MCM's Deployment in each) and the chart's webhook flags.
    Started from the calling thread: its processes die with it."""
    from machine_preservation.localcluster.gardener_landscape import seed_plane
    from machine_preservation.localcluster.toolchain import ensure_toolchain

    toolchain = ensure_toolchain()
    with seed_plane(directory=directory, bin_dir=toolchain.bin_dir) as plane:
        flags, names = asyncio.run(_populate(plane, toolchain.helm, directory, shoots))
        yield Seed(server=plane.server, pki=plane.pki_dir, namespaces=names, webhook_flags=flags)


async def _populate(plane: ControlPlane, helm: Path, directory: Path, shoots: int) -> tuple[list[str], list[str]]:
    """The chart's identities and the shoot namespaces; the webhook's flags as the chart renders them."""
    from kubernetes.aio import client

    from machine_preservation.kube.clients import new_api_client
    from machine_preservation.localcluster import gardener, seed_install
    from machine_preservation.localcluster import product as processes
    from machine_preservation.localcluster.gardener_landscape import mcm_deployment_manifest
    from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION

    api = await new_api_client(kubeconfig=plane.kubeconfig)
    try:
        documents = seed_install.render(
            helm, namespace=RELEASE_NAMESPACE, values=seed_install.gardenlet_values(), directory=directory / "chart"
        )
        await processes.apply_manifests(api, seed_install.identities(documents))
        kubeconfig = await seed_install.service_account_kubeconfig(
            api,
            plane,
            namespace=RELEASE_NAMESPACE,
            name=seed_install.service_account_of(documents, seed_install.WEBHOOK_DEPLOYMENT),
            path=directory / "webhook.kubeconfig",
        )
        rendered = seed_install.container_args(documents, seed_install.WEBHOOK_DEPLOYMENT)
        # The global flags (--log-level) come before the subcommand; webhook_command sets its own.
        flags = seed_install.replace_args(
            rendered[rendered.index("webhook") + 1 :],
            # All routes, as measured before the seed's got a process of their own; every simulated shoot connects
            # from 127.0.0.1, which one real shoot's kube-apiserver never shares with another's.
            {
                "--host": None,
                "--port": None,
                "--routes": None,
                "--cert-dir": None,
                "--max-connections-per-peer": None,
                # Its namespaces hold no Extension: without the flag each still gets decisions of its own, as before.
                "--gardener-extension": None,
            },
            extra=[f"--kubeconfig={kubeconfig}", "--max-connections-per-peer=100000"],
        )
        names = [gardener.shoot_namespace_name("bench", f"s{i:03d}") for i in range(shoots)]
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        deployment = mcm_deployment_manifest(DEFAULT_MCM_VERSION)

        async def create(name: str) -> None:
            await core.create_namespace(gardener.shoot_namespace_manifest(name))  # type: ignore[arg-type]
            await apps.create_namespaced_deployment(name, deployment)  # type: ignore[arg-type]

        started = time.monotonic()
        await gather_limited(16, [lambda n=n: create(n) for n in names])  # type: ignore[misc]
        log(f"seed: {shoots} shoot namespaces with MCM's Deployment in {time.monotonic() - started:.1f} s")
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    return flags, names


async def seed_reads(seed: Seed) -> int:
    """GETs of Deployments and CRDs the seed's API server has answered so far (the webhook's MCM evidence)."""
    context = ssl.create_default_context(cafile=str(seed.pki / "ca.crt"))
    context.load_cert_chain(seed.pki / "admin.crt", seed.pki / "admin.key")
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.get(f"{seed.server}/metrics") as response,
    ):
        text = await response.text()
    count = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if (labels.get("resource"), labels.get("verb")) in SEED_READS:
                count += float(line.rsplit(" ", 1)[1])
    return int(count)


# --- the servers ---------------------------------------------------------------------------------------------------


def established(port: int) -> int:
    """Connections to `port` the kernel holds established on the server side (IPv4 loopback)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            count += 1
    return count


def core_busy_seconds(cpu: int) -> float:
    """Time CPU `cpu` has been busy (neither idle nor waiting for I/O) since boot, whoever ran on it (/proc/stat)."""
    for text in Path("/proc/stat").read_text().splitlines():
        if text.startswith(f"cpu{cpu} "):
            ticks = [int(x) for x in text.split()[1:9]]
            return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    raise LookupError(f"no cpu{cpu} in /proc/stat")


def drain(process: subprocess.Popen[str], log_file: Path) -> threading.Thread:
    """Copy the server's stderr to `log_file`: a full pipe would block its logging, and with it the server."""
    assert process.stderr is not None
    stream = process.stderr

    def copy() -> None:
        with log_file.open("a") as out:
            for line in stream:
                out.write(line)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


async def dropped_connections(port: int, context: ssl.SSLContext) -> dict[str, int]:
    """The webhook's own count of connections it closed, by reason (scraped with no other client connected)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.get(f"https://{HOST}:{port}/metrics") as response,
    ):
        text = await response.text()
    found = re.findall(
        r'machine_preservation_webhook_connections_dropped_total\{listener="\w+",reason="(\w+)"\} ([0-9.e+]+)', text
    )
    return {reason: int(float(value)) for reason, value in found}


# --- one server under the shoots' load -------------------------------------------------------------------------------


@dataclass
class Run:
    kind: str
    shoots: int
    connections_offered: int
    rss_start: dict[str, float]
    open_errors: int = 0
    connections_open: int = 0
    rss_open: dict[str, float] = field(default_factory=dict)
    sustained: Phase | None = None
    cpu_per_request_us: float = 0.0
    rss_after: dict[str, float] = field(default_factory=dict)
    connections_after: int = 0
    seed_reads_opening: int = 0
    seed_reads_sustained: int = 0
    # Shares of a core during the sustained phase: what others ran on the server's core (with --pin), and what
    # this load generator used of its own; load average (1 min) at its start and end.
    others_on_server_core: float = 0.0
    load_generator_core: float = 0.0
    load_average: tuple[float, float] = (0.0, 0.0)
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: int = 0
    # The webhook's warnings with namespace names and numbers blanked out, by count.
    warning_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def phase(self) -> Phase:
        assert self.sustained is not None, "the sustained phase ran"
        return self.sustained


async def open_pools(
    targets: Sequence[tuple[aiohttp.ClientSession, str]], body: bytes, per_shoot: int, at_once: int
) -> int:
    """Fill every shoot's pool: `per_shoot` reviews at once each, so each takes a connection of its own; errors."""
    errors = 0

    async def post(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal errors
        try:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                if response.status != 200 or b'"allowed": true' not in await response.read():
                    errors += 1
        except (aiohttp.ClientError, TimeoutError):
            errors += 1

    async def fill(session: aiohttp.ClientSession, url: str) -> None:
        await asyncio.gather(*(post(session, url) for _ in range(per_shoot)))

    await gather_limited(at_once, [lambda s=s, u=u: fill(s, u) for s, u in targets])  # type: ignore[misc]
    return errors


async def load(
    run: Run, *, pid: int, port: int, context: ssl.SSLContext, seed: Seed, body: bytes, args: argparse.Namespace
) -> None:
    namespaces = seed.namespaces[: run.shoots]
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=context, limit=args.connections_per_shoot, keepalive_timeout=CLIENT_IDLE_SECONDS
            ),
            timeout=aiohttp.ClientTimeout(total=10),
        )
        for _ in namespaces
    ]
    targets = [
        (session, f"https://{HOST}:{port}{shoot_path(namespace, ENDPOINT)}")
        for session, namespace in zip(sessions, namespaces, strict=True)
    ]
    try:
        reads = await seed_reads(seed)
        run.open_errors = await open_pools(targets, body, args.connections_per_shoot, args.opening_shoots)
        await asyncio.sleep(1.0)
        run.connections_open, run.rss_open = established(port), proc_memory(pid)
        await run_spread_phase(targets, body, rate=WARM_UP[0], seconds=WARM_UP[1])
        reads_before = await seed_reads(seed)
        run.seed_reads_opening = reads_before - reads
        load_before = os.getloadavg()[0]
        before, busy, own, wall = cpu_seconds(pid), core_busy_seconds(SERVER_CPU), time.process_time(), time.monotonic()
        run.sustained = await run_spread_phase(targets, body, rate=args.rate, seconds=args.seconds)
        server_cpu, wall = cpu_seconds(pid) - before, time.monotonic() - wall
        run.others_on_server_core = max(core_busy_seconds(SERVER_CPU) - busy - server_cpu, 0.0) / wall
        run.load_generator_core = (time.process_time() - own) / wall
        run.load_average = (load_before, os.getloadavg()[0])
        run.cpu_per_request_us = server_cpu / run.sustained.sent * 1e6
        run.seed_reads_sustained = await seed_reads(seed) - reads_before
        await asyncio.sleep(1.0)
        run.connections_after, run.rss_after = established(port), proc_memory(pid)
    finally:
        for session in sessions:
            await session.close()
    if run.kind == "webhook":
        await asyncio.sleep(0.5)  # the closed pools' connections gone, so the scrape is not refused at the limit
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            run.dropped = await dropped_connections(port, context)


def measure(
    kind: str,
    shoots: int,
    *,
    cert_dir: Path,
    context: ssl.SSLContext,
    seed: Seed,
    body: bytes,
    args: argparse.Namespace,
) -> Run:
    if kind == "webhook":
        flags = [
            *seed.webhook_flags,
            *(["--max-connections", str(args.max_connections)] if args.max_connections else []),
        ]
    else:
        flags = ["--shoot-routes"]
    process, port = start_server(kind, cert_dir, pin=args.pin, flags=flags)
    log_file = cert_dir.parent / f"{kind}-{shoots}.log"
    drain(process, log_file)
    try:
        time.sleep(1.0)  # let start-up settle before its RSS is read
        run = Run(kind, shoots, shoots * args.connections_per_shoot, proc_memory(process.pid))
        asyncio.run(load(run, pid=process.pid, port=port, context=context, seed=seed, body=body, args=args))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    with log_file.open() as logged:
        for text in logged:
            if "WARNING" in text:
                run.warnings += 1
                kind = re.sub(r"shoot--[\w-]+|\d+(\.\d+)?", "#", text.split("WARNING", 1)[1].strip())
                run.warning_kinds[kind] = run.warning_kinds.get(kind, 0) + 1
    return run


# --- report ----------------------------------------------------------------------------------------------------------


def line(run: Run) -> str:
    phase = run.phase
    return (
        f"  {run.kind:<8} {run.shoots:>4} shoots  connections open {run.connections_open}/{run.connections_offered} "
        f"(after the load {run.connections_after})  {phase.throughput:6.1f}/s done  p50 {phase.percentile(0.5):7.2f} "
        f"p99 {phase.percentile(0.99):8.2f} max {max(phase.latencies_ms, default=0):8.2f} ms  errors {phase.errors} "
        f"(opening {run.open_errors})  CPU/request {run.cpu_per_request_us:.0f} µs\n"
        f"           RSS start {run.rss_start.get('VmRSS', 0):.1f} MiB, connections open idle "
        f"{run.rss_open.get('VmRSS', 0):.1f} MiB, after the load {run.rss_after.get('VmRSS', 0):.1f} MiB "
        f"(VmHWM {run.rss_after.get('VmHWM', 0):.1f} MiB)\n"
        f"           in the sustained phase: others on the server's core {run.others_on_server_core:.0%}, load "
        f"generator {run.load_generator_core:.0%} of a core, load average {run.load_average[0]:.2f} → "
        f"{run.load_average[1]:.2f}"
        + (
            f"\n           seed reads: {run.seed_reads_opening} opening, {run.seed_reads_sustained} in the sustained "
            f"phase; dropped connections {run.dropped or 'none'}; log warnings {run.warnings}"
            + "".join(f"\n             {count}× {kind}" for kind, count in run.warning_kinds.items())
            if run.kind == "webhook"
            else ""
        )
    )


def fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares y = a + b·x; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def report(runs: list[Run], args: argparse.Namespace) -> None:
    print(
        "\n| shoots | connections open (webhook / floor) | done at "
        f"{args.rate}/s | floor p50 / p99 / max | webhook p50 / p99 / max | p99 ratio | errors | "
        "server CPU / request webhook / floor | webhook RSS start / connections open idle / after the load (HWM) | "
        "floor RSS connections open idle / after | seed reads in the sustained phase | others on the server's core "
        "floor / webhook | load average |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shoots in dict.fromkeys(r.shoots for r in runs):
        ours = next(r for r in runs if r.shoots == shoots and r.kind == "webhook")
        floor = next(r for r in runs if r.shoots == shoots and r.kind == "baseline")
        w, f = ours.phase, floor.phase

        def latency(p: Phase) -> str:
            return f"{p.percentile(0.5):.2f} / {p.percentile(0.99):.2f} / {max(p.latencies_ms, default=0):.1f} ms"

        print(
            f"| {shoots} | {ours.connections_open} / {floor.connections_open} (of {ours.connections_offered}) "
            f"| {w.throughput:.0f}/s | {latency(f)} | {latency(w)} "
            f"| {w.percentile(0.99) / f.percentile(0.99):.2f} | {w.errors} (opening {ours.open_errors}) "
            f"| {ours.cpu_per_request_us:.0f} / {floor.cpu_per_request_us:.0f} µs "
            f"| {ours.rss_start['VmRSS']:.1f} / {ours.rss_open['VmRSS']:.1f} / {ours.rss_after['VmRSS']:.1f} "
            f"({ours.rss_after['VmHWM']:.1f}) MiB | {floor.rss_open['VmRSS']:.1f} / {floor.rss_after['VmRSS']:.1f} MiB "
            f"| {ours.seed_reads_sustained} | {floor.others_on_server_core:.0%} / {ours.others_on_server_core:.0%} "
            f"| {floor.load_average[0]:.2f}–{ours.load_average[1]:.2f} |"
        )
    for kind in ("webhook", "baseline"):
        chosen = [r for r in runs if r.kind == kind and r.connections_open]
        line_fit = fit([(r.connections_open, r.rss_open["VmRSS"]) for r in chosen])
        after_fit = fit([(r.connections_open, r.rss_after["VmRSS"]) for r in chosen])
        if line_fit is not None and after_fit is not None:
            print(
                f"{kind} RSS ≈ {line_fit[0]:.1f} MiB + {line_fit[1] * 1024:.0f} KiB per open connection (idle, "
                f"after one review each); after the load {after_fit[0]:.1f} MiB + {after_fit[1] * 1024:.0f} KiB each"
            )
    for run in (r for r in runs if r.kind == "webhook"):
        floor = next(r for r in runs if r.shoots == run.shoots and r.kind == "baseline")
        ratio = run.phase.percentile(0.99) / floor.phase.percentile(0.99)
        held = (
            run.phase.errors == 0
            and run.open_errors == 0
            and run.connections_open == run.connections_offered
            and run.phase.throughput >= 0.97 * args.rate
            and ratio <= P99_RATIO_LIMIT
        )
        print(
            f"target at {run.shoots} shoots ({args.rate}/s for {args.seconds:g} s over every shoot's "
            f"{args.connections_per_shoot} connections, zero errors, p99 ≤ {P99_RATIO_LIMIT}× the floor's): "
            f"{'met' if held else 'NOT met'}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shoots", type=int, nargs="+", help=f"shoot counts to measure (default {SIZES})")
    parser.add_argument("--connections-per-shoot", type=int, default=CONNECTIONS_PER_SHOOT)
    parser.add_argument("--rate", type=int, default=TARGET_RATE, help="reviews/s over all shoots")
    parser.add_argument("--seconds", type=float, help="sustained phase (default 20, --quick 3)")
    parser.add_argument(
        "--max-connections", type=int, help="passed to the webhook (default: not passed, the chart's default)"
    )
    parser.add_argument(
        "--opening-shoots",
        type=int,
        default=OPENING_SHOOTS,
        help="shoots opening their pools at the same time (default %(default)s; as many as --shoots: all at once, as "
        "after a webhook restart)",
    )
    parser.add_argument("--quick", action="store_true", help="20 shoots, a 3 s phase (smoke test)")
    parser.add_argument(
        "--pin", action="store_true", help=f"servers on CPU {SERVER_CPU}; this load and the seed on CPU {CLIENT_CPU}"
    )
    args = parser.parse_args()
    args.shoots = args.shoots or ([20] if args.quick else list(SIZES))
    args.seconds = args.seconds or (3.0 if args.quick else 20.0)
    # SIGTERM runs the cleanup too (the servers and the seed die with us in any case).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.pin:
        # Before anything starts: the seed's processes inherit it, so they never take the servers' core.
        os.sched_setaffinity(0, {CLIENT_CPU})
    body = review_body()
    log(
        f"{len(body) / 1024:.1f} KB Node UPDATE reviews to /shoots/<namespace>{ENDPOINT}; shoots {args.shoots}, "
        f"{args.connections_per_shoot} connections each, {args.rate}/s for {args.seconds:g} s; "
        f"{'pinned' if args.pin else 'not pinned'}; {os.cpu_count()} CPUs"
    )
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="mp-webhook-shoots-") as directory:
        cert_dir = Path(directory) / "certs"
        cert_dir.mkdir()
        context = write_certificates(cert_dir)

        with seed(Path(directory) / "seed", max(args.shoots)) as the_seed:
            log(f"webhook flags (the seed chart's): {' '.join(the_seed.webhook_flags)}")
            for shoots in args.shoots:
                for kind in ("baseline", "webhook"):
                    run = measure(kind, shoots, cert_dir=cert_dir, context=context, seed=the_seed, body=body, args=args)
                    runs.append(run)
                    log(line(run))
    report(runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
