"""Scale benchmark of the preservation controller on its own real control plane (loopback only).

Starts a fresh etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 (stopped again at the end, and
killed with this process), installs the CRDs and creates N Ready Nodes and N Machines (phase Running via the
status subresource, `node` label naming their Node) spread evenly over M MachineSets
(`autoPreserveFailedMachineMax: 0`). A sample of the Machines (spread evenly over the sets) carries
`node.machine.sapcloud.io/preserve: when-failed` and a short `spec.machinePreserveTimeout`. Then it runs the
controller as its own process (so /proc/PID/status gives a clean RSS) and prints:

1. cold start: controller process start -> /readyz 200, and -> first full reconcile, defined as: /readyz 200,
   at least N Machine reconciles and M MachineSet reconciles done, both queues empty and the reconcile counters
   unchanged over two consecutive /metrics scrapes 100 ms apart (every key was queued by the initial list
   before the workers started, so an empty queue after >= N reconciles means every Machine was reconciled);
2. Failed -> fully preserved: one sample at a time (spread over time), the script sets the Node's Ready
   condition to Unknown, then the Machine's phase to Failed; "fully preserved" is the first moment (this
   script's clock, from watches on the sample Nodes and Machines) at which the Machine has a preservation
   record (its `preserved-since`/`preserved-until` annotations) and its Node has the CA annotation "true", the
   Preserved condition True with the "drained successfully" message and the preserved taint (the Node is
   empty, so the drain has nothing to evict);
3. expiry lag: for the same samples, the moment the stop is complete (record removed or the Failed Machine
   deleted, and the Node's Preserved condition False, taint and CA annotation gone) minus the record's expiry
   (`preserved-until`, capped at `preserved-since` + the maximum timeout; whole-second resolution);
4. API writes of the controller (its own machine_preservation_api_requests_total, verbs create/update/patch/
   delete) during a steady-state window with nothing changing (--steady-seconds, default 300); the controller's
   informer resync period is --resync-seconds (default 60, the product default is 600) so the window contains
   resyncs, i.e. every object is re-reconciled several times in it;
5. controller RSS: VmHWM (peak) and VmRSS from /proc/PID/status.

    .venv/bin/python benchmarks/controller_scale.py --machines 200 --machine-sets 10
    .venv/bin/python benchmarks/controller_scale.py --machines 2000 --machine-sets 10 --steady-seconds 300

Bounded by --time-limit (default 1500 s): on expiry everything is stopped and what was measured is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Only the standard library (and scale_common, which only uses it) at module level: the controller child process
# imports what the controller needs.
from scale_common import (
    GROUP,
    PRESERVE,
    SAMPLE_LABEL,
    VERSION,
    MetricsReader,
    Sample,
    SampleRecorder,
    die_with_parent,
    free_port,
    gather_limited,
    log,
    percentile,
    proc_cpu_seconds,
    proc_memory,
    ready_condition,
    summary,
    total,
    watch_raw,
    writes,
)

NAMESPACE = "bench"
SCRIPT = Path(__file__).resolve()
TARGETS = {"failed_p99_s": 2.0, "expiry_lag_s": 2.0, "steady_writes": 0, "rss_mb": 250.0}


def rfc3339(moment: dt.datetime) -> str:
    # Imported here, not at module level (see above); the product's one formatter.
    from machine_preservation.core.preservation_record import format_timestamp

    return format_timestamp(moment)


# --- the controller as a child process -------------------------------------------------------------------------


def run_controller_child(args: argparse.Namespace) -> int:
    """`--controller-child`: what `machine-preservation controller` runs, with a settable resync period."""
    from machine_preservation.controller.commands import serve
    from machine_preservation.controller.preservation.runtime import RuntimeOptions
    from machine_preservation.controller.standalone import ControllerOptions
    from machine_preservation.core.mcm_generation import NativePreservationMode

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ControllerOptions(
        namespace=args.namespace,
        control_kubeconfig=args.kubeconfig,
        target_kubeconfig=args.kubeconfig,
        leader_elect=False,
        metrics_port=args.metrics_port,
        runtime=RuntimeOptions(
            resync_period=args.resync_seconds,
            workers=args.workers,
            # The CRDs installed here carry v0.62's preservation fields, which `auto` reads as an MCM that preserves
            # machines itself; measured is the controller running the lifecycle.
            native_preservation=NativePreservationMode.FALSE,
        ),
    )
    return asyncio.run(serve(options))


def spawn(command: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    """The controller process, killed with this one (PR_SET_PDEATHSIG)."""
    with log_file.open("wb") as output:
        return subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
        )


# --- the benchmark ---------------------------------------------------------------------------------------------


@dataclass
class Results:
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


async def create_objects(api: Any, args: argparse.Namespace, samples: dict[str, Sample]) -> None:
    from kubernetes.aio import client

    # Plain dict bodies (the API accepts them; the generated stubs only name the models).
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    await core.create_namespace({"metadata": {"name": NAMESPACE}})
    per_set = args.machines // args.machine_sets
    owners: list[dict[str, Any]] = []
    for s in range(args.machine_sets):
        name = f"ms-{s:02d}"
        replicas = per_set + (1 if s < args.machines % args.machine_sets else 0)
        created = await custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            NAMESPACE,
            "machinesets",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MachineSet",
                "metadata": {"name": name},
                "spec": {"replicas": replicas, "autoPreserveFailedMachineMax": 0},
            },
        )
        owners.append(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MachineSet",
                "name": name,
                "uid": created["metadata"]["uid"],
                "controller": True,
            }
        )
    stride = max(args.machines // max(args.samples, 1), 1)
    sample_indices = {i * stride for i in range(min(args.samples, args.machines))}

    def job(i: int) -> Callable[[], Awaitable[None]]:
        async def create() -> None:
            node, machine = f"node-{i:05d}", f"machine-{i:05d}"
            sample = i in sample_indices
            labels = {SAMPLE_LABEL: "true"} if sample else {}
            await core.create_node({"metadata": {"name": node, "labels": labels}})
            await core.patch_node_status(node, {"status": {"conditions": [ready_condition("True")]}})
            spec: dict[str, Any] = {"class": {"kind": "TestMachineClass", "name": "c"}}
            metadata: dict[str, Any] = {
                "name": machine,
                "labels": {"node": node, **labels},
                "ownerReferences": [owners[i % args.machine_sets]],
            }
            if sample:
                metadata["annotations"] = {PRESERVE: "when-failed"}
                spec["machinePreserveTimeout"] = args.preserve_timeout
            await custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                NAMESPACE,
                "machines",
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Machine", "metadata": metadata, "spec": spec},
            )
            status = {
                "status": {"currentStatus": {"phase": "Running", "lastUpdateTime": rfc3339(dt.datetime.now(dt.UTC))}}
            }
            await custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, NAMESPACE, "machines", machine, status, _content_type="application/merge-patch+json"
            )
            if sample:
                samples[machine] = Sample(index=i, machine=machine, node=node, namespace=NAMESPACE)

        return create

    await gather_limited(args.concurrency, [job(i) for i in range(args.machines)])


async def watch_samples(api: Any, samples: dict[str, Sample], stop: asyncio.Event) -> None:
    """Record, on this process's clock, when each sample reaches 'preserved' and 'stopped'."""
    from kubernetes.aio import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    recorder = SampleRecorder(list(samples.values()))
    await asyncio.gather(
        watch_raw(core.list_node, (), recorder.on_node, stop),
        watch_raw(
            custom.list_namespaced_custom_object, (GROUP, VERSION, NAMESPACE, "machines"), recorder.on_machine, stop
        ),
    )


