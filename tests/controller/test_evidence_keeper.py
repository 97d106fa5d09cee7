"""The evidence shell (controller/preservation/evidence.py) against API servers that answer as a test says: the drain's
wait is bounded whatever the shoot's API server does, a read that fails is named and the rest still recorded, a
ConfigMap there already is kept or replaced by when it was captured, a write refused is told by a Warning Event and
never raised, the Node is pointed at its evidence once at the version given, and the sweep reads metadata only and
does what the core plans."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes.aio import client

from machine_preservation.controller.machinery.events import EventRecorder
from machine_preservation.controller.preservation.evidence import (
    EVENTS_PAGE,
    EVIDENCE_DEFER,
    EvidenceKeeper,
    EvidenceSweeper,
)
from machine_preservation.core import evidence as e
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node, Pod
from machine_preservation.kube.clients import api_client
from tests.controller.silent import silent_api_server
from tests.polling import eventually_async

NOW = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)
SINCE = NOW - dt.timedelta(seconds=5)
NODE = Node.model_validate({"metadata": {"name": "n", "uid": "uid-n", "resourceVersion": "10"}})
MACHINE = Machine.model_validate(
    {
        "metadata": {"name": "m", "namespace": "ns"},
        "status": {"currentStatus": {"phase": "Failed"}, "lastOperation": {"description": "failed", "state": "Failed"}},
    }
)
CONFIG_MAPS = "/api/v1/namespaces/kube-system/configmaps"
# A pod as the drain's watch caches it.
WATCHED_POD = Pod.model_validate(
    {
        "metadata": {
            "namespace": "a",
            "name": "w",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "w-1", "controller": True}],
        },
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "c", "restartCount": 2, "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
            ],
        },
    }
)


@dataclass
class FakeApi:
    """Answers by route; each request is recorded as (method, path, query, headers, body)."""

    answers: dict[tuple[str, str], Callable[[web.Request, Any], tuple[int, Any]]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str], dict[str, str], Any]] = field(default_factory=list)
    held: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)  # answered once set

    def answer(self, method: str, path: str, status: int, body: Any = None) -> None:
        self.answers[(method, path)] = lambda _request, _body: (status, body)

    def made(self, method: str, path: str) -> list[tuple[dict[str, str], dict[str, str], Any]]:
        return [(q, h, b) for m, p, q, h, b in self.requests if (m, p) == (method, path)]

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.requests.append((request.method, request.path, dict(request.query), dict(request.headers), body))
        if (hold := self.held.get((request.method, request.path))) is not None:
            await hold.wait()
        answer = self.answers.get((request.method, request.path))
        status, reply = answer(request, body) if answer else (404, {"kind": "Status", "code": 404})
        return web.json_response(reply if reply is not None else {}, status=status)


@contextlib.asynccontextmanager
async def fake_api() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with api_client(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
            yield fake, api
    finally:
        await runner.cleanup()


def keeper_of(api: client.ApiClient) -> EvidenceKeeper:
    recorder = EventRecorder(control=api, target=api, machine_namespace="ns", instance="test")
    return EvidenceKeeper(target=api, recorder=recorder, clock=lambda: NOW)


def listing(items: list[Any], token: str = "") -> dict[str, Any]:
    return {"kind": "List", "metadata": {"continue": token} if token else {}, "items": items}


def served(fake: FakeApi) -> None:
    """The Node, its Events (two pages) and its pods, as the API server serves them."""
    fake.answer(
        "GET",
        "/api/v1/nodes/n",
        200,
        {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}},
    )

    def events(request: web.Request, _: Any) -> tuple[int, Any]:
        if request.query.get("continue") == "page-2":
            return 200, listing([{"reason": "Second", "lastTimestamp": "2026-11-29T09:59:00Z"}])
        return 200, listing([{"reason": "First", "lastTimestamp": "2026-11-29T09:58:00Z"}], token="page-2")

    fake.answers[("GET", "/api/v1/namespaces/default/events")] = events
    fake.answer(
        "GET",
        "/api/v1/pods",
        200,
        listing([{"metadata": {"namespace": "a", "name": "p"}, "status": {"phase": "Running"}}]),
    )


async def captured(keeper: EvidenceKeeper, key: str = "ns/m") -> None:
    ended = keeper.ended
    keeper.capture(key, machine=MACHINE, node=NODE, since=SINCE, pods=None)
    await eventually_async(lambda: keeper.ended > ended)


def written_evidence(fake: FakeApi) -> e.Evidence:
    ((_, _, body),) = fake.made("POST", CONFIG_MAPS)
    return e.Evidence.model_validate_json(body["data"][v.EVIDENCE_DATA_KEY])


async def test_the_pointer_waits_for_a_hanging_capture_no_longer_than_its_bound() -> None:
    async with silent_api_server() as silent:
        keeper = keeper_of(silent.api)
        keeper.capture("ns/m", machine=MACHINE, node=NODE, since=SINCE, pods=None)
        await asyncio.wait_for(keeper.settled("ns/m", seconds=0.05), 5)  # returns though nothing answers
        assert not keeper.written("ns/m")
        assert await keeper.annotate("ns/m", NODE, version="10") is None, "nothing to point at yet"
        assert keeper.unpointed("ns/m"), "owed once the capture is written"
        await keeper.stop()


async def test_the_drains_pods_are_taken_as_given_and_the_rest_read_once_the_drain_is_over() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 201, {})
        keeper = keeper_of(api)
        keeper.capture("ns/m", machine=MACHINE, node=NODE, since=SINCE, pods=[WATCHED_POD])
        await asyncio.sleep(0.3)  # while the drain runs, the capture sends nothing
        assert fake.requests == []
        assert not keeper.written("ns/m")
        keeper.drain_over("ns/m")
        await asyncio.wait_for(keeper.settled("ns/m", seconds=30), 5)
        assert keeper.written("ns/m")
        assert not fake.made("GET", "/api/v1/pods"), "the pods come from the drain's watch"
        evidence = written_evidence(fake)
        (pod,) = evidence.pods
        assert (pod.namespace, pod.name, pod.phase, pod.owner_kind, pod.owner_name) == (
            "a",
            "w",
            "Running",
            "ReplicaSet",
            "w-1",
        )
        assert [(c.name, c.restart_count, c.last_termination_reason) for c in pod.containers] == [("c", 2, "OOMKilled")]
        assert [c.type for c in evidence.conditions] == ["Ready"]
        await keeper.stop()


async def test_a_long_drain_holds_the_rest_of_the_capture_back_no_longer_than_its_bound() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 201, {})
        keeper = keeper_of(api)
        loop = asyncio.get_running_loop()
        started = loop.time()
        keeper.capture("ns/m", machine=MACHINE, node=NODE, since=SINCE, pods=[WATCHED_POD])  # no drain_over follows
        await eventually_async(lambda: keeper.written("ns/m"), limit=EVIDENCE_DEFER + 30)
        assert len(fake.made("POST", CONFIG_MAPS)) == 1
        assert fake.made("GET", "/api/v1/nodes/n")
        assert loop.time() - started >= EVIDENCE_DEFER
        await keeper.stop()


async def test_the_evidence_is_read_and_written_once_per_preservation() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 201, {})
        keeper = keeper_of(api)
        await captured(keeper)
        assert keeper.written("ns/m")
        keeper.capture("ns/m", machine=MACHINE, node=NODE, since=SINCE, pods=None)  # a later reconcile: nothing again
        await asyncio.sleep(0.1)  # a second capture's requests would be on their way
        ((_, _, body),) = fake.made("POST", CONFIG_MAPS)
        assert body["metadata"]["name"] == e.evidence_name("n")
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "uid-n"}
        ]
        evidence = written_evidence(fake)
        assert [c.type for c in evidence.conditions] == ["Ready"]
        assert [x.reason for x in evidence.events] == ["Second", "First"]  # both pages, newest first
        assert [(p.namespace, p.name, p.phase) for p in evidence.pods] == [("a", "p", "Running")]
        assert evidence.machine.last_operation.description == "failed"
        event_queries = [q for q, _, _ in fake.made("GET", "/api/v1/namespaces/default/events")]
        assert event_queries[0]["fieldSelector"] == "involvedObject.kind=Node,involvedObject.name=n"
        assert event_queries[0]["limit"] == str(EVENTS_PAGE)
        assert fake.made("GET", "/api/v1/pods")[0][0]["fieldSelector"] == "spec.nodeName=n"
        # Forgotten (the preservation ended): the next one captures anew.
        keeper.forget("ns/m")
        await captured(keeper)
        assert len(fake.made("POST", CONFIG_MAPS)) == 2


async def test_a_read_that_fails_is_named_and_the_rest_recorded() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("GET", "/api/v1/nodes/n", 500, {"kind": "Status", "code": 500})
        fake.answer("GET", "/api/v1/pods", 403, {"kind": "Status", "code": 403})
        fake.answer("POST", CONFIG_MAPS, 201, {})
        keeper = keeper_of(api)
        await captured(keeper)
        evidence = written_evidence(fake)
        assert [note.split(":")[0] for note in evidence.unavailable] == ["node", "pods"]
        assert "500" in evidence.unavailable[0]
        assert "403" in evidence.unavailable[1]
        assert [x.reason for x in evidence.events] == ["Second", "First"]
        assert keeper.written("ns/m")


def existing(captured_at: dt.datetime) -> dict[str, Any]:
    document = e.to_json(e.Evidence(version=1, node="n", captured_at=captured_at))
    return {"metadata": {"name": e.evidence_name("n"), "resourceVersion": "5"}, "data": {v.EVIDENCE_DATA_KEY: document}}


async def test_evidence_of_this_preservation_there_already_is_kept() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 409, {"kind": "Status", "code": 409})
        fake.answer("GET", f"{CONFIG_MAPS}/{e.evidence_name('n')}", 200, existing(SINCE + dt.timedelta(seconds=1)))
        keeper = keeper_of(api)
        await captured(keeper)
        assert keeper.written("ns/m")
        assert fake.made("PATCH", f"{CONFIG_MAPS}/{e.evidence_name('n')}") == []


async def test_evidence_of_an_earlier_preservation_is_replaced() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 409, {"kind": "Status", "code": 409})
        fake.answer("GET", f"{CONFIG_MAPS}/{e.evidence_name('n')}", 200, existing(SINCE - dt.timedelta(days=1)))
        fake.answer("PATCH", f"{CONFIG_MAPS}/{e.evidence_name('n')}", 200, {})
        keeper = keeper_of(api)
        await captured(keeper)
        assert keeper.written("ns/m")
        ((_, headers, patch),) = fake.made("PATCH", f"{CONFIG_MAPS}/{e.evidence_name('n')}")
        assert headers["Content-Type"] == "application/merge-patch+json"
        assert patch["metadata"]["resourceVersion"] == "5"
        assert patch["metadata"]["annotations"] == {v.EVIDENCE_NODE_KEY: "n", v.EVIDENCE_EXPIRES_KEY: None}
        stored = e.Evidence.model_validate_json(patch["data"][v.EVIDENCE_DATA_KEY])
        assert stored.captured_at == NOW


async def test_a_refused_write_is_told_by_a_warning_event_and_never_raised() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 403, {"kind": "Status", "code": 403})
        fake.answer("POST", "/api/v1/namespaces/default/events", 201, {})
        keeper = keeper_of(api)
        await captured(keeper)
        assert not keeper.written("ns/m")
        ((_, _, event),) = fake.made("POST", "/api/v1/namespaces/default/events")
        assert (event["type"], event["reason"]) == ("Warning", v.EventReason.EVIDENCE_NOT_RECORDED)
        assert event["involvedObject"]["name"] == "n"
        assert "403" in event["message"]
        assert await keeper.annotate("ns/m", NODE, version="10") is None
        assert not keeper.unpointed("ns/m"), "nothing written: no pointer owed"


async def test_the_node_is_pointed_at_its_evidence_once_at_the_version_given() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 201, {})
        fake.answer("PATCH", "/api/v1/nodes/n", 200, {"metadata": {"name": "n", "resourceVersion": "11"}})
        keeper = keeper_of(api)
        await captured(keeper)
        assert await keeper.annotate("ns/m", NODE, version="10") == "11"
        ((_, headers, patch),) = fake.made("PATCH", "/api/v1/nodes/n")
        assert headers["Content-Type"] == "application/merge-patch+json"
        assert patch == {
            "metadata": {
                "resourceVersion": "10",
                "annotations": {v.PRESERVED_EVIDENCE_ANNOTATION: e.evidence_reference("n")},
            }
        }
        assert await keeper.annotate("ns/m", NODE, version="11") is None  # once
        assert len(fake.made("PATCH", "/api/v1/nodes/n")) == 1


async def test_a_node_changed_meanwhile_is_pointed_at_by_a_later_reconcile() -> None:
    async with fake_api() as (fake, api):
        served(fake)
        fake.answer("POST", CONFIG_MAPS, 201, {})
        fake.answer("PATCH", "/api/v1/nodes/n", 409, {"kind": "Status", "code": 409})
        keeper = keeper_of(api)
        await captured(keeper)
        assert await keeper.annotate("ns/m", NODE, version="10") is None
        assert keeper.unpointed("ns/m"), "still owed: the reconcile comes back for it"
        fake.answer("PATCH", "/api/v1/nodes/n", 500, {"kind": "Status", "code": 500})
        assert await keeper.annotate("ns/m", NODE, version="12") is None  # refused: the preservation goes on
        assert keeper.unpointed("ns/m")
        fake.answer("PATCH", "/api/v1/nodes/n", 200, {"metadata": {"name": "n", "resourceVersion": "13"}})
        assert await keeper.annotate("ns/m", NODE, version="12") == "13"
        assert not keeper.unpointed("ns/m")


def listed(name: str, node: str, *, expires: str | None = None, owner: str | None = None) -> dict[str, Any]:
    annotations = {v.EVIDENCE_NODE_KEY: node} | ({v.EVIDENCE_EXPIRES_KEY: expires} if expires else {})
    return {
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "resourceVersion": f"rv-{name}",
            "labels": {v.EVIDENCE_LABEL: "true"},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner or node, "uid": "u"}],
        }
    }


async def test_the_sweep_reads_metadata_only_and_does_what_the_core_plans() -> None:
    async with fake_api() as (fake, api):
        items = [
            listed(e.evidence_name("kept"), "kept"),
            listed(e.evidence_name("ended"), "ended"),
            listed(e.evidence_name("expired"), "expired", expires="2026-11-29T09:00:00Z"),
            listed("foreign", "kept"),
            listed(e.evidence_name("stolen"), "stolen", owner="another"),
        ]
        fake.answer("GET", CONFIG_MAPS, 200, listing(items))
        for name in ("ended", "expired"):
            fake.answer("PATCH", f"{CONFIG_MAPS}/{e.evidence_name(name)}", 200, {})
            fake.answer("DELETE", f"{CONFIG_MAPS}/{e.evidence_name(name)}", 200, {})
        grace = dt.timedelta(hours=1)
        sweeper = EvidenceSweeper(
            target=api, grace=grace, preserved=lambda: {"kept"}, captures_ended=lambda: 0, clock=lambda: NOW
        )
        await sweeper.sweep()
        ((query, headers, _),) = fake.made("GET", CONFIG_MAPS)
        assert headers["Accept"] == "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        assert query["labelSelector"] == f"{v.EVIDENCE_LABEL}=true"
        assert [(m, p) for m, p, *_ in fake.requests[1:]] == [
            ("PATCH", f"{CONFIG_MAPS}/{e.evidence_name('ended')}"),
            ("DELETE", f"{CONFIG_MAPS}/{e.evidence_name('expired')}"),
        ]
        ((_, _, patch),) = fake.made("PATCH", f"{CONFIG_MAPS}/{e.evidence_name('ended')}")
        assert patch == {
            "metadata": {
                "resourceVersion": f"rv-{e.evidence_name('ended')}",
                "annotations": {v.EVIDENCE_EXPIRES_KEY: "2026-11-29T11:00:00Z"},
            }
        }
        ((_, _, deletion),) = fake.made("DELETE", f"{CONFIG_MAPS}/{e.evidence_name('expired')}")
        assert deletion["preconditions"] == {"resourceVersion": f"rv-{e.evidence_name('expired')}"}


async def test_a_sweep_that_fails_is_tried_again() -> None:
    async with fake_api() as (fake, api):
        fake.answer("GET", CONFIG_MAPS, 500, {"kind": "Status", "code": 500})
        sweeper = EvidenceSweeper(
            target=api, grace=dt.timedelta(seconds=2), preserved=set, captures_ended=lambda: 0, clock=lambda: NOW
        )
        running = asyncio.create_task(sweeper.run())
        try:
            await eventually_async(lambda: len(fake.made("GET", CONFIG_MAPS)) >= 2, limit=10, interval=0.05)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


async def test_a_sweep_that_found_no_evidence_waits_for_a_capture_to_end() -> None:
    # Most shoots never hold evidence: their sweeps list nothing until a capture ended.
    async with fake_api() as (fake, api):
        fake.answer("GET", CONFIG_MAPS, 200, listing([]))
        ended = 0
        sweeper = EvidenceSweeper(
            target=api, grace=dt.timedelta(seconds=2), preserved=set, captures_ended=lambda: ended, clock=lambda: NOW
        )
        running = asyncio.create_task(sweeper.run())
        try:
            await eventually_async(lambda: len(fake.made("GET", CONFIG_MAPS)) == 1, limit=10, interval=0.05)
            await asyncio.sleep(2.5)  # two and a half sweep periods (a second each)
            assert len(fake.made("GET", CONFIG_MAPS)) == 1
            ended = 1
            await eventually_async(lambda: len(fake.made("GET", CONFIG_MAPS)) == 2, limit=10, interval=0.05)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
