"""Prometheus metrics (one registry per process) and the small HTTP server for /metrics, /healthz, /readyz.

API requests are counted from an aiohttp `TraceConfig` attached to every kubernetes.aio client, so
every call (lists, watches, writes, evictions, leases) is seen without wrapping each one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import re
import types
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.decision import expiry_of
from machine_preservation.core.models import Machine
from machine_preservation.core.native import observed_expiry
from machine_preservation.core.preserve_value import is_auto_value
from machine_preservation.kube.api_errors import is_failure

logger = logging.getLogger(__name__)

_API_PATH = re.compile(r"^/(?:api/[^/]+|apis/[^/]+/[^/]+)(?P<rest>/.*)?$")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})


def request_verb_and_resource(method: str, path: str, query: str) -> tuple[str, str]:
    """Kubernetes verb and resource ("pods/eviction", "nodes/status") of an API request URL."""
    match = _API_PATH.match(path)
    if match is None:
        return method.lower(), "nonresource"  # /version, /healthz, ...
    segments = [s for s in (match.group("rest") or "").split("/") if s]
    if len(segments) >= 3 and segments[0] == "namespaces":
        segments = segments[2:]
    resource = segments[0] if segments else "unknown"
    named = len(segments) >= 2
    if len(segments) >= 3:
        resource = f"{resource}/{segments[2]}"
    if method == "GET":
        watching = parse_qs(query).get("watch", [""])[0] in ("true", "1")
        verb = "watch" if watching else ("get" if named else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
    return verb, resource


PreservedCounts = Callable[[], Mapping[tuple[str, str], int]]
NodesGone = Callable[[], int]
Unwatch = Callable[[], None]
K = TypeVar("K")


def _forget(registered: dict[K, Any], key: K, value: object) -> None:
    if registered.get(key) is value:
        del registered[key]


@dataclass
class Metrics:
    """The process's metrics. In the seed every shoot's runtime reports into the same one: counters and
    histograms add up over shoots, queue depths are summed, preserved machines are labelled with the namespace."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _preserved: dict[str, tuple[PreservedCounts, NodesGone]] = field(default_factory=dict)  # namespace -> counts
    _queues: dict[tuple[str, str], Callable[[], int]] = field(default_factory=dict)  # (queue, scope) -> depth

    def __post_init__(self) -> None:
        r = self.registry
        r.register(_PreservedCollector(self._preserved))
        self.drains = Counter(
            "machine_preservation_drains_total", "Drains of preserved nodes, by outcome.", ["outcome"], registry=r
        )
        self.reconcile_duration = Histogram(
            "machine_preservation_reconcile_duration_seconds",
            "Time per reconcile, by controller and result.",
            ["controller", "result"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.queue_depth = Gauge(
            "machine_preservation_queue_depth", "Keys waiting in a work queue.", ["queue"], registry=r
        )
        self.api_requests = Counter(
            "machine_preservation_api_requests_total",
            "Kubernetes API requests, by cluster, verb, resource and HTTP code.",
            ["cluster", "verb", "resource", "code"],
            registry=r,
        )
        self.api_errors = Counter(
            "machine_preservation_api_errors_total",
            "Kubernetes API requests that failed: no answer, or refused (400, 401, 403, 422) or a server error (5xx);"
            " not the answers the product acts on (404, 409, 410, 429), which api_requests_total counts by code.",
            ["cluster", "verb", "resource"],
            registry=r,
        )
        self.reconcile_slots = Gauge(
            "machine_preservation_reconcile_slots_in_use",
            "Reconciles running now, over all shoots (the cap is --max-concurrent-reconciles).",
            registry=r,
        )
        self.leader = Gauge("machine_preservation_leader", "1 while this process leads.", registry=r)
        self._register_shoot_gauges()
        self.loop_lag = Histogram(
            "machine_preservation_event_loop_lag_seconds",
            "How late the event loop ran a timer (one is due every 0.1 s): how long the process's own work held up"
            " everything else, as opposed to waiting for an API server.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )

    def _register_shoot_gauges(self) -> None:
        """What the Gardener extension tells per shoot it serves."""
        r = self.registry
        self.shoot_api_server_slow = Gauge(
            "machine_preservation_shoot_api_server_slow",
            "1 while a served shoot's API server answers its GET /version late (past 2 s, or not within 10 s).",
            ["namespace"],
            registry=r,
        )
        self.shoot_nodes_over_budget = Gauge(
            "machine_preservation_shoot_nodes_over_budget",
            "1 while a shoot is not served because its Nodes come to more bytes than --shoot-node-budget allows.",
            ["namespace"],
            registry=r,
        )
        self.shoot_node_protection_missing = Gauge(
            "machine_preservation_shoot_node_protection_missing",
            "1 while a served shoot runs without its node webhooks and node annotation policy: its Kubernetes is older"
            " than 1.30 (writes of the preserve annotation on its Nodes are not checked).",
            ["namespace"],
            registry=r,
        )

    async def sample_loop_lag(self, *, interval: float = 0.1) -> None:
        """Observe the event loop's lag until cancelled (one timer every `interval`: negligible CPU)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(interval)
            self.loop_lag.observe(max(loop.time() - started - interval, 0.0))

    def watch_preserved(self, namespace: str, counts: PreservedCounts, nodes_gone: NodesGone) -> Unwatch:
        """Report the namespace's preserved machines by (reason, phase), and how many of them have lost their Node,
        computed from its cache at scrape time, until the returned function is called (its runtime stopped; a
        newer runtime's counts stay)."""
        watched = (counts, nodes_gone)
        self._preserved[namespace] = watched
        return lambda: _forget(self._preserved, namespace, watched)

    def watch_queue(self, name: str, depth: Callable[[], int], *, scope: str = "") -> Unwatch:
        """Report the keys waiting in queue `name`, summed over every scope (shoot namespace) that has one."""
        self._queues[name, scope] = depth
        queues = self._queues
        self.queue_depth.labels(queue=name).set_function(
            lambda: float(sum(depth() for (queue, _), depth in list(queues.items()) if queue == name))
        )
        return lambda: _forget(self._queues, (name, scope), depth)

    def trace_config(self, *, cluster: str) -> aiohttp.TraceConfig:
        """An aiohttp TraceConfig counting every API request of one client."""
        trace = aiohttp.TraceConfig()

        async def on_end(
            _session: aiohttp.ClientSession, _context: types.SimpleNamespace, params: aiohttp.TraceRequestEndParams
        ) -> None:
            verb, resource = request_verb_and_resource(params.method, params.url.path, params.url.query_string)
            code = params.response.status
            self.api_requests.labels(cluster=cluster, verb=verb, resource=resource, code=str(code)).inc()
            if is_failure(code):
                self.api_errors.labels(cluster=cluster, verb=verb, resource=resource).inc()

        async def on_exception(
            _session: aiohttp.ClientSession,
            _context: types.SimpleNamespace,
            params: aiohttp.TraceRequestExceptionParams,
        ) -> None:
            verb, resource = request_verb_and_resource(params.method, params.url.path, params.url.query_string)
            self.api_errors.labels(cluster=cluster, verb=verb, resource=resource).inc()

        trace.on_request_end.append(on_end)
        trace.on_request_exception.append(on_exception)
        return trace

    def api_writes(self) -> float:
        """Total write requests so far (what the steady-state benchmark counts)."""
        total = 0.0
        for metric in self.api_requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("verb") in WRITE_VERBS:
                    total += sample.value
        return total


def preserved_counts(
    machines: list[Machine], *, now: dt.datetime, config: PreservationConfig, native: bool
) -> collections.Counter[tuple[str, str]]:
    """Preserved machines by kind (auto/manual) and phase: from our records, or what MCM shows when native."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for machine in machines:
        expiry = observed_expiry(machine, now) if native else expiry_of(machine, config)
        if expiry is not None and expiry > now:
            auto = is_auto_value(machine.metadata.annotations.get(v.PRESERVE_ANNOTATION))
            counts["auto" if auto else "manual", machine.phase or "Unknown"] += 1
    return counts


def preserved_nodes_gone(machines: Iterable[Machine], *, now: dt.datetime, config: PreservationConfig) -> int:
    """Our preserved machines whose Node is gone (their record says since when)."""
    return sum(
        1
        for machine in machines
        if (record := machine.preservation) is not None
        and record.node_gone_since is not None
        and not record.expired(now=now, max_timeout=config.max_preserve_timeout)
    )


class _PreservedCollector(Collector):
    def __init__(self, by_namespace: Mapping[str, tuple[PreservedCounts, NodesGone]]) -> None:
        self._by_namespace = by_namespace

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "machine_preservation_preserved_machines",
            "Machines currently preserved, by namespace (the shoot's, in a seed), reason (manual or auto) and phase.",
            labels=["namespace", "reason", "phase"],
        )
        gone = GaugeMetricFamily(
            "machine_preservation_preserved_nodes_gone",
            "Preserved machines whose Node object is gone (deleted); they stay preserved until their expiry.",
            labels=["namespace"],
        )
        for namespace, (counts, nodes_gone) in sorted(self._by_namespace.items()):
            for (reason, phase), count in sorted(counts().items()):
                family.add_metric([namespace, reason, phase], count)
            gone.add_metric([namespace], nodes_gone())
        yield family
        yield gone


@dataclass
class Probes:
    """What /healthz and /readyz report: alive once started; ready once every cache has synced."""

    ready: Callable[[], bool]


def metrics_app(*, metrics: Metrics, probes: Probes) -> web.Application:
    async def serve_metrics(_request: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_request: web.Request) -> web.Response:
        if probes.ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="caches not synced")

    async def sampling_loop_lag(_app: web.Application) -> AsyncIterator[None]:
        sampler = asyncio.create_task(metrics.sample_loop_lag(), name="loop-lag")
        yield
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler

    app = web.Application()
    app.cleanup_ctx.append(sampling_loop_lag)
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_metrics_server(
    metrics: Metrics, *, ready: Callable[[], bool], host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Serve /metrics, /healthz and /readyz (`ready`); the runner to clean up and the port bound (`port` 0: any)."""
    runner = web.AppRunner(metrics_app(metrics=metrics, probes=Probes(ready=ready)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound = runner.addresses[0][1] if runner.addresses else port
    logger.info("metrics, /healthz and /readyz on http://%s:%d", host, bound)
    return runner, bound
