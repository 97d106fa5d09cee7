"""What the controller scale benchmarks share (controller_scale.py, seed_scale.py): figures and percentiles,
/proc readings of a process, the product's /metrics, Node conditions as a kubelet writes them, and the watch of
the failure samples (when each one is preserved, drained and stopped, on the benchmark's clock).

Only the standard library at module level: controller_scale.py's child process imports what the controller needs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import datetime as dt
import gc
import math
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GROUP, VERSION = "machine.sapcloud.io", "v1alpha1"
SAMPLE_LABEL = "bench.machine-preservation/sample"
PRESERVE = "node.machine.sapcloud.io/preserve"
PRESERVED_SINCE = "node.machine.sapcloud.io/preserved-since"
PRESERVED_UNTIL = "node.machine.sapcloud.io/preserved-until"
MAX_PRESERVE_SECONDS = 720 * 3600  # the controller's default --max-preserve-timeout
CA_ANNOTATION = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
TAINT_KEY, TAINT_EFFECT = "node.machine.sapcloud.io/preserved", "NoSchedule"
DRAINED = "Preserved node drained successfully."
WRITE_VERBS = ("create", "update", "patch", "delete")
MERGE_PATCH = "application/merge-patch+json"


def log(message: str) -> None:
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"[{time.strftime('%H:%M:%S')} load {load}] {message}", flush=True)


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (for fewer than 100 samples p99 is the maximum)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def summary(values: list[float]) -> str:
    if not values:
        return "no samples"
    return (
        f"n={len(values)} p50={percentile(values, 50):.3f}s p90={percentile(values, 90):.3f}s "
        f"p99={percentile(values, 99):.3f}s max={max(values):.3f}s min={min(values):.3f}s"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def proc_memory(pid: int) -> dict[str, float]:
    """VmHWM / VmRSS of a process in MB (MiB, as /proc reports kB)."""
    result: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                result[key] = int(value.split()[0]) / 1024
    return result


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(names: Mapping[int, str]) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process on the machine, by pid, with a name: `names` for the pids it holds,
    else the command's (a kube-apiserver whose arguments mention `seed` is `seed kube-apiserver`; kernel workers,
    whose names change with their work, are `kworker`)."""
    result: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            comm, _, rest = (entry / "stat").read_text().partition("(")[2].rpartition(")")
            fields = rest.split()
            name = names.get(pid) or ("kworker" if comm.startswith("kworker/") else comm)
            if comm == "kube-apiserver" and b"seed" in (entry / "cmdline").read_bytes():
                name = "seed kube-apiserver"
        except OSError:
            continue  # gone meanwhile
        result[pid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return result


def cpu_used_by_name(
    before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds used between two `cpu_by_process` readings, summed by name (a process started meanwhile
    counts from zero; one that ended meanwhile is not seen)."""
    used: dict[str, float] = collections.defaultdict(float)
    for pid, (name, cpu) in after.items():
        used[name] += cpu - (before[pid][1] if pid in before else 0.0)
    return dict(used)


def proc_started_monotonic(pid: int) -> float:
    """When a process started, on time.monotonic()'s scale (10 ms resolution): its start in clock ticks since
    boot against /proc/uptime, both read now."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.monotonic() - (uptime - started_after_boot)


class MetricsReader:
    """A process's metrics server: /readyz, /healthz timing (event-loop stalls), /metrics flattened."""

    def __init__(self, port: int, *, timeout: float = 10.0) -> None:
        import aiohttp

        self.base = f"http://127.0.0.1:{port}"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))

    async def close(self) -> None:
        await self.session.close()

    async def ready(self) -> bool:
        try:
            async with self.session.get(f"{self.base}/readyz") as response:
                return response.status == 200
        except Exception:  # connection refused (aiohttp.ClientError, OSError) while the process starts
            return False

    async def healthz_seconds(self) -> float:
        """How long /healthz takes to answer: the process's event-loop stalls show up here."""
        started = time.monotonic()
        async with self.session.get(f"{self.base}/healthz") as response:
            await response.read()
        return time.monotonic() - started

    async def scrape(self) -> dict[str, float]:
        """Flattened samples: 'name{k=v,...}' -> value (labels sorted)."""
        from prometheus_client.parser import text_string_to_metric_families

        async with self.session.get(f"{self.base}/metrics") as response:
            text = await response.text()
        flat: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                flat[f"{sample.name}{{{labels}}}"] = sample.value
        return flat


def total(flat: Mapping[str, float], name: str, **labels: str) -> float:
    wanted = [f"{k}={v}" for k, v in labels.items()]
    result = 0.0
    for key, value in flat.items():
        metric, _, rest = key.partition("{")
        if metric == name and all(w in rest.rstrip("}").split(",") for w in wanted):
            result += value
    return result


