"""How API requests are labelled, the preserved-machines gauge computed from the cache, and the event loop's lag
sampled while the metrics server runs."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from machine_preservation.controller.machinery.metrics import (
    Metrics,
    Probes,
    metrics_app,
    preserved_counts,
    preserved_nodes_gone,
    request_verb_and_resource,
)
from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.models import Machine
from machine_preservation.core.preservation_record import PreservationRecord

CONFIG = PreservationConfig()
NOW = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes", "", ("list", "nodes")),
        ("GET", "/api/v1/nodes", "watch=true&resourceVersion=5", ("watch", "nodes")),
        ("GET", "/api/v1/nodes/n1", "", ("get", "nodes")),
        ("PATCH", "/api/v1/nodes/n1/status", "", ("patch", "nodes/status")),
        ("POST", "/api/v1/namespaces/ns/pods/p/eviction", "", ("create", "pods/eviction")),
        ("GET", "/api/v1/pods", "watch=1", ("watch", "pods")),
        (
            "PATCH",
            "/apis/machine.sapcloud.io/v1alpha1/namespaces/ns/machines/m/status",
            "",
            ("patch", "machines/status"),
        ),
        ("DELETE", "/apis/machine.sapcloud.io/v1alpha1/namespaces/ns/machines/m", "", ("delete", "machines")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "", ("update", "leases")),
        ("POST", "/api/v1/namespaces", "", ("create", "namespaces")),
        ("GET", "/api/v1/namespaces/ns", "", ("get", "namespaces")),
        ("GET", "/version", "", ("get", "nonresource")),
        ("GET", "/apis/machine.sapcloud.io/v1alpha1", "", ("list", "unknown")),
    ],
)
def test_request_labels(method: str, path: str, query: str, expected: tuple[str, str]) -> None:
    assert request_verb_and_resource(method, path, query) == expected


def machine(
    name: str, *, phase: str, expiry: dt.datetime | None, value: str | None = None, mirrored: bool = False
) -> Machine:
    """A machine with our record until `expiry` (or, `mirrored`, only MCM's own status expiry)."""
    annotations = {v.PRESERVE_ANNOTATION: value} if value is not None else {}
    if expiry is not None and not mirrored:
        record = PreservationRecord(since=expiry - dt.timedelta(hours=72), until=expiry, by=v.PreservedBy.USER)
        annotations.update(record.annotations())
    return Machine.model_validate(
        {
            "metadata": {"name": name, "annotations": annotations},
            "status": {"currentStatus": {"phase": phase, "preserveExpiryTime": expiry if mirrored else None}},
        }
    )


def test_preserved_counts_by_reason_and_phase_ignore_expired_and_unpreserved() -> None:
    later, earlier = NOW + dt.timedelta(hours=1), NOW - dt.timedelta(seconds=1)
    machines = [
        machine("a", phase="Failed", expiry=later, value="auto-preserve"),
        machine("b", phase="Failed", expiry=later, value="auto-preserved"),
        machine("c", phase="Running", expiry=later, value="now"),
        machine("d", phase="Running", expiry=later),  # node decides: no machine value, still manual
        machine("e", phase="Failed", expiry=earlier, value="now"),  # expired
        machine("f", phase="Running", expiry=None, value="now"),  # not preserved (yet)
    ]
    assert preserved_counts(machines, now=NOW, config=CONFIG, native=False) == {
        ("auto", "Failed"): 2,
        ("manual", "Running"): 2,
    }


def test_with_native_mcm_the_counts_come_from_mcms_expiry_and_ignore_our_records() -> None:
    later = NOW + dt.timedelta(hours=1)
    machines = [
        machine("a", phase="Failed", expiry=later, value="auto-preserved", mirrored=True),
        machine("b", phase="Running", expiry=later, value="now"),  # our record, not yet handed over
        machine("c", phase="Running", expiry=NOW - dt.timedelta(seconds=1), value="now", mirrored=True),
    ]
    assert preserved_counts(machines, now=NOW, config=CONFIG, native=True) == {("auto", "Failed"): 1}
    assert preserved_counts(machines, now=NOW, config=CONFIG, native=False) == {("manual", "Running"): 1}


def test_preserved_machines_whose_node_is_gone_are_counted_while_preserved() -> None:
    def record(expiry: dt.datetime, gone: dt.datetime | None) -> Machine:
        kept = PreservationRecord(
            since=NOW - dt.timedelta(hours=1), until=expiry, by=v.PreservedBy.USER, node_gone_since=gone
        )
        return Machine.model_validate({"metadata": {"name": "m", "annotations": kept.annotations()}})

    later, earlier = NOW + dt.timedelta(hours=1), NOW - dt.timedelta(seconds=1)
    machines = [record(later, NOW), record(later, None), record(earlier, NOW), record(later, NOW)]
    assert preserved_nodes_gone(machines, now=NOW, config=CONFIG) == 2
    assert preserved_nodes_gone([], now=NOW, config=CONFIG) == 0


def test_an_expiry_beyond_the_cap_counts_until_the_cap_only() -> None:
    record = PreservationRecord(
        since=NOW - dt.timedelta(hours=2), until=NOW + dt.timedelta(days=3650), by=v.PreservedBy.USER
    )
    far = Machine.model_validate(
        {
            "metadata": {"name": "far", "annotations": record.annotations()},
            "status": {"currentStatus": {"phase": "Running"}},
        }
    )
    assert (
        preserved_counts(
            [far], now=NOW, config=PreservationConfig(max_preserve_timeout=dt.timedelta(hours=1)), native=False
        )
        == {}
    )
    assert preserved_counts(
        [far], now=NOW, config=PreservationConfig(max_preserve_timeout=dt.timedelta(hours=3)), native=False
    ) == {("manual", "Running"): 1}


def test_the_gauge_is_read_at_scrape_time() -> None:
    metrics = Metrics()
    current: list[Machine] = []
    metrics.watch_preserved(
        "shoot--a",
        lambda: preserved_counts(current, now=NOW, config=CONFIG, native=False),
        lambda: preserved_nodes_gone(current, now=NOW, config=CONFIG),
    )
    assert b"machine_preservation_preserved_machines{" not in generate_latest(metrics.registry)
    current.append(machine("a", phase="Failed", expiry=NOW + dt.timedelta(hours=1), value="now"))
    scraped = generate_latest(metrics.registry).decode()
    assert 'machine_preservation_preserved_machines{namespace="shoot--a",phase="Failed",reason="manual"} 1.0' in scraped


def test_the_shoots_of_a_seed_report_into_one_registry_and_leave_it_when_they_stop() -> None:
    metrics = Metrics()
    old_a = metrics.watch_preserved("shoot--a", lambda: {("manual", "Failed"): 1}, lambda: 1)
    metrics.watch_preserved("shoot--b", lambda: {("auto", "Failed"): 2}, lambda: 0)
    forget_a = metrics.watch_queue("machines", lambda: 3, scope="shoot--a")
    metrics.watch_queue("machines", lambda: 4, scope="shoot--b")
    metrics.watch_queue("extensions", lambda: 1)
    scraped = generate_latest(metrics.registry).decode()
    assert 'machine_preservation_preserved_machines{namespace="shoot--a",phase="Failed",reason="manual"} 1.0' in scraped
    assert 'machine_preservation_preserved_machines{namespace="shoot--b",phase="Failed",reason="auto"} 2.0' in scraped
    assert 'machine_preservation_preserved_nodes_gone{namespace="shoot--a"} 1.0' in scraped
    assert 'machine_preservation_preserved_nodes_gone{namespace="shoot--b"} 0.0' in scraped
    assert 'machine_preservation_queue_depth{queue="machines"} 7.0' in scraped, "summed over the shoots"
    assert 'machine_preservation_queue_depth{queue="extensions"} 1.0' in scraped

    metrics.watch_preserved("shoot--a", lambda: {("manual", "Running"): 5}, lambda: 0)  # shoot a's runtime restarted
    old_a()  # the old runtime's clean-up runs after the new one started
    forget_a()
    scraped = generate_latest(metrics.registry).decode()
    assert (
        'machine_preservation_preserved_machines{namespace="shoot--a",phase="Running",reason="manual"} 5.0' in scraped
    )
    assert 'namespace="shoot--a",phase="Failed"' not in scraped
    assert 'machine_preservation_queue_depth{queue="machines"} 4.0' in scraped


async def test_api_errors_count_failed_requests_and_not_the_answers_the_product_acts_on() -> None:
    statuses = {"gone": 404, "taken": 409, "forbidden": 403, "broken": 500, "busy": 429, "fine": 200}

    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=statuses[request.match_info["name"]])

    app = web.Application()
    app.router.add_route("*", "/api/v1/nodes/{name}", answer)
    metrics = Metrics()
    traced = [metrics.trace_config(cluster="shoot")]
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession(trace_configs=traced) as session:
        for name in statuses:
            async with session.get(server.make_url(f"/api/v1/nodes/{name}")) as response:
                assert response.status == statuses[name]
        port = server.port
    with pytest.raises(aiohttp.ClientConnectionError):  # nobody listens there any more: no answer
        async with aiohttp.ClientSession(trace_configs=traced) as session:
            await session.get(f"http://127.0.0.1:{port}/api/v1/nodes/fine")
    scraped = generate_latest(metrics.registry).decode()
    errors = 'machine_preservation_api_errors_total{cluster="shoot",resource="nodes",verb="get"}'
    assert f"{errors} 3.0" in scraped, "403, 500 and the refused connection"
    for code in statuses.values():
        assert f'api_requests_total{{cluster="shoot",code="{code}",resource="nodes",verb="get"}} 1.0' in scraped


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


def lag_samples(text: str) -> dict[str, float]:
    """The loop-lag histogram's cumulative bucket counts by upper bound, and its count."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("machine_preservation_event_loop_lag_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            found[bound] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("machine_preservation_event_loop_lag_seconds_count"):
            found["count"] = float(line.rsplit(" ", 1)[1])
    return found


async def test_the_metrics_server_samples_the_event_loops_lag_while_it_runs() -> None:
    metrics = Metrics()
    async with TestClient(TestServer(metrics_app(metrics=metrics, probes=Probes(ready=lambda: True)))) as http:
        await asyncio.sleep(0.35)
        hold_the_loop(0.5)  # the process's own work: the timer due within 0.1 s of its start runs >= 0.4 s late
        await asyncio.sleep(0.15)
        samples = lag_samples(await (await http.get("/metrics")).text())
    assert samples["count"] >= 3
    assert samples["0.25"] < samples["count"], "the 0.5 s the loop was held is observed"
    assert samples["0.25"] >= 1, "the samples before the hold are not late by as much"
    count = samples["count"]
    await asyncio.sleep(0.25)
    assert lag_samples(generate_latest(metrics.registry).decode())["count"] == count, "stopped with the server"
