"""What a connection may cost, through real sockets on 127.0.0.1: silent, stalled and half-sent connections are
closed after the header timeout, a kept-alive connection after the idle timeout, and at most `max_connections`
are open, without disturbing a client that sends its requests as the API server does.

Timeouts are short here; "closed" means the server closed it before a generous deadline, "open" that it was
still open when the client looked, which it checks well before the server's timer could have fired."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from machine_preservation.certs.authority import KeyPair
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.webhook_configurations import MACHINE_DELETION_PATH, PRESERVE_ANNOTATION_PATH, shoot_path
from machine_preservation.webhook.app import Routes
from machine_preservation.webhook.connections import IDLE_AFTER_SECONDS, ConnectionLimits
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.polling import eventually_async
from tests.webhook.conftest import StaticMachineSets
from tests.webhook.test_server_tls import client_context, make_ca

HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 4.0
SLACK = 10.0  # the server closes well within timeout + SLACK, however loaded the machine
HALF_HEAD = b"POST /validate-preserve-annotation HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Start = Callable[..., Awaitable[WebhookServer]]


@pytest.fixture
def ca() -> KeyPair:
    return make_ca("limits-ca")


@pytest.fixture
async def start(tmp_path: Path, ca: KeyPair) -> AsyncIterator[Start]:
    """Starts the server with the given limits; stops it at the end of the test."""
    install(tmp_path, local_serving_pair(ca))
    started: list[WebhookServer] = []

    async def run(
        *,
        header_timeout: float = HEADER_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int = 100,
        max_connections_per_peer: int = 100,
        routes: Routes = "all",
    ) -> WebhookServer:
        server = WebhookServer(
            host="127.0.0.1",
            port=0,
            cert_dir=tmp_path,
            settings=AdmissionSettings(),
            machine_sets=StaticMachineSets(),
            limits=ConnectionLimits(
                header_timeout=header_timeout,
                idle_timeout=idle_timeout,
                max_connections=max_connections,
                max_connections_per_peer=max_connections_per_peer,
            ),
            routes=routes,
        )
        await server.start()
        started.append(server)
        return server

    yield run
    for server in started:
        await server.stop()


async def connect_tls(
    server: WebhookServer, ca: KeyPair, *, port: int | None = None, source: str = "127.0.0.1"
) -> Stream:
    """A TLS connection to `port` (default: the server's first) from the loopback address `source`."""
    return await asyncio.open_connection(
        "127.0.0.1", port or server.port, ssl=client_context(ca), local_addr=(source, 0)
    )


async def connect_tcp(server: WebhookServer) -> Stream:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def get_healthz(stream: Stream) -> bytes:
    """One keep-alive request on the stream, sent all at once as the API server does; returns the body."""
    reader, writer = stream
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n")
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return await reader.readexactly(length)


async def closed_by_server(stream: Stream, *, within: float) -> bool:
    """True once the server has closed the connection (end of stream or reset), False if still open after `within`."""
    reader, _ = stream
    try:
        async with asyncio.timeout(within):
            while await reader.read(1024):
                pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def dropped(server: WebhookServer, reason: str, listener: str = "all") -> float:
    value = server.metrics.registry.get_sample_value(
        "machine_preservation_webhook_connections_dropped_total", {"listener": listener, "reason": reason}
    )
    return value or 0.0


def open_connections(server: WebhookServer, listener: str = "all") -> float:
    value = server.metrics.registry.get_sample_value("machine_preservation_webhook_connections", {"listener": listener})
    return value or 0.0


async def eventually_no_connections(server: WebhookServer) -> None:
    await eventually_async(lambda: open_connections(server) == 0, limit=SLACK)


# A partial ClientHello: a TLS handshake record header announcing more than is sent.
PARTIAL_CLIENT_HELLO = bytes.fromhex("160301020001")


@pytest.mark.parametrize("sent", [b"", PARTIAL_CLIENT_HELLO], ids=["nothing", "partial-client-hello"])
async def test_a_connection_stuck_before_its_tls_handshake_ends_is_closed_after_the_header_timeout(
    start: Start, sent: bytes
) -> None:
    server = await start()
    stream = await connect_tcp(server)
    stream[1].write(sent)
    assert not await closed_by_server(stream, within=HEADER_TIMEOUT / 5)
    assert open_connections(server) == 1
    assert await closed_by_server(stream, within=HEADER_TIMEOUT + SLACK)
    assert dropped(server, "header_timeout") == 1
    await eventually_no_connections(server)


async def test_a_tls_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    start: Start, ca: KeyPair
) -> None:
    server = await start()
    stream = await connect_tls(server, ca)
    assert not await closed_by_server(stream, within=HEADER_TIMEOUT / 5)
    assert await closed_by_server(stream, within=HEADER_TIMEOUT + SLACK)
    assert dropped(server, "header_timeout") == 1
    await eventually_no_connections(server)