async def evidence_without_expiry(core: Any) -> list[str]:
    """The evidence ConfigMaps that have no expiry yet (their preservation has not been seen ended)."""
    from machine_preservation.core import vocabulary as v

    listed = await core.list_namespaced_config_map(v.EVIDENCE_NAMESPACE, label_selector=f"{v.EVIDENCE_LABEL}=true")
    return [
        item.metadata.name for item in listed.items if v.EVIDENCE_EXPIRES_KEY not in (item.metadata.annotations or {})
    ]


async def bench(args: argparse.Namespace, results: Results) -> None:
    from machine_preservation.kube.clients import new_api_client
    from machine_preservation.localcluster.controlplane import ControlPlane
    from machine_preservation.localcluster.crds import install_crds
    from machine_preservation.localcluster.toolchain import ensure_toolchain

    figures = results.figures
    figures["machines"], figures["machine_sets"], figures["samples"] = args.machines, args.machine_sets, args.samples
    figures["cpus"] = os.cpu_count()
    directory = Path(tempfile.mkdtemp(prefix="mp-controller-bench-"))
    toolchain = await asyncio.to_thread(ensure_toolchain)
    plane = ControlPlane(directory=directory / "cluster", bin_dir=toolchain.bin_dir)
    child: subprocess.Popen[bytes] | None = None
    api: Any = None
    reader: MetricsReader | None = None
    watcher: asyncio.Task[None] | None = None
    stop_watch = asyncio.Event()
    try:
        started = time.monotonic()
        await asyncio.to_thread(plane.start)
        await asyncio.to_thread(install_crds, plane.kubeconfig)
        log(f"control plane up and CRDs installed in {time.monotonic() - started:.1f}s ({plane.server})")
        api = await new_api_client(kubeconfig=plane.kubeconfig)
        api.configuration.connection_pool_maxsize = args.concurrency
        samples: dict[str, Sample] = {}
        started = time.monotonic()
        await create_objects(api, args, samples)
        figures["setup_seconds"] = round(time.monotonic() - started, 1)
        log(
            f"created {args.machines} Nodes (Ready) and {args.machines} Machines (Running) in "
            f"{args.machine_sets} MachineSets in {figures['setup_seconds']}s ({len(samples)} when-failed samples)"
        )
        await asyncio.sleep(2)

        # --- 1. cold start ---------------------------------------------------------------------------------------
        port = free_port()
        command = [
            sys.executable,
            str(SCRIPT),
            "--controller-child",
            "--kubeconfig",
            str(plane.kubeconfig),
            "--namespace",
            NAMESPACE,
            "--metrics-port",
            str(port),
            "--resync-seconds",
            str(args.resync_seconds),
            "--workers",
            str(args.workers),
        ]
        load_before = os.getloadavg()[0]
        t_start = time.monotonic()
        child = spawn(command, directory / "controller.log")
        reader = MetricsReader(port)
        deadline = t_start + args.cold_start_limit
        while not await reader.ready():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"controller not ready (exit {child.poll()}); see {directory / 'controller.log'}")
            await asyncio.sleep(0.02)
        t_ready = time.monotonic()
        previous: tuple[float, float] | None = None
        while True:
            flat = await reader.scrape()
            machines_done = total(flat, "machine_preservation_reconcile_duration_seconds_count", controller="machines")
            sets_done = total(flat, "machine_preservation_reconcile_duration_seconds_count", controller="machinesets")
            depth = total(flat, "machine_preservation_queue_depth", queue="machines") + total(
                flat, "machine_preservation_queue_depth", queue="machinesets"
            )
            current = (machines_done, sets_done)
            if machines_done >= args.machines and sets_done >= args.machine_sets and depth == 0 and previous == current:
                break
            previous = current
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no full reconcile in time; see {directory / 'controller.log'}")
            await asyncio.sleep(0.1)
        # The first of the two equal scrapes is when it was done (the second only confirms it).
        t_full = time.monotonic() - 0.1
        cold_writes, cold_by = writes(flat)
        figures["cold_ready_s"] = round(t_ready - t_start, 2)
        figures["cold_full_s"] = round(t_full - t_start, 2)
        figures["cold_machine_reconciles"] = machines_done
        figures["cold_writes"] = cold_writes
        figures["rss_after_cold_start"] = proc_memory(child.pid)
        figures["cold_cpu_s"] = round(proc_cpu_seconds(child.pid), 2)
        log(
            f"COLD START: process start -> /readyz 200 in {figures['cold_ready_s']}s; -> first full reconcile "
            f"({int(machines_done)} Machine and {int(sets_done)} MachineSet reconciles, queues empty) in "
            f"{figures['cold_full_s']}s; controller CPU {figures['cold_cpu_s']}s; writes during it: "
            f"{cold_writes:.0f} {cold_by}; load before {load_before:.2f}"
        )

        # --- 2./3. Failed -> preserved, and expiry lag -------------------------------------------------------------
        from kubernetes.aio import client

        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        watcher = asyncio.create_task(watch_samples(api, samples, stop_watch))
        await asyncio.sleep(2)
        writes_before_samples = writes(await reader.scrape())[0]
        cpu_before_samples = proc_cpu_seconds(child.pid)
        order = sorted(samples.values(), key=lambda s: s.index)
        loads: list[float] = []
        for sample in order:
            await core.patch_node_status(sample.node, {"status": {"conditions": [ready_condition("Unknown")]}})
            sample.failed_at = time.time()
            status = {
                "status": {"currentStatus": {"phase": "Failed", "lastUpdateTime": rfc3339(dt.datetime.now(dt.UTC))}}
            }
            await custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                NAMESPACE,
                "machines",
                sample.machine,
                status,
                _content_type="application/merge-patch+json",
            )
            loads.append(os.getloadavg()[0])
            await asyncio.sleep(args.fail_interval)
        deadline = time.monotonic() + args.sample_limit
        while True:
            if all(s.stopped_at is not None for s in order) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        preserve_times = [s.preserved_at - s.failed_at for s in order if s.preserved_at is not None]
        lags = [s.stopped_at - s.expiry for s in order if s.stopped_at is not None and s.expiry is not None]
        figures["failed_to_preserved"] = preserve_times
        figures["expiry_lag"] = lags
        figures["sample_load"] = (min(loads), max(loads)) if loads else None
        missing_preserved = [s.machine for s in order if s.preserved_at is None]
        missing_stopped = [s.machine for s in order if s.stopped_at is None]
        sample_writes = writes(await reader.scrape())[0] - writes_before_samples
        figures["writes_per_sample"] = round(sample_writes / max(len(order), 1), 1)
        figures["sample_phase_cpu_s"] = round(proc_cpu_seconds(child.pid) - cpu_before_samples, 2)
        log(f"FAILED -> FULLY PRESERVED: {summary(preserve_times)}; not preserved: {missing_preserved or 'none'}")
        log(
            f"EXPIRY LAG (stop complete - the record's expiry): {summary(lags)}; not stopped: "
            f"{missing_stopped or 'none'}; controller writes per sample (preserve+drain+stop+delete): "
            f"{figures['writes_per_sample']}"
        )
        stop_watch.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        watcher = None

        # --- 4. steady state -------------------------------------------------------------------------------------
        # The samples' last writes come after they stopped: the evidence sweep (every minute at the default
        # 24 h grace) gives each sample's evidence its expiry. Steady state starts once that is done.
        settle_deadline = time.monotonic() + 90
        previous_writes = -1.0
        while time.monotonic() < settle_deadline:  # until a 5 s stretch without writes and with empty queues
            await asyncio.sleep(5)
            flat = await reader.scrape()
            now_writes = writes(flat)[0]
            settled = now_writes == previous_writes and total(flat, "machine_preservation_queue_depth") == 0
            if settled and not await evidence_without_expiry(core):
                break
            previous_writes = now_writes
        flat = await reader.scrape()
        first_writes, first_by = writes(flat)
        first_reconciles = total(flat, "machine_preservation_reconcile_duration_seconds_count")
        first_requests = total(flat, "machine_preservation_api_requests_total")
        first_cpu = proc_cpu_seconds(child.pid)
        log(f"STEADY STATE: {args.steady_seconds}s window starts (resync every {args.resync_seconds}s)")
        window_loads: list[float] = []
        probes: list[float] = []
        end = time.monotonic() + args.steady_seconds
        next_load = time.monotonic()
        while time.monotonic() < end:  # probe /healthz every 100 ms (reads only)
            probes.append(await reader.healthz_seconds())
            if time.monotonic() >= next_load:
                window_loads.append(os.getloadavg()[0])
                next_load += 30.0
            await asyncio.sleep(0.1)
        flat = await reader.scrape()
        last_writes, last_by = writes(flat)
        delta_by = {k: v - first_by.get(k, 0.0) for k, v in last_by.items() if v - first_by.get(k, 0.0)}
        figures["steady_seconds"] = args.steady_seconds
        figures["steady_writes"] = last_writes - first_writes
        figures["steady_writes_by"] = delta_by
        figures["steady_reconciles"] = (
            total(flat, "machine_preservation_reconcile_duration_seconds_count") - first_reconciles
        )
        figures["steady_requests"] = total(flat, "machine_preservation_api_requests_total") - first_requests
        figures["healthz_max_s"] = round(max(probes), 3) if probes else None
        figures["healthz_p99_s"] = round(percentile(probes, 99), 3) if probes else None
        figures["steady_cpu_s"] = round(proc_cpu_seconds(child.pid) - first_cpu, 2)
        figures["steady_load"] = (min(window_loads), max(window_loads)) if window_loads else None
        log(
            f"STEADY STATE: {figures['steady_writes']:.0f} API writes in {args.steady_seconds}s {delta_by or ''} "
            f"({figures['steady_reconciles']:.0f} reconciles, {figures['steady_requests']:.0f} API requests of any "
            f"verb, i.e. watch restarts); controller CPU in the window {figures['steady_cpu_s']}s; /healthz answered "
            f"in p99 {figures['healthz_p99_s']}s, max {figures['healthz_max_s']}s (event-loop stalls)"
        )

        # --- 5. RSS ----------------------------------------------------------------------------------------------
        figures["rss_end"] = proc_memory(child.pid)
        log(f"RSS: after cold start {figures['rss_after_cold_start']}, at the end {figures['rss_end']} (MiB)")
    finally:
        stop_watch.set()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
        if reader is not None:
            await reader.close()
        if child is not None:
            if child.poll() is None:
                figures.setdefault("rss_end", proc_memory(child.pid))
                child.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(child.wait, 45)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            figures["controller_exit"] = child.returncode
            with contextlib.suppress(OSError):
                tail = (directory / "controller.log").read_text(errors="replace").splitlines()
                errors = [line for line in tail if " ERROR " in line or "Traceback" in line]
                figures["controller_log_errors"] = len(errors)
        if api is not None:
            await api.close()
        await asyncio.to_thread(plane.stop)
        if args.keep:
            log(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


def report(args: argparse.Namespace, results: Results) -> None:
    f = results.figures
    print("\n=== controller scale benchmark ===", flush=True)
    print(
        f"{f.get('machines')} Machines + Nodes in {f.get('machine_sets')} MachineSets, {f.get('samples')} failure "
        f"samples every {args.fail_interval}s, machinePreserveTimeout {args.preserve_timeout}, "
        f"{args.workers} workers, resync {args.resync_seconds}s, {f.get('cpus')} CPUs"
    )
    print(f"setup (create all objects, concurrency {args.concurrency}): {f.get('setup_seconds')} s")
    if "cold_full_s" in f:
        print(
            f"1. cold start: process start -> /readyz 200 {f['cold_ready_s']} s; -> first full reconcile "
            f"{f['cold_full_s']} s ({f['cold_writes']:.0f} writes, controller CPU {f.get('cold_cpu_s')} s)"
        )
    pt, lags = f.get("failed_to_preserved") or [], f.get("expiry_lag") or []
    p99 = percentile(pt, 99) if pt else math.inf
    print(f"2. Failed -> fully preserved: {summary(pt)} (load {f.get('sample_load')})")
    print(f"   target p99 <= {TARGETS['failed_p99_s']} s: {'met' if p99 <= TARGETS['failed_p99_s'] else 'NOT met'}")
    worst = max(lags) if lags else math.inf
    print(f"3. expiry lag: {summary(lags)}")
    print(f"   target <= {TARGETS['expiry_lag_s']} s (max): {'met' if worst <= TARGETS['expiry_lag_s'] else 'NOT met'}")
    if "steady_writes" in f:
        print(
            f"4. API writes in {f['steady_seconds']} s of steady state: {f['steady_writes']:.0f} "
            f"{f['steady_writes_by'] or ''} (reconciles {f['steady_reconciles']:.0f}, controller CPU "
            f"{f.get('steady_cpu_s')} s, /healthz max {f.get('healthz_max_s')} s, load {f.get('steady_load')}); "
            f"target 0: {'met' if f['steady_writes'] == 0 else 'NOT met'}"
        )
    rss = f.get("rss_end") or {}
    if rss:
        peak = rss.get("VmHWM", 0.0)
        print(
            f"5. controller memory: peak VmHWM {peak:.1f} MiB, VmRSS at the end {rss.get('VmRSS', 0.0):.1f} MiB; "
            f"target <= {TARGETS['rss_mb']:.0f} MB: {'met' if peak * 1.048576 <= TARGETS['rss_mb'] else 'NOT met'}"
        )
    print(f"controller exit code {f.get('controller_exit')}, ERROR lines in its log: {f.get('controller_log_errors')}")
    for note in results.notes:
        print(f"note: {note}")
    print("json: " + json.dumps(f, default=str), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machines", type=int, default=200)
    parser.add_argument("--machine-sets", type=int, default=10)
    parser.add_argument("--samples", type=int, default=30, help="machines failed one after another (metrics 2, 3)")
    parser.add_argument("--fail-interval", type=float, default=1.0, help="seconds between two failures")
    parser.add_argument("--preserve-timeout", default="15s", help="spec.machinePreserveTimeout of the samples")
    parser.add_argument("--steady-seconds", type=float, default=300.0)
    parser.add_argument("--resync-seconds", type=float, default=60.0, help="the controller's informer resync")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent requests while creating objects")
    parser.add_argument("--cold-start-limit", type=float, default=300.0)
    parser.add_argument("--sample-limit", type=float, default=120.0, help="wait for the samples after the last fail")
    parser.add_argument("--time-limit", type=float, default=1500.0, help="the whole run, in seconds")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    # The controller child process (internal).
    parser.add_argument("--controller-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", default=NAMESPACE, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.controller_child:
        return run_controller_child(args)
    results = Results()
    log(f"start: {args.machines} machines, {args.machine_sets} MachineSets")

    async def bounded() -> None:
        await asyncio.wait_for(bench(args, results), timeout=args.time_limit)

    try:
        asyncio.run(bounded())
    except TimeoutError:
        results.notes.append(f"stopped by --time-limit {args.time_limit}s; figures above are partial")
    except Exception as error:
        results.notes.append(f"failed: {error!r}")
        report(args, results)
        raise
    report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
