"""The listening site: TLS per connection, with bounds on what one client connection may cost.

aiohttp's own TCPSite hands asyncio a listening socket with TLS on. Then a connection cannot be refused before
its TLS handshake has run (and its TLS state is allocated), a connection that fails its
handshake is never reported to the application, and nothing bounds how long a client may take to send its
first request: each silent or half-sent connection stays open as long as aiohttp's keep-alive timeout, an hour.

`TLSSite` accepts plain TCP instead and, per connection (`_Connection`):
1. counts it, in all and per peer address; at `max_connections` (or its peer's `max_connections_per_peer`),
   it makes room by closing the oldest connection (of that peer) that has not sent a whole request head yet (a
   client in the middle of a slow-loris, or one that went silent), else the least recently used kept-alive
   connection that is idle between requests, else, when every open connection is in the middle of a request,
   refuses the new one at once, before any TLS work. A flood of silent or kept-alive connections therefore
   cannot lock the API server out: its connections send their request within milliseconds of connecting, and
   one peer holds at most its own share of the slots;
2. upgrades it to TLS as `loop.start_tls` does, but with one receive buffer for all connections
   (`_TLSProtocol`) instead of asyncio's 256 KiB for each, idle or not;
3. hands the plaintext to aiohttp's request handler through `_Plaintext`, which passes everything through
   and reports when the head of the first request is complete (its blank line has arrived);
4. closes it if the handshake and that first head together take longer than `header_timeout`, so a client
   that connects and sends nothing, stalls in the handshake or trickles its headers is closed in seconds.
After the first head, aiohttp's keep-alive timeout (`idle_timeout`) closes a connection that has not sent its
next request in time after a response; a body that does not arrive in time is answered 408 by the app.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from machine_preservation.webhook.metrics import WebhookMetrics

logger = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT: Final = 10.0
# Longer than the idle timeout of Go's HTTP client (90 s), which the API server calls webhooks with: the
# client closes an idle connection first, so it never sends a request on one that the server is closing.
DEFAULT_IDLE_TIMEOUT: Final = 120.0
# An open TLS connection costs ~30 KiB idle, up to ~0.12 MiB after a large review (see BENCHMARKS.md); 200 stay
# well under the chart's 256 MiB limit, and are far more than the API servers' keep-alive pools need.
DEFAULT_MAX_CONNECTIONS: Final = 200
# An API server keeps a few connections per replica (each replica is a peer of its own); one peer beyond this many
# is a flood, which then replaces its own connections instead of everyone else's.
DEFAULT_MAX_CONNECTIONS_PER_PEER: Final = 100
# The most one socket read takes in (asyncio's own figure); one buffer of it serves all connections.
RECEIVE_BUFFER_BYTES: Final = sslproto.SSLProtocol.max_size
# A kept-alive connection quiet this long with no request in progress may be closed to make room.
IDLE_AFTER_SECONDS: Final = 1.0
_LIMIT_WARNING_INTERVAL: Final = 60.0
_HEAD_END: Final = b"\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    """Seconds from accepting a connection until the head of its first request is in, TLS handshake included."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds a connection may take to send its next request after a response (keep-alive)."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Open connections at most: at the limit, a new connection replaces the oldest one that has not sent a
    request yet, else the least recently used idle one, or, when every open connection is busy with a request,
    is closed as soon as it is accepted."""
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    """Open connections at most from one peer address, made room for in the same way among its own."""

    def __post_init__(self) -> None:
        for name in ("header_timeout", "idle_timeout", "max_connections", "max_connections_per_peer"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class TLSSite(web.BaseSite):
    """A TLS listener for an `AppRunner` (start it after `runner.setup()`), bounded by `limits`; `listener` names it
    in the metrics."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext,
        limits: ConnectionLimits,
        metrics: WebhookMetrics,
        listener: str = "all",
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self.tls_context = ssl_context
        self.limits = limits
        self._listener = listener
        self._open_gauge = metrics.connections.labels(listener)
        self._dropped = metrics.connections_dropped
        self._open: set[_Connection] = set()
        self._per_peer: dict[str, int] = {}
        # The open connections whose first request head is not complete yet, oldest first.
        self._waiting: dict[_Connection, None] = {}
        # The open connections that have sent a request head, least recently used (data received) first.
        self._used: OrderedDict[_Connection, None] = OrderedDict()
        self._unreported: dict[str, int] = {}
        self._limit_warned_at: float | None = None
        # Every connection receives its TLS records into this one buffer (see `_TLSProtocol`).
        self.receive_buffer = memoryview(bytearray(RECEIVE_BUFFER_BYTES))

    @property
    def name(self) -> str:
        host = self._host or "0.0.0.0"
        return f"https://[{host}]:{self._port}" if ":" in host else f"https://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self._host, self._port)

    async def stop(self) -> None:
        await super().stop()  # stops listening; the runner then shuts down the connections aiohttp serves
        handshakes = [c.handshake for c in self._open if c.handshake is not None and not c.handshake.done()]
        for task in handshakes:
            task.cancel()
        await asyncio.gather(*handshakes, return_exceptions=True)

    def new_handler(self) -> RequestHandler:
        server = self._runner.server
        assert server is not None, "the runner is set up before the site starts"
        return server()

    def admit(self, connection: _Connection) -> bool:
        """Count a new connection in, making room if needed; False: refuse it."""
        peer = connection.peer
        if self._per_peer.get(peer, 0) >= self.limits.max_connections_per_peer:
            if not self._make_room(peer):
                self._dropped_at_limit("peer_limit")
                return False
        elif len(self._open) >= self.limits.max_connections and not self._make_room(None):
            self._dropped_at_limit("limit")
            return False
        self._open.add(connection)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._waiting[connection] = None
        self._open_gauge.set(len(self._open))
        return True

    def _make_room(self, peer: str | None) -> bool:
        """Close the oldest connection (of `peer`, None: of anyone) that has not sent a request head, else the least
        recently used one idle between requests; False when there is none."""
        waiting = next((c for c in self._waiting if peer is None or c.peer == peer), None)
        if waiting is not None:
            waiting.close_now()
            self._dropped_at_limit("evicted")
            return True
        idle = next((c for c in self._used if (peer is None or c.peer == peer) and c.idle()), None)
        if idle is not None:
            idle.close_now()
            self._dropped_at_limit("evicted_idle")
            return True
        return False

    def head_received(self, connection: _Connection) -> None:
        if connection in self._open:
            self._waiting.pop(connection, None)
            self._used[connection] = None

    def used(self, connection: _Connection) -> None:
        """`connection` received data after its first request head: now the most recently used."""
        if connection in self._used:
            self._used.move_to_end(connection)

    def release(self, connection: _Connection) -> None:
        if connection not in self._open:
            return
        self._open.discard(connection)
        self._waiting.pop(connection, None)
        self._used.pop(connection, None)
        left = self._per_peer[connection.peer] - 1
        if left:
            self._per_peer[connection.peer] = left
        else:
            del self._per_peer[connection.peer]
        self._open_gauge.set(len(self._open))

    def dropped(self, reason: str) -> None:
        self._dropped.labels(self._listener, reason).inc()

    def _dropped_at_limit(self, reason: str) -> None:
        self.dropped(reason)
        # A flood must not turn into a flood of log lines: at most one warning a minute, with counts.
        self._unreported[reason] = self._unreported.get(reason, 0) + 1
        now = asyncio.get_running_loop().time()
        if self._limit_warned_at is None or now - self._limit_warned_at >= _LIMIT_WARNING_INTERVAL:
            logger.warning(
                "%s listener at its connection limits (%d, %d per peer): closed %d connection(s) that had not sent "
                "a request and %d idle one(s), refused %d new one(s) (%d over a peer's limit)",
                self._listener,
                self.limits.max_connections,
                self.limits.max_connections_per_peer,
                self._unreported.get("evicted", 0),
                self._unreported.get("evicted_idle", 0),
                self._unreported.get("limit", 0) + self._unreported.get("peer_limit", 0),
                self._unreported.get("peer_limit", 0),
            )
            self._limit_warned_at, self._unreported = now, {}


