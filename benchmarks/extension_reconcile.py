"""Benchmark: one installation of the Gardener extension reconciling the Extensions of N shoots at once, as after
a restart of gardenlet (the issue's target: N=200 all Ready within 3 minutes, none later than 60 s after its
request; gardenlet's flow waits on each Extension for at most 3 minutes). It prints figures, it asserts nothing.

Setup, all on 127.0.0.1 and stopped at the end (the processes die with this script):
- the seed: etcd + kube-apiserver + kube-controller-manager with MCM v0.61.3's CRDs and Gardener's seed CRDs
  (`gardener_landscape.seed_plane`, `seed_client`);
- K real shoot kube-apiservers (`--shoot-apiservers`, default 4) on the seed's etcd
  (`gardener.start_shoot_control_plane`); shoot i's Service name resolves to server i mod K, so each server
  stands for N/K shoots. In each, the extension's ServiceAccount `kube-system/machine-preservation` and
  its RBAC (`core.gardener.shoot_resources.rbac_objects`, what our ManagedResource would put there);
- per shoot, what gardenlet prepares: the namespace with its labels, the `Cluster` (one pool, no machines), the
  generic token kubeconfig Secret;
- the seed chart's installation as gardenlet runs it (`gardener_landscape.installation`): its webhook and ONE
  `machine-preservation extension` process, with the chart's arguments (leader election, 10 extension workers,
  4 workers per shoot) under the chart's ServiceAccount; its RSS and CPU come from /proc/PID;
- a stand-in for the shoots' gardener-resource-managers (in this script): when the extension creates a shoot's
  access Secret, the stand-in writes a token of that shoot's API server into it (as GRM's token requestor does),
  and when it creates the ManagedResource, the stand-in reports ResourcesApplied/Healthy True (as GRM does
  after applying it; nothing is applied: the RBAC is already there, the node webhooks are not registered).

Phases (gardenlet's part played by this script; readiness is gardenlet's check, `gardener.extension_ready`, on the
events of a watch of every Extension):
1. create: the N Extensions are created at once (operation `reconcile`, a fresh timestamp), the extension
   provisions each shoot and starts its lifecycle (N shoot runtimes in one process); then how long until every
   shoot is served (`ControlPlaneHealthy` True);
2. reconcile: the N Extensions annotated `gardener.cloud/operation: reconcile` with a new timestamp at once (a
   restarted gardenlet reconciling every shoot), the shoot lifecycles already running.
Between them an idle window (`--steady-seconds`): the extension's CPU and API requests with nothing asked of it.
Per shoot: request (just before its write is sent) -> picked up (the first event with the operation annotation
gone) -> Ready. Printed per phase: time until all Ready, p50/p90/p99/max latency, the queue wait and the work,
the extension's CPU seconds and RSS, the seed kube-apiserver's and etcd's CPU, the extension's own /metrics
(reconciles, API requests, queue depth, /healthz answer time) and the machine's load.

What this setup skews:
- the shoots are empty (no Machines, Nodes, Pods): each shoot's runtime lists and watches nothing, so memory
  and CPU per shoot are a floor; real shoots cache their Machines and Nodes;
- K servers serve N shoots: the shoots' API servers are N/K times busier than real ones would be, and they,
  the seed and this script share the machine's 2 cores with the extension (real seeds run them elsewhere), so
  the latencies are pessimistic where the shoot API servers or the seed are the bottleneck;
- the GRM stand-in answers at once; a real GRM needs ~0.1-1 s to write a token or apply objects;
- all N requests are sent at once; gardenlet's shoot controller runs 20 shoot flows at a time by default, so a
  real restart spreads them.

The script runs itself as a worker process in a process group of its own that dies with it (PR_SET_PDEATHSIG);
the installation's processes, which do not, are ended with that group. The product's code is whatever
`machine_preservation` imports (a snapshot put first on PYTHONPATH pins it; the figures name where it came from).

    .venv/bin/python benchmarks/extension_reconcile.py                 # N=200
    .venv/bin/python benchmarks/extension_reconcile.py --quick         # N=20, a smoke run
    .venv/bin/python benchmarks/extension_reconcile.py --shoots 100 --time-limit 900
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.aio import client

from machine_preservation.core.gardener import shoot_resources
from machine_preservation.core.gardener.extension import CONTROL_PLANE_HEALTHY
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.kube.informer import Informer, Source
from machine_preservation.localcluster import gardener, hosts
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster.controlplane import ControlPlane, _die_with_parent
from machine_preservation.localcluster.gardener_landscape import Installation, installation, seed_client, seed_plane
from machine_preservation.localcluster.procstat import control_plane_pids, process_cpu_seconds, process_memory_mib
from machine_preservation.localcluster.toolchain import Toolchain, ensure_toolchain
from scale_common import MetricsReader, total

WORKER_FLAG = "--worker"
PROJECT = "bench"
TOKEN_SECONDS = 12 * 3600  # GRM's default token lifetime
TOKEN_RENEW_ANNOTATION = "serviceaccount.resources.gardener.cloud/token-renew-timestamp"
EXTENSION_QUEUE = "extensions"
CONDITIONS_QUEUE = "extension-conditions"
TARGET_ALL_READY_S, TARGET_PER_SHOOT_S = 180.0, 60.0


def product_version() -> str:
    """Where the product's code comes from: the commit, `+dirty` when the code differs from it, or the directory
    when it is not a git checkout (e.g. a `git archive` snapshot on PYTHONPATH). The figures depend on it."""
    from machine_preservation.controller.gardener import extensions

    source = Path(extensions.__file__).resolve().parents[3]
    if not (source / ".git").exists():
        return str(source)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--", "controller", "core", "webhook", "certs", "charts", "cli")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def log(message: str) -> None:
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"[{time.strftime('%H:%M:%S')} load {load}] {message}", flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank (with fewer than 100 values p99 is the maximum)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)] if ordered else math.nan


def spread(values: Sequence[float]) -> str:
    if not values:
        return "no samples"
    return (
        f"p50 {percentile(values, 50):.2f} s, p90 {percentile(values, 90):.2f} s, "
        f"p99 {percentile(values, 99):.2f} s, max {max(values):.2f} s"
    )


def _raw(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj)


def _timestamp(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return None


# --- the extension's /metrics ------------------------------------------------------------------------------------


def requests_by(flat: Mapping[str, float], before: Mapping[str, float]) -> dict[str, int]:
    """API requests of the extension between two scrapes, by 'cluster verb resource code'."""
    counts: dict[str, int] = {}
    for key, value in flat.items():
        metric, _, rest = key.partition("{")
        if metric != "machine_preservation_api_requests_total":
            continue
        labels = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if part)
        delta = int(value - before.get(key, 0.0))
        if delta:
            name = f"{labels['cluster']} {labels['verb']} {labels['resource']} {labels['code']}"
            counts[name] = counts.get(name, 0) + delta
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


# --- gardenlet's view: when each shoot's request was picked up, Ready, served ----------------------------------


@dataclasses.dataclass
class ShootTimes:
    requested: float | None = None  # monotonic, just before the write was sent
    picked: float | None = None  # the first event with the operation annotation gone
    ready: float | None = None  # the first event passing gardenlet's check
    served: float | None = None  # the first event with ControlPlaneHealthy True


@dataclasses.dataclass
class Phase:
    name: str
    wall_start: dt.datetime
    shoots: dict[str, ShootTimes]


class Tracker:
    """Judges every Extension event as gardenlet would, for the shoots of the current phase."""

    def __init__(self) -> None:
        self.phase: Phase | None = None
        self.changed = asyncio.Event()  # set whenever a shoot's times change

    async def wait(self, done: Callable[[], bool], *, deadline: float) -> None:
        """Until `done()` holds or the monotonic `deadline` passes."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    def handle(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        phase = self.phase
        if new is None or phase is None:
            return
        metadata = new.get("metadata") or {}
        times = phase.shoots.get(metadata.get("namespace") or "")
        if times is None or times.requested is None:
            return
        annotations = metadata.get("annotations") or {}
        requested_at = _timestamp(annotations.get(gardener.TIMESTAMP_ANNOTATION))
        if requested_at is None or requested_at < phase.wall_start:
            return  # the object as it was before this phase's request
        now = time.monotonic()
        self.changed.set()
        if times.picked is None and gardener.OPERATION_ANNOTATION not in annotations:
            times.picked = now
        if times.ready is None and gardener.extension_ready(new) is None:
            times.ready = now
        conditions = (new.get("status") or {}).get("conditions") or []
        healthy: dict[str, Any] = next((c for c in conditions if c.get("type") == CONTROL_PLANE_HEALTHY), {})
        if times.served is None and healthy.get("status") == "True":
            times.served = now