def requests_by(flat: dict[str, float], verbs: tuple[str, ...] | None = None) -> dict[str, float]:
    """machine_preservation_api_requests_total by 'cluster verb resource code' (only `verbs`, if given)."""
    by: dict[str, float] = {}
    for key, value in flat.items():
        metric, _, rest = key.partition("{")
        if metric != "machine_preservation_api_requests_total":
            continue
        labels = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if part)
        if verbs is None or labels.get("verb") in verbs:
            name = f"{labels['cluster']} {labels['verb']} {labels['resource']} {labels['code']}"
            by[name] = by.get(name, 0.0) + value
    return by


def writes(flat: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Controller write requests in total and by 'cluster verb resource code'."""
    by = requests_by(flat, WRITE_VERBS)
    return sum(by.values()), by


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


LOOP_LAG = "machine_preservation_event_loop_lag_seconds"


def loop_lag(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """The event loop's lag between two scrapes (a timer due every 0.1 s): how many samples, their total, and how
    many ran more than 10 / 25 / 50 / 100 ms late (the extension's own work holding everything up)."""
    changed = delta(after, before)
    count = changed.get(f"{LOOP_LAG}_count{{}}", 0.0)
    figures = {"samples": count, "total_s": round(changed.get(f"{LOOP_LAG}_sum{{}}", 0.0), 3)}
    for bound, name in (("0.01", "over_10ms"), ("0.025", "over_25ms"), ("0.05", "over_50ms"), ("0.1", "over_100ms")):
        figures[name] = count - changed.get(f"{LOOP_LAG}_bucket{{le={bound}}}", 0.0)
    return figures


async def gather_limited(limit: int, jobs: list[Callable[[], Awaitable[None]]]) -> None:
    semaphore = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[None]]) -> None:
        async with semaphore:
            await job()

    await asyncio.gather(*(run(job) for job in jobs))