async def test_a_tls_connection_that_sends_half_a_request_head_is_closed(start: Start, ca: KeyPair) -> None:
    server = await start()
    stream = await connect_tls(server, ca)
    stream[1].write(HALF_HEAD)
    assert not await closed_by_server(stream, within=HEADER_TIMEOUT / 5)
    stream[1].write(b"Content-Length: 1000\r\n")  # still trickling: the deadline does not move
    assert await closed_by_server(stream, within=HEADER_TIMEOUT + SLACK)
    assert dropped(server, "header_timeout") == 1
    await eventually_no_connections(server)


async def test_plain_http_on_the_tls_port_is_closed_at_once(start: Start) -> None:
    server = await start(header_timeout=60)
    stream = await connect_tcp(server)
    stream[1].write(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n")
    assert await closed_by_server(stream, within=SLACK)
    assert dropped(server, "tls_handshake") == 1
    await eventually_no_connections(server)


async def test_a_keep_alive_client_is_not_disturbed(start: Start, ca: KeyPair) -> None:
    """Requests sent at once, with pauses longer than the header timeout but shorter than the idle timeout,
    all go over the one connection."""
    server = await start()
    stream = await connect_tls(server, ca)
    local = stream[1].get_extra_info("sockname")
    for _ in range(3):
        assert await get_healthz(stream) == b"ok"
        assert not await closed_by_server(stream, within=HEADER_TIMEOUT * 1.5)
    assert await get_healthz(stream) == b"ok"
    assert stream[1].get_extra_info("sockname") == local
    assert dropped(server, "header_timeout") == 0
    assert open_connections(server) == 1


async def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(start: Start, ca: KeyPair) -> None:
    server = await start()
    idle, stalled = await connect_tls(server, ca), await connect_tls(server, ca)
    for stream in (idle, stalled):
        assert await get_healthz(stream) == b"ok"
    stalled[1].write(HALF_HEAD)  # a second request that never completes its head
    looks = [closed_by_server(stream, within=HEADER_TIMEOUT * 1.5) for stream in (idle, stalled)]
    assert await asyncio.gather(*looks) == [False, False]
    looks = [closed_by_server(stream, within=IDLE_TIMEOUT + SLACK) for stream in (idle, stalled)]
    assert await asyncio.gather(*looks) == [True, True]
    await eventually_no_connections(server)


async def send_head_of_a_long_request(stream: Stream) -> None:
    """A request whose head is complete and whose body is still coming: the connection is busy."""
    _, writer = stream
    writer.write(HALF_HEAD + b"Content-Length: 100\r\n\r\n{")
    await writer.drain()


async def test_over_the_limit_with_every_connection_busy_a_new_one_is_refused(start: Start, ca: KeyPair) -> None:
    server = await start(max_connections=3, idle_timeout=60)
    busy = [await connect_tls(server, ca) for _ in range(3)]
    for stream in busy:
        assert await get_healthz(stream) == b"ok"
        await send_head_of_a_long_request(stream)
    await asyncio.sleep(IDLE_AFTER_SECONDS + 0.2)  # quiet, but each in the middle of a request
    # Closed before TLS: the client sees a reset or an end of stream during its handshake.
    with pytest.raises((ConnectionError, ssl.SSLError)):
        await connect_tls(server, ca)
    assert dropped(server, "limit") == 1
    assert dropped(server, "evicted_idle") == 0
    for stream in busy:
        assert not await closed_by_server(stream, within=0.2)
    busy[0][1].close()
    await busy[0][1].wait_closed()
    await eventually_async(lambda: open_connections(server) < 3, limit=SLACK)
    assert await get_healthz(await connect_tls(server, ca)) == b"ok"


async def test_at_the_limit_the_least_recently_used_idle_connection_makes_room(start: Start, ca: KeyPair) -> None:
    """Kept-alive connections are not held forever at the limit: the one used longest ago is closed."""
    server = await start(max_connections=3, idle_timeout=60)
    streams = [await connect_tls(server, ca) for _ in range(3)]
    for stream in streams:
        assert await get_healthz(stream) == b"ok"
    # The first connection is used again last: the second is now the least recently used.
    for stream in (streams[2], streams[0]):
        assert await get_healthz(stream) == b"ok"
    await asyncio.sleep(IDLE_AFTER_SECONDS + 0.2)

    newcomer = await connect_tls(server, ca)
    assert await get_healthz(newcomer) == b"ok"
    assert await closed_by_server(streams[1], within=SLACK)
    for stream in (streams[0], streams[2]):
        assert await get_healthz(stream) == b"ok"
    assert dropped(server, "evicted_idle") == 1
    assert dropped(server, "limit") == 0
    assert open_connections(server) == 3


async def test_a_connection_that_was_just_used_is_not_closed_to_make_room(start: Start, ca: KeyPair) -> None:
    server = await start(max_connections=2, idle_timeout=60)
    streams = [await connect_tls(server, ca) for _ in range(2)]
    for stream in streams:
        assert await get_healthz(stream) == b"ok"
    # Both answered just now: neither is idle yet, so the newcomer is refused rather than a request cut short.
    with pytest.raises((ConnectionError, ssl.SSLError)):
        await connect_tls(server, ca)
    assert dropped(server, "limit") == 1
    for stream in streams:
        assert await get_healthz(stream) == b"ok"


async def test_one_peer_holds_at_most_its_share_and_replaces_its_own_connections(start: Start, ca: KeyPair) -> None:
    server = await start(max_connections=10, max_connections_per_peer=2, idle_timeout=60)
    other = await connect_tls(server, ca, source="127.0.0.2")
    assert await get_healthz(other) == b"ok"
    flooder = [await connect_tls(server, ca) for _ in range(2)]
    for stream in flooder:
        assert await get_healthz(stream) == b"ok"
    await asyncio.sleep(IDLE_AFTER_SECONDS + 0.2)

    # The flooding peer's third connection replaces its own least recently used one, never the other peer's.
    third = await connect_tls(server, ca)
    assert await get_healthz(third) == b"ok"
    assert await closed_by_server(flooder[0], within=SLACK)
    assert dropped(server, "evicted_idle") == 1
    # With both of its connections busy, its next one is refused, though the listener has room.
    for stream in (flooder[1], third):
        await send_head_of_a_long_request(stream)
    with pytest.raises((ConnectionError, ssl.SSLError)):
        await connect_tls(server, ca)
    assert dropped(server, "peer_limit") == 1
    assert await get_healthz(other) == b"ok"
    assert await get_healthz(await connect_tls(server, ca, source="127.0.0.3")) == b"ok"


async def test_the_seed_and_the_shoots_servers_serve_only_their_own_routes(start: Start, ca: KeyPair) -> None:
    """The seed chart's two servers: a shoot's kube-apiserver (or anything in a shoot namespace) on the shoots' port
    cannot reach the seed's fail-closed Machine webhooks, and the seed's port serves no shoot."""
    shoots, seed = await start(routes="shoots"), await start(routes="seed")
    context = client_context(ca)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        for server, path, status in (
            (shoots, MACHINE_DELETION_PATH, 404),
            (shoots, PRESERVE_ANNOTATION_PATH, 404),
            (shoots, shoot_path("shoot--a--b", PRESERVE_ANNOTATION_PATH), 400),  # served: b"" is no review
            (seed, shoot_path("shoot--a--b", PRESERVE_ANNOTATION_PATH), 404),
            (seed, MACHINE_DELETION_PATH, 400),
            (seed, PRESERVE_ANNOTATION_PATH, 400),
        ):
            async with session.post(f"https://127.0.0.1:{server.port}{path}", data=b"") as response:
                assert response.status == status, (server.routes, path)
            async with session.get(f"https://127.0.0.1:{server.port}/readyz") as response:
                assert response.status == 200
        # Each counts its own connections (the session's kept-alive one to each).
        assert open_connections(shoots, listener="shoots") == 1
        assert open_connections(seed, listener="seed") == 1


def test_limits_must_be_positive() -> None:
    for field in ("header_timeout", "idle_timeout", "max_connections", "max_connections_per_peer"):
        with pytest.raises(ValueError, match=f"{field} must be positive, got 0"):
            ConnectionLimits(**{field: 0})