# --- the shoots' gardener-resource-managers, as far as the extension sees them ----------------------------------


class ResourceManagerStandIn:
    """Writes a token of the shoot's API server into each shoot-access Secret the extension creates, and reports
    each of its ManagedResources applied and healthy, as the shoots' GRMs would."""

    def __init__(self, seed: client.ApiClient, tokens: Mapping[str, str]) -> None:
        self.seed = seed
        self.tokens = tokens  # shoot namespace -> token of its API server
        self.done: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.failures = 0
        core, custom = client.CoreV1Api(seed), client.CustomObjectsApi(seed)
        self.secrets: Informer[dict[str, Any]] = Informer(
            name="bench-shoot-access",
            source=Source(
                core.list_secret_for_all_namespaces,
                (),
                {"label_selector": f"{shoot_resources.PURPOSE_LABEL}=token-requestor"},
            ),
            parse=_raw,
        )
        self.managed_resources: Informer[dict[str, Any]] = Informer(
            name="bench-managedresources",
            source=Source(
                custom.list_cluster_custom_object,
                (gardener.RESOURCES_GROUP, gardener.RESOURCES_VERSION, "managedresources"),
                {"field_selector": f"metadata.name={shoot_resources.MANAGED_RESOURCE}"},
            ),
            parse=_raw,
        )
        self.secrets.add_handler(self._on_secret)
        self.managed_resources.add_handler(self._on_managed_resource)

    async def run(self) -> None:
        await asyncio.gather(self.secrets.run(), self.managed_resources.run())

    def _spawn(self, work: Awaitable[object]) -> None:
        task = asyncio.create_task(self._counted(work))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _counted(self, work: Awaitable[object]) -> None:
        try:
            await work
        except Exception as error:  # counted and reported; the extension retries, and so does the next event
            self.failures += 1
            log(f"GRM stand-in: {error!r}")

    def _on_secret(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        metadata = (new or {}).get("metadata") or {}
        namespace = metadata.get("namespace") or ""
        key = f"secret/{namespace}"
        if new is None or namespace not in self.tokens or key in self.done or (new.get("data") or {}).get("token"):
            return
        self.done.add(key)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {
            "metadata": {"annotations": {TOKEN_RENEW_ANNOTATION: now}},
            "data": {"token": base64.b64encode(self.tokens[namespace].encode()).decode()},
        }
        self._spawn(
            client.CoreV1Api(self.seed).patch_namespaced_secret(
                metadata["name"], namespace, patch, _content_type=MERGE_PATCH
            )
        )

    def _on_managed_resource(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        metadata = (new or {}).get("metadata") or {}
        namespace, generation = metadata.get("namespace") or "", metadata.get("generation", 0)
        key = f"mr/{namespace}/{generation}"
        if new is None or namespace not in self.tokens or key in self.done:
            return
        self.done.add(key)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "lastUpdateTime": now,
            }

        status = {
            "status": {
                "observedGeneration": generation,
                "conditions": [
                    condition("ResourcesApplied", "True", "ApplySucceeded", "All resources are applied."),
                    condition("ResourcesHealthy", "True", "ResourcesHealthy", "All resources are healthy."),
                    condition("ResourcesProgressing", "False", "ResourcesRolledOut", "All resources are rolled out."),
                ],
            }
        }
        self._spawn(
            client.CustomObjectsApi(self.seed).patch_namespaced_custom_object_status(
                gardener.RESOURCES_GROUP,
                gardener.RESOURCES_VERSION,
                namespace,
                "managedresources",
                metadata["name"],
                status,
                _content_type=MERGE_PATCH,
            )
        )


# --- setup ---------------------------------------------------------------------------------------------------------


async def prepare_shoot_api(shoot: ControlPlane) -> str:
    """The extension's ServiceAccount and RBAC in a shoot API server; returns a token of that ServiceAccount."""
    api = await new_api_client(kubeconfig=shoot.kubeconfig)
    try:
        core = client.CoreV1Api(api)
        namespace, name = shoot_resources.SERVICE_ACCOUNT_NAMESPACE, shoot_resources.SERVICE_ACCOUNT
        await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})  # type: ignore[arg-type]
        await processes.apply_manifests(api, shoot_resources.rbac_objects())
        answer = await core.create_namespaced_service_account_token(
            name,
            namespace,
            {"spec": {"expirationSeconds": TOKEN_SECONDS}},  # type: ignore[arg-type]
        )
        assert answer.status is not None
        return str(answer.status.token)
    finally:
        await api.close()  # type: ignore[no-untyped-call]