class _Connection(asyncio.Protocol):
    """The TCP side of one accepted connection, from accept to close."""

    def __init__(self, site: TLSSite) -> None:
        self._site = site
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.handshake: asyncio.Task[None] | None = None
        self._handler: RequestHandler | None = None
        self._released = False
        self.peer = ""
        self.last_used = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peername = transport.get_extra_info("peername")
        # The address without the port: one client host (an API server replica) however many sockets it opens.
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else str(peername)
        if not self._site.admit(self):
            self._released = True
            transport.abort()
            return
        self._transport = transport
        transport.pause_reading()  # the handshake is the first to read
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._site.limits.header_timeout, self._expire)
        self.handshake = loop.create_task(self._secure(transport))

    def connection_lost(self, exc: Exception | None) -> None:
        # Only called while the connection is still plain TCP: afterwards TLS owns the socket.
        if self.handshake is not None:
            self.handshake.cancel()
        self.release()

    async def _secure(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        self._handler = self._site.new_handler()
        plaintext = _Plaintext(self, self._handler)
        timeout = self._site.limits.header_timeout
        try:
            tls = await _start_tls(
                loop,
                transport,
                plaintext,
                self._site.tls_context,
                receive_buffer=self._site.receive_buffer,
                # Also bounds a closing connection whose peer never answers the TLS close.
                seconds=timeout,
            )
        except asyncio.CancelledError:
            # Our deadline or the site stopping; not re-raised, as nothing awaits this task but `stop`.
            transport.abort()
            self.release()
            return
        except Exception as error:  # a client that does not speak our TLS: its problem, not an error of ours
            logger.debug("TLS handshake with %s failed: %s", transport.get_extra_info("peername"), error)
            self._site.dropped("tls_handshake")
            transport.abort()
            self.release()
            return
        if tls is None:  # closed as the handshake ended
            self.release()
            return
        plaintext.connection_made(tls)

    def head_received(self) -> None:
        self._cancel_deadline()
        self.last_used = asyncio.get_running_loop().time()
        self._site.head_received(self)

    def used(self) -> None:
        self.last_used = asyncio.get_running_loop().time()
        self._site.used(self)

    def idle(self) -> bool:
        """Between requests: the last one answered and quiet since (so closing it loses nothing; the client opens
        a new connection for its next request).

        aiohttp has no public view of its handler's state; it is read defensively (without it, the connection
        counts as busy and is never closed to make room). The quiet time covers what that state does not show: a
        request whose head has arrived but whose handling has not started yet, or a head still trickling in.
        """
        handler = self._handler
        if handler is None or getattr(handler, "_request_in_progress", True):
            return False
        if getattr(handler, "_messages", None) != deque():
            return False
        return asyncio.get_running_loop().time() - self.last_used >= IDLE_AFTER_SECONDS

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        self._site.dropped("header_timeout")
        self.close_now()

    def close_now(self) -> None:
        """Close without a goodbye; the connection stops counting at once."""
        self.release()
        if self.handshake is not None:
            self.handshake.cancel()
        if self._transport is not None:
            self._transport.abort()  # whoever reads it now (TLS, aiohttp's handler) sees the connection lost

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._cancel_deadline()
        self._site.release(self)


class _Plaintext(asyncio.Protocol):
    """Between TLS and aiohttp's request handler: passes everything on; watches for the first head's end."""

    def __init__(self, connection: _Connection, handler: RequestHandler) -> None:
        self._connection = connection
        self._handler = handler
        self._connected = False
        # start_tls delivers data that came with the handshake before it returns the transport: kept until then.
        self._early: list[bytes] = []
        self._watching = True
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connected = True
        self._handler.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self._handler.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self._watching:
            self._watch(data)
        else:
            self._connection.used()
        if self._connected:
            self._handler.data_received(data)
        else:
            self._early.append(data)

    def _watch(self, data: bytes) -> None:
        # The head ends at its first blank line, which may be split across reads.
        if _HEAD_END in self._tail + data[:3] or _HEAD_END in data:
            self._watching, self._tail = False, b""
            self._connection.head_received()
        else:
            self._tail = (self._tail + data[-3:])[-3:]

    def eof_received(self) -> None:
        # None: the transport closes its side too (aiohttp's handler answers the same).
        if self._connected:
            self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection.release()
        if self._connected:
            self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


class _TLSProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol, receiving from the socket into a buffer shared by all connections of the site.

    asyncio gives each connection a receive buffer of its own, 256 KiB, held as long as the connection is open,
    idle or not. Nothing needs it between reads: the socket transport fills it and at once calls
    `buffer_updated`, which copies the bytes into the TLS object's input before anything else can run. One
    buffer per site (one event loop) is therefore enough.
    """

    def __init__(self, *args: Any, receive_buffer: memoryview, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ssl_buffer = receive_buffer.obj  # the parent's own buffer is dropped here
        self._ssl_buffer_view = receive_buffer

    def get_buffer(self, n: int) -> memoryview:
        return self._ssl_buffer_view


async def _start_tls(
    loop: asyncio.AbstractEventLoop,
    transport: asyncio.Transport,
    protocol: asyncio.Protocol,
    context: ssl.SSLContext,
    *,
    receive_buffer: memoryview,
    seconds: float,
) -> asyncio.Transport | None:
    """`loop.start_tls(transport, protocol, context, server_side=True, ...)`, with `_TLSProtocol`.

    Handshake and shutdown each get `seconds`. Returns the TLS transport once the handshake is done (None when
    the connection closed as it ended); `transport` must have its reading paused.
    """
    waiter = loop.create_future()
    tls = _TLSProtocol(
        loop,
        protocol,
        context,
        waiter,
        server_side=True,
        call_connection_made=False,
        ssl_handshake_timeout=seconds,
        ssl_shutdown_timeout=seconds,
        receive_buffer=receive_buffer,
    )
    transport.set_protocol(tls)
    tls.connection_made(transport)
    transport.resume_reading()
    try:
        await waiter
    except BaseException:
        transport.close()
        raise
    app_transport: asyncio.Transport | None = tls._app_transport
    return app_transport
