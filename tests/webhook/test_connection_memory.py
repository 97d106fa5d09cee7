"""What an open connection keeps in memory between requests, and that connections sharing the one TLS receive
buffer never see each other's bytes. Real TLS sockets on 127.0.0.1, client and server in this process; the
server's share of the memory is told apart by the allocations' tracebacks (tracemalloc)."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from machine_preservation.certs.authority import KeyPair
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.webhook.connections import RECEIVE_BUFFER_BYTES, ConnectionLimits
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.webhook.conftest import StaticMachineSets
from tests.webhook.reviews import NODE_KIND, node, review
from tests.webhook.test_connection_limits import connect_tls
from tests.webhook.test_server_tls import make_ca

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

# Several times the receive buffer, so that every review arrives in many socket reads.
BODY_BYTES = 4 * RECEIVE_BUFFER_BYTES
SERVER_CODE = tracemalloc.Filter(True, "*/machine_preservation/webhook/*", all_frames=True)


@pytest.fixture
def ca() -> KeyPair:
    return make_ca("memory-ca")


@pytest.fixture
async def server(tmp_path: Path, ca: KeyPair) -> AsyncIterator[WebhookServer]:
    install(tmp_path, local_serving_pair(ca))
    async with WebhookServer(
        host="127.0.0.1",
        port=0,
        cert_dir=tmp_path,
        settings=AdmissionSettings(),
        machine_sets=StaticMachineSets(),
        limits=ConnectionLimits(header_timeout=60),  # tracing makes everything slow
    ) as running:
        yield running


def large_review(uid: str, preserve: str) -> bytes:
    """A Node UPDATE review of about BODY_BYTES that sets `preserve`, padded with labels."""
    labels = {f"example.com/label-{i}": "x" * 200 for i in range(BODY_BYTES // 400)}
    old, new = node("n1"), node("n1", {v.PRESERVE_ANNOTATION: preserve})
    for document in (old, new):
        document["metadata"]["labels"].update(labels)
    return json.dumps(review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old, uid=uid)).encode()


def request_bytes(body: bytes) -> bytes:
    head = (
        "POST /validate-preserve-annotation HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def answer(stream: Stream) -> dict[str, Any]:
    """The review response of one HTTP/1.1 response on the stream (the connection stays open)."""
    reader, _ = stream
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    response: dict[str, Any] = json.loads(await reader.readexactly(length))["response"]
    return response


async def test_concurrent_large_reviews_each_get_their_own_answer(server: WebhookServer, ca: KeyPair) -> None:
    """Eight connections send their reviews interleaved, a piece at a time: each answer carries its own uid and
    its own verdict (allowed for `now`, denied for the unsupported value)."""
    values = ["now" if i % 2 == 0 else f"bad-{i}" for i in range(8)]
    bodies = [large_review(f"uid-{i}", value) for i, value in enumerate(values)]
    assert all(len(body) > BODY_BYTES for body in bodies)
    streams = [await connect_tls(server, ca) for _ in bodies]
    pending = [request_bytes(body) for body in bodies]
    piece = RECEIVE_BUFFER_BYTES // 3
    while any(pending):
        for i, (_, writer) in enumerate(streams):
            writer.write(pending[i][:piece])
            pending[i] = pending[i][piece:]
        await asyncio.gather(*(writer.drain() for _, writer in streams))
    answers = await asyncio.gather(*(answer(stream) for stream in streams))
    assert [a["uid"] for a in answers] == [f"uid-{i}" for i in range(8)]
    assert [a["allowed"] for a in answers] == [value == "now" for value in values]
    assert all(
        f'"{value}"' in a["status"]["message"] for a, value in zip(answers, values, strict=True) if value != "now"
    )
    for _, writer in streams:
        writer.close()


async def test_open_connections_keep_no_buffers_between_requests(server: WebhookServer, ca: KeyPair) -> None:
    """Idle connections, some after a large review on them, cost the server a few KiB each: neither a TLS receive
    buffer of their own (asyncio's default: 256 KiB each) nor the last request's body."""
    body = large_review("uid", "now")
    warm = await connect_tls(server, ca)
    warm[1].write(request_bytes(body))
    assert (await answer(warm))["allowed"] is True
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start(30)
    try:
        before = tracemalloc.take_snapshot().filter_traces([SERVER_CODE])
        streams = []
        for i in range(10):
            stream = await connect_tls(server, ca)
            streams.append(stream)
            if i % 2 == 0:
                stream[1].write(request_bytes(body))
                assert (await answer(stream))["allowed"] is True
        await asyncio.sleep(0.1)  # the server finishes its side of each response
        after = tracemalloc.take_snapshot().filter_traces([SERVER_CODE])
    finally:
        if not tracing:
            tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert held / len(streams) < 32 * 1024, f"{held / len(streams) / 1024:.0f} KiB per open connection"
    for _, writer in [warm, *streams]:
        writer.close()