async def prepare_shoot(seed: client.ApiClient, namespace: str, api_server: ControlPlane) -> None:
    """What gardenlet puts into the seed for a shoot before its Extension: namespace, Cluster, kubeconfig."""
    await gardener.create_shoot_namespace(seed, namespace)
    shoot = gardener.shoot_manifest(namespace, workers=[gardener.worker("worker1")])
    await gardener.apply_cluster(seed, gardener.cluster_manifest(namespace, shoot=shoot))
    await gardener.publish_generic_token_kubeconfig(seed, namespace, api_server)


async def bounded_gather(limit: int, jobs: Sequence[Callable[[], Awaitable[None]]]) -> None:
    semaphore = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[None]]) -> None:
        async with semaphore:
            await job()

    await asyncio.gather(*(run(job) for job in jobs))


async def wait_leading(probe: MetricsReader, *, limit: float = 60.0) -> None:
    """Until the extension holds the Lease and its caches synced (a standby answers /readyz too)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            if total(await probe.scrape(), "machine_preservation_leader") == 1:
                async with probe.session.get(f"{probe.base}/readyz") as response:
                    if response.status == 200:
                        return
        await asyncio.sleep(0.2)
    raise TimeoutError("the extension did not lead within a minute")


# --- one phase -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    seed: client.ApiClient
    seed_plane: ControlPlane
    installed: Installation
    probe: MetricsReader
    tracker: Tracker
    namespaces: list[str]


@dataclasses.dataclass
class Sampler:
    """Samples the extension while a phase runs: its queue depth and how long /healthz takes to answer."""

    probe: MetricsReader
    max_queue: float = 0.0
    max_conditions_queue: float = 0.0
    healthz: list[float] = dataclasses.field(default_factory=list)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                self.healthz.append(await self.probe.healthz_seconds())
                flat = await self.probe.scrape()
                self.max_queue = max(
                    self.max_queue, total(flat, "machine_preservation_queue_depth", queue="extensions")
                )
                self.max_conditions_queue = max(
                    self.max_conditions_queue, total(flat, "machine_preservation_queue_depth", queue=CONDITIONS_QUEUE)
                )
            await asyncio.sleep(0.5)


def seed_cpu(plane: ControlPlane) -> dict[str, float]:
    return {name: process_cpu_seconds(pid) for name, pid in control_plane_pids(plane).items()}


async def run_phase(
    ctx: Context, name: str, request: Callable[[str], Awaitable[object]], *, limit: float, wait_served: float = 0.0
) -> dict[str, Any]:
    """Send every shoot's request at once; wait until all are Ready (and, with `wait_served`, served)."""
    pid = ctx.installed.extension.pid
    phase = Phase(name=name, wall_start=dt.datetime.now(dt.UTC), shoots={ns: ShootTimes() for ns in ctx.namespaces})
    ctx.tracker.phase = phase
    load_before = os.getloadavg()
    cpu_before, seed_before, metrics_before = (
        process_cpu_seconds(pid),
        seed_cpu(ctx.seed_plane),
        await ctx.probe.scrape(),
    )
    sampler = Sampler(ctx.probe)
    sampling = asyncio.create_task(sampler.run())
    log(f"{name}: sending {len(ctx.namespaces)} requests at once")
    started = time.monotonic()

    async def send(namespace: str) -> None:
        phase.shoots[namespace].requested = time.monotonic()
        await request(namespace)

    # All at once: the seed client's pool (100 connections) bounds how many are in flight, as gardenlet's would.
    await asyncio.gather(*(send(ns) for ns in ctx.namespaces))
    sent = time.monotonic() - started
    shoots = phase.shoots.values()
    await ctx.tracker.wait(lambda: all(t.ready is not None for t in shoots), deadline=started + limit)
    all_ready = time.monotonic() - started
    cpu_ready = process_cpu_seconds(pid)
    served_after: float | None = None
    if wait_served:
        await ctx.tracker.wait(
            lambda: all(t.served is not None for t in shoots), deadline=time.monotonic() + wait_served
        )
        if all(t.served is not None for t in phase.shoots.values()):
            served_after = max(t.served or 0.0 for t in phase.shoots.values()) - started
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    cpu_after, seed_after, metrics_after = process_cpu_seconds(pid), seed_cpu(ctx.seed_plane), await ctx.probe.scrape()
    times = list(phase.shoots.values())
    latencies = [t.ready - t.requested for t in times if t.ready is not None and t.requested is not None]
    waits = [t.picked - t.requested for t in times if t.picked is not None and t.requested is not None]
    work = [t.ready - t.picked for t in times if t.ready is not None and t.picked is not None]
    ready = [t.ready for t in times if t.ready is not None]
    served = [t.served - (t.requested or started) for t in times if t.served is not None]

    def reconciles(flat: Mapping[str, float], queue: str) -> tuple[float, float]:
        return (
            total(flat, "machine_preservation_reconcile_duration_seconds_count", controller=queue),
            total(flat, "machine_preservation_reconcile_duration_seconds_sum", controller=queue),
        )

    count_before, sum_before = reconciles(metrics_before, EXTENSION_QUEUE)
    count_after, sum_after = reconciles(metrics_after, EXTENSION_QUEUE)
    figures: dict[str, Any] = {
        "phase": name,
        "shoots": len(times),
        "ready": len(ready),
        "sent_s": round(sent, 2),
        "all_ready_s": round(max(ready) - started, 2) if len(ready) == len(times) else None,
        "waited_s": round(all_ready, 2),
        "latency": [round(x, 3) for x in sorted(latencies)],
        "queue_wait": [round(x, 3) for x in sorted(waits)],
        "work": [round(x, 3) for x in sorted(work)],
        "served_after_s": round(served_after, 2) if served_after is not None else None,
        "served": len(served),
        "served_latency": [round(x, 3) for x in sorted(served)],
        "extension_cpu_to_ready_s": round(cpu_ready - cpu_before, 2),
        "extension_cpu_s": round(cpu_after - cpu_before, 2),
        "extension_memory_mib": process_memory_mib(pid),
        "seed_cpu_s": {k: round(seed_after.get(k, math.nan) - v, 2) for k, v in seed_before.items()},
        "extension_reconciles": int(count_after - count_before),
        "extension_reconcile_mean_s": round((sum_after - sum_before) / max(count_after - count_before, 1), 3),
        "condition_refreshes": int(
            reconciles(metrics_after, CONDITIONS_QUEUE)[0] - reconciles(metrics_before, CONDITIONS_QUEUE)[0]
        ),
        "api_errors": int(
            total(metrics_after, "machine_preservation_api_errors_total")
            - total(metrics_before, "machine_preservation_api_errors_total")
        ),
        "api_requests": requests_by(metrics_after, metrics_before),
        "max_queue_depth": sampler.max_queue,
        "max_conditions_queue_depth": sampler.max_conditions_queue,
        "healthz_max_s": round(max(sampler.healthz), 3) if sampler.healthz else None,
        "healthz_p50_s": round(percentile(sampler.healthz, 50), 3) if sampler.healthz else None,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    ctx.tracker.phase = None
    log(f"{name}: {len(ready)}/{len(times)} Ready after {all_ready:.1f} s; latency {spread(latencies)}")
    return figures


async def settle(
    probe: MetricsReader, pid: int, *, quiet_cpu: float = 0.3, window: float = 5.0, limit: float = 90.0
) -> float:
    """Until the extension's queues are empty and it used less than `quiet_cpu` s of CPU in `window` s; returns
    how long that took."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = process_cpu_seconds(pid)
        await asyncio.sleep(window)
        flat = await probe.scrape()
        queued = total(flat, "machine_preservation_queue_depth", queue=EXTENSION_QUEUE) + total(
            flat, "machine_preservation_queue_depth", queue=CONDITIONS_QUEUE
        )
        if queued == 0 and process_cpu_seconds(pid) - before < quiet_cpu:
            break
    return time.monotonic() - started


async def steady_window(probe: MetricsReader, pid: int, seconds: float) -> dict[str, Any]:
    """What the extension does with nothing asked of it: CPU and API requests over `seconds`."""
    cpu, flat = process_cpu_seconds(pid), await probe.scrape()
    await asyncio.sleep(seconds)
    return {
        "seconds": seconds,
        "cpu_s": round(process_cpu_seconds(pid) - cpu, 2),
        "api_requests": requests_by(await probe.scrape(), flat),
        "memory_mib": process_memory_mib(pid),
    }


# --- the machine ---------------------------------------------------------------------------------------------------


def process_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command name, CPU seconds so far) of every process."""
    table: dict[int, tuple[int, str, float]] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = (entry / "stat").read_text()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / ticks)
    return table