def ready_condition(status: str) -> dict[str, Any]:
    now = rfc3339(dt.datetime.now(dt.UTC))
    ready = status == "True"
    return {
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady" if ready else "NodeStatusUnknown",
        "message": "" if ready else "Kubelet stopped posting node status.",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu_ticks() -> dict[str, int]:
    """The machine's CPU time so far by state (the `cpu` line of /proc/stat, in clock ticks)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return {state: int(value) for state, value in zip(CPU_STATES, fields, strict=False)}


def cores_by_state(before: Mapping[str, int], after: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Cores spent in each CPU state between two `machine_cpu_ticks` readings `seconds` apart (steal: time the
    hypervisor gave to others; iowait: idle while waiting on the disk)."""
    tick = os.sysconf("SC_CLK_TCK")
    return {state: round((after[state] - before[state]) / tick / seconds, 3) for state in after}


class LoopLagProbe:
    """How late this process's own event loop runs a timer due every 0.1 s (the samples' times are taken by its
    watch handlers, so a late loop here would show as a slow product), and the machine's CPU states per second
    (slow windows: steal, iowait, or all cores busy)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.late: list[tuple[float, float]] = []  # (wall clock, lag) of every lag over 25 ms
        self.states: list[tuple[float, dict[str, float]]] = []  # (wall clock, cores per state in the last second)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        ticks, at = machine_cpu_ticks(), loop.time()
        while True:
            due = loop.time() + 0.1
            await asyncio.sleep(0.1)
            now = loop.time()
            self.lags.append(now - due)
            if now - due > 0.025:
                self.late.append((round(time.time(), 2), round(now - due, 3)))
            if now - at >= 1.0:
                latest = machine_cpu_ticks()
                self.states.append((round(time.time(), 1), cores_by_state(ticks, latest, now - at)))
                ticks, at = latest, now

    def __enter__(self) -> LoopLagProbe:
        # What the setup left (the script holds ~600 MB at 200 shoots) is never freed before the end: frozen, a
        # collection does not walk it, which took this loop up to 0.13 s at a time in the middle of samples.
        gc.collect()
        gc.freeze()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
        gc.unfreeze()

    def summary(self) -> dict[str, float]:
        lags = self.lags or [0.0]
        return {
            "samples": len(self.lags),
            "max_s": round(max(lags), 3),
            "over_25ms": sum(lag > 0.025 for lag in lags),
            "over_50ms": sum(lag > 0.05 for lag in lags),
            "over_100ms": sum(lag > 0.1 for lag in lags),
        }


# --- the failure samples ------------------------------------------------------------------------------------------


@dataclass
class Sample:
    index: int
    machine: str  # the Machine's name
    node: str
    namespace: str = ""  # the Machine's namespace (the control namespace)
    failed_at: float = 0.0  # wall clock, just before the phase patch is sent
    machine_preserved_at: float | None = None
    node_protected_at: float | None = None  # CA annotation, taint, Preserved True (whatever the drain's state)
    node_preserved_at: float | None = None  # ... and the condition says the drain succeeded
    expiry: float | None = None  # the record's expiry (preserved-until, capped)
    machine_stopped_at: float | None = None
    node_stopped_at: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.machine}"

    @property
    def preserved_at(self) -> float | None:
        if self.machine_preserved_at is None or self.node_preserved_at is None:
            return None
        return max(self.machine_preserved_at, self.node_preserved_at)

    @property
    def protected_at(self) -> float | None:
        if self.machine_preserved_at is None or self.node_protected_at is None:
            return None
        return max(self.machine_preserved_at, self.node_protected_at)

    @property
    def stopped_at(self) -> float | None:
        if self.machine_stopped_at is None or self.node_stopped_at is None:
            return None
        return max(self.machine_stopped_at, self.node_stopped_at)


def _preserved_condition(raw: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (raw.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Preserved"), None)


def node_protected(raw: dict[str, Any]) -> bool:
    """Taint and CA annotation: kept from the autoscaler and new pods (the condition says False "being drained"
    while the first drain runs)."""
    metadata, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    tainted = any(t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT for t in spec.get("taints") or [])
    return bool(tainted and (metadata.get("annotations") or {}).get(CA_ANNOTATION) == "true")


def node_preserved(raw: dict[str, Any]) -> bool:
    """Protected, and the Preserved condition True with "Preserved node drained successfully."."""
    condition = _preserved_condition(raw) or {}
    return (
        node_protected(raw) and condition.get("status") == "True" and condition.get("message", "").startswith(DRAINED)
    )


def node_stopped(raw: dict[str, Any]) -> bool:
    metadata, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    tainted = any(t.get("key") == TAINT_KEY for t in spec.get("taints") or [])
    condition = _preserved_condition(raw)
    return bool(
        not tainted
        and CA_ANNOTATION not in (metadata.get("annotations") or {})
        and condition is not None
        and condition.get("status") == "False"
    )


class SampleRecorder:
    """Records, on this process's clock, when each sample reaches 'preserved' and 'stopped' (watch handlers)."""

    def __init__(self, samples: list[Sample]) -> None:
        self.by_node = {s.node: s for s in samples}
        self.by_machine = {s.key: s for s in samples}

    def on_node(self, kind: str, raw: dict[str, Any], now: float) -> None:
        sample = self.by_node.get((raw.get("metadata") or {}).get("name", ""))
        if sample is None or not sample.failed_at or kind == "DELETED":
            return
        if sample.node_protected_at is None and node_protected(raw):
            sample.node_protected_at = now
        if sample.node_preserved_at is None and node_preserved(raw):
            sample.node_preserved_at = now
        elif sample.node_preserved_at is not None and sample.node_stopped_at is None and node_stopped(raw):
            sample.node_stopped_at = now

    def on_machine(self, kind: str, raw: dict[str, Any], now: float) -> None:
        metadata = raw.get("metadata") or {}
        sample = self.by_machine.get(f"{metadata.get('namespace', '')}/{metadata.get('name', '')}")
        if sample is None or not sample.failed_at:
            return
        annotations = metadata.get("annotations") or {}
        since, until = annotations.get(PRESERVED_SINCE), annotations.get(PRESERVED_UNTIL)
        if sample.machine_preserved_at is None:
            if since and until and kind != "DELETED":
                sample.machine_preserved_at = now
                sample.expiry = min(parse_time(until), parse_time(since) + MAX_PRESERVE_SECONDS)
        elif sample.machine_stopped_at is None and (
            kind == "DELETED" or metadata.get("deletionTimestamp") or not until
        ):
            sample.machine_stopped_at = now


async def watch_raw(
    list_function: Callable[..., Any],
    call_args: tuple[Any, ...],
    handle: Callable[[str, dict[str, Any], float], None],
    stop: asyncio.Event,
    *,
    label_selector: str = SAMPLE_LABEL,
) -> None:
    """Watch `list_function(*call_args)` (kubernetes.aio) with a label selector, handing each event's raw object
    and its arrival time to `handle`; restarts until `stop` is set."""
    from kubernetes.aio import watch

    class RawWatch(watch.Watch):
        def get_return_type(self, func: object) -> None:
            return None

    while not stop.is_set():
        stream = RawWatch()  # type: ignore[no-untyped-call]
        try:
            async for event in stream.stream(  # type: ignore[no-untyped-call]
                list_function,
                *call_args,
                label_selector=label_selector,
                timeout_seconds=3600,
                _request_timeout=3700,
            ):
                handle(event["type"], event["raw_object"], time.time())
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log(f"sample watch restarted after {error!r}")
            await asyncio.sleep(0.5)
        finally:
            await stream.close()  # type: ignore[no-untyped-call]