def others_cpu(before: Mapping[int, tuple[int, str, float]], root: int) -> list[tuple[str, int, float]]:
    """CPU seconds used since `before` by processes outside `root`'s tree (other people's work), most first."""
    after = process_table()
    ours = {root}
    changed = True
    while changed:
        changed = False
        for pid, (parent, _, _) in after.items():
            if parent in ours and pid not in ours:
                ours.add(pid)
                changed = True
    used = []
    for pid, (_, name, cpu) in after.items():
        if pid in ours:
            continue
        spent = cpu - (before[pid][2] if pid in before and before[pid][1] == name else 0.0)
        if spent >= 0.5:
            used.append((name, pid, round(spent, 1)))
    return sorted(used, key=lambda item: -item[2])


# --- the run -------------------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, results: dict[str, Any]) -> None:
    toolchain = await asyncio.to_thread(ensure_toolchain)
    directory = Path(tempfile.mkdtemp(prefix="mp-extension-bench-"))
    results["directory"] = str(directory)
    namespaces = [gardener.shoot_namespace_name(PROJECT, f"s{i:04d}") for i in range(args.shoots)]
    try:
        await measure(args, results, directory, namespaces, toolchain)
    finally:  # everything in it has stopped by now
        if args.keep:
            log(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


async def measure(
    args: argparse.Namespace, results: dict[str, Any], directory: Path, namespaces: list[str], toolchain: Toolchain
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        started = time.monotonic()
        plane = stack.enter_context(seed_plane(directory=directory / "seed", bin_dir=toolchain.bin_dir))
        seed = await stack.enter_async_context(seed_client(plane))
        shoot_apis: list[ControlPlane] = []
        servers = min(args.shoot_apiservers, args.shoots)
        for k in range(servers):
            shoot_api = await asyncio.to_thread(
                gardener.start_shoot_control_plane,
                plane,
                directory / f"shoot-api-{k}",
                name=f"api{k}",
                namespaces=namespaces[k::servers],
            )
            stack.callback(shoot_api.stop)
            shoot_apis.append(shoot_api)
        api_tokens = [await prepare_shoot_api(shoot_api) for shoot_api in shoot_apis]
        log(f"seed and {len(shoot_apis)} shoot API servers up in {time.monotonic() - started:.1f} s")

        started = time.monotonic()
        await bounded_gather(
            32,
            [
                lambda ns=ns, i=i: prepare_shoot(seed, ns, shoot_apis[i % len(shoot_apis)])  # type: ignore[misc]
                for i, ns in enumerate(namespaces)
            ],
        )
        results["setup_shoots_s"] = round(time.monotonic() - started, 1)
        log(f"{len(namespaces)} shoot namespaces, Clusters and kubeconfigs in {results['setup_shoots_s']} s")

        grm = ResourceManagerStandIn(seed, {ns: api_tokens[i % len(api_tokens)] for i, ns in enumerate(namespaces)})
        grm_task = asyncio.create_task(grm.run())
        stack.push_async_callback(_cancel, grm_task)
        tracker = Tracker()
        custom = client.CustomObjectsApi(seed)
        extensions: Informer[dict[str, Any]] = Informer(
            name="bench-extensions",
            source=Source(
                custom.list_cluster_custom_object,
                (gardener.EXTENSIONS_GROUP, gardener.EXTENSIONS_VERSION, "extensions"),
                {"field_selector": f"metadata.name={gardener.EXTENSION_TYPE}"},
            ),
            parse=_raw,
        )
        extensions.add_handler(tracker.handle)
        watch_task = asyncio.create_task(extensions.run())
        stack.push_async_callback(_cancel, watch_task)
        await asyncio.wait_for(
            asyncio.gather(extensions.wait_synced(), grm.secrets.wait_synced(), grm.managed_resources.wait_synced()),
            timeout=60,
        )

        started = time.monotonic()
        # Flags after the chart's rendered ones win (argparse keeps the last).
        extra = [f"--extension-workers={args.extension_workers}"] if args.extension_workers else []
        if extra:
            results["notes"].append(f"not the chart's defaults: {' '.join(extra)}")
        installed = await stack.enter_async_context(
            installation(plane, seed, toolchain, directory / "installation", extra_extension_args=extra)
        )
        probe = MetricsReader(installed.metrics_port, timeout=30.0)  # a scrape may be slow while shoots start
        stack.push_async_callback(probe.close)
        await wait_leading(probe)
        pid = installed.extension.pid
        await asyncio.sleep(2)  # let start-up finish: the idle figures below are the baseline
        results["extension_start_s"] = round(time.monotonic() - started, 1)
        results["extension_idle"] = {"memory_mib": process_memory_mib(pid), "cpu_s": process_cpu_seconds(pid)}
        log(f"installation up and leading in {results['extension_start_s']} s: {results['extension_idle']}")

        ctx = Context(
            seed=seed, seed_plane=plane, installed=installed, probe=probe, tracker=tracker, namespaces=namespaces
        )
        results["phases"] = []
        results["phases"].append(
            await run_phase(
                ctx,
                "create",
                lambda ns: gardener.apply_extension(seed, ns),
                limit=args.phase_limit,
                wait_served=args.served_limit,
            )
        )
        waited = await settle(probe, pid)
        log(f"settled {waited:.0f} s after the create phase: {process_memory_mib(pid)}")
        results["settled"] = {"after_s": round(waited, 1), "memory_mib": process_memory_mib(pid)}
        results["steady"] = await steady_window(probe, pid, args.steady_seconds)
        log(f"steady state: {results['steady']}")
        results["phases"].append(
            await run_phase(
                ctx,
                "reconcile",
                lambda ns: gardener.request_operation(seed, ns, "reconcile"),
                limit=args.phase_limit,
            )
        )
        await asyncio.sleep(2)
        results["extension_end"] = {"memory_mib": process_memory_mib(pid), "cpu_s": process_cpu_seconds(pid)}
        results["grm_stand_in_failures"] = grm.failures
        log_text = installed.extension_log()
        results["extension_log_errors"] = sum(
            1 for line in log_text.splitlines() if " ERROR " in line or line.startswith("Traceback")
        )
        results["extension_log_warnings"] = sum(1 for line in log_text.splitlines() if " WARNING " in line)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def report(args: argparse.Namespace, results: Mapping[str, Any]) -> None:
    print("\n=== extension reconcile benchmark ===", flush=True)
    print(
        f"product {results.get('product')}; N={args.shoots} shoots over "
        f"{min(args.shoot_apiservers, args.shoots)} shoot API servers, "
        f"{os.cpu_count()} CPUs; setup of the shoots {results.get('setup_shoots_s')} s; extension start "
        f"{results.get('extension_start_s')} s, idle {results.get('extension_idle')}"
    )
    for f in results.get("phases") or []:
        shoots, ready = f["shoots"], f["ready"]
        latency = f["latency"]
        all_ready = f["all_ready_s"]
        when = f"{all_ready} s" if all_ready is not None else f"NOT within {f['waited_s']} s"
        print(f"--- phase {f['phase']}: requests sent in {f['sent_s']} s")
        print(f"  Ready: {ready}/{shoots}, all Ready after {when}")
        print(f"  per shoot, request -> Ready: {spread(latency)}")
        print(f"  request -> picked up (queue wait): {spread(f['queue_wait'])}")
        print(f"  picked up -> Ready (the reconcile): {spread(f['work'])}")
        if f["phase"] == "create":
            print(
                f"  request -> served (ControlPlaneHealthy True): {f['served']}/{shoots}, {spread(f['served_latency'])}"
            )
        met_all = all_ready is not None and all_ready <= TARGET_ALL_READY_S
        met_each = ready == shoots and bool(latency) and max(latency) <= TARGET_PER_SHOOT_S
        print(
            f"  target (all Ready within {TARGET_ALL_READY_S:.0f} s, none later than {TARGET_PER_SHOOT_S:.0f} s): "
            f"{'met' if met_all and met_each else 'NOT met'}"
        )
        memory = f["extension_memory_mib"]
        print(
            f"  extension: CPU {f['extension_cpu_to_ready_s']} s until all Ready ({f['extension_cpu_s']} s in the "
            f"phase), VmRSS {memory.get('VmRSS', 0):.1f} MiB, VmHWM {memory.get('VmHWM', 0):.1f} MiB; seed CPU "
            f"{f['seed_cpu_s']}"
        )
        print(
            f"  extension metrics: {f['extension_reconciles']} Extension reconciles (mean "
            f"{f['extension_reconcile_mean_s']} s), {f['condition_refreshes']} condition refreshes, max queue depth "
            f"{f['max_queue_depth']:.0f} (conditions {f['max_conditions_queue_depth']:.0f}), API errors "
            f"{f['api_errors']}, /healthz p50 {f['healthz_p50_s']} s max {f['healthz_max_s']} s"
        )
        top = ", ".join(f"{k}: {v}" for k, v in list(f["api_requests"].items())[:8])
        print(f"  API requests: {top}")
        print(f"  load before {f['load_before']}, after {f['load_after']}")
    steady = results.get("steady") or {}
    if steady:
        top = ", ".join(f"{k}: {v}" for k, v in list(steady["api_requests"].items())[:6])
        print(f"--- idle window of {steady['seconds']:.0f} s after the create phase: CPU {steady['cpu_s']} s; {top}")
    end = results.get("extension_end") or {}
    print(
        f"extension at the end: {end}; log: {results.get('extension_log_errors')} ERROR lines, "
        f"{results.get('extension_log_warnings')} WARNING lines; GRM stand-in failures "
        f"{results.get('grm_stand_in_failures')}"
    )
    print(
        f"other processes on the machine: {results.get('others_cpu_total_s')} CPU s during the run, most: "
        f"{results.get('others_cpu')}"
    )
    for note in results.get("notes") or []:
        print(f"note: {note}")
    print("json: " + json.dumps(results, default=str), flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shoots", type=int, default=200, help="N, the shoots of the seed (default 200)")
    parser.add_argument("--quick", action="store_true", help="N=20, a smoke run")
    parser.add_argument("--shoot-apiservers", type=int, default=4, help="real shoot kube-apiservers the N share")
    parser.add_argument("--phase-limit", type=float, default=300.0, help="wait at most this long for all Ready")
    parser.add_argument("--served-limit", type=float, default=120.0, help="then for all served (create phase)")
    parser.add_argument("--steady-seconds", type=float, default=60.0, help="an idle window between the phases")
    parser.add_argument("--time-limit", type=float, default=1200.0, help="the whole run, in seconds")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    parser.add_argument(
        "--extension-workers", type=int, default=0, help="override the chart's extension workers (default: the chart's)"
    )
    parser.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.shoots = 20
    return args


def worker(args: argparse.Namespace) -> int:
    """The benchmark itself; SIGTERM (sent when the supervising script dies) stops it with its cleanup."""
    hosts.make_private()  # the shoots' Service names (before any thread starts)
    results: dict[str, Any] = {"notes": [], "product": product_version()}
    before = process_table()

    async def bounded() -> None:
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, task.cancel)
        await asyncio.wait_for(bench(args, results), timeout=args.time_limit)

    code = 0
    try:
        asyncio.run(bounded())
    except TimeoutError:
        results["notes"].append(f"stopped by --time-limit {args.time_limit:.0f} s; the figures are partial")
        code = 1
    except (Exception, asyncio.CancelledError) as error:
        results["notes"].append(f"failed: {error!r}")
        code = 1
    others = others_cpu(before, os.getppid())
    results["others_cpu_total_s"] = round(sum(spent for _, _, spent in others), 1)
    results["others_cpu"] = others[:8]
    report(args, results)
    return code


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    # The worker runs in a process group of its own and dies with this process (PR_SET_PDEATHSIG); its processes
    # that do not die with it (the installation's webhook and extension) are ended with its group.
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *argv, WORKER_FLAG],
        preexec_fn=_die_with_parent,
        start_new_session=True,
    )
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _frame: child.send_signal(signal.SIGTERM))
    code = child.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
