"""Which connection makes room at the limits (`TLSSite.admit`), with stand-in connections: the oldest that has not
sent a request, else the least recently used idle one, else none (refused); per peer among the peer's own."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from aiohttp import web

from machine_preservation.webhook.connections import ConnectionLimits, TLSSite
from machine_preservation.webhook.metrics import WebhookMetrics


@dataclass(eq=False)
class Stub:
    site: TLSSite
    peer: str = "10.0.0.1"
    quiet: bool = True
    closed: bool = field(default=False)

    def idle(self) -> bool:
        return self.quiet

    def close_now(self) -> None:
        self.closed = True
        self.site.release(self)  # type: ignore[arg-type]


async def site(*, total: int = 3, per_peer: int = 100) -> TLSSite:
    limits = ConnectionLimits(max_connections=total, max_connections_per_peer=per_peer)
    runner = web.AppRunner(web.Application())
    await runner.setup()  # never started: nothing listens
    return TLSSite(
        runner,
        "127.0.0.1",
        0,
        ssl_context=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER),
        limits=limits,
        metrics=WebhookMetrics(),
    )


def opened(listener: TLSSite, *, peer: str = "10.0.0.1", requested: bool = True) -> Stub:
    connection = Stub(listener, peer=peer)
    assert listener.admit(connection)  # type: ignore[arg-type]
    if requested:
        listener.head_received(connection)  # type: ignore[arg-type]
    return connection


async def test_the_least_recently_used_idle_connection_makes_room() -> None:
    listener = await site()
    first, second, third = (opened(listener) for _ in range(3))
    listener.used(first)  # type: ignore[arg-type]
    listener.used(third)  # type: ignore[arg-type]
    assert opened(listener)
    assert [c.closed for c in (first, second, third)] == [False, True, False]


async def test_a_connection_without_a_request_makes_room_before_an_idle_one() -> None:
    listener = await site()
    idle = opened(listener)
    silent = opened(listener, requested=False)
    opened(listener)
    opened(listener)
    assert (idle.closed, silent.closed) == (False, True)


async def test_busy_connections_are_never_closed_to_make_room() -> None:
    listener = await site()
    busy = opened(listener)
    busy.quiet = False
    idle = opened(listener)
    opened(listener)
    listener.used(idle)  # type: ignore[arg-type]
    opened(listener)
    assert (busy.closed, idle.closed) == (False, False)  # the third one, used longer ago, made room


async def test_at_the_limit_with_every_connection_busy_the_new_one_is_refused() -> None:
    listener = await site(total=2)
    for connection in (opened(listener), opened(listener)):
        connection.quiet = False
    assert not listener.admit(Stub(listener))  # type: ignore[arg-type]


async def test_a_peer_at_its_limit_replaces_its_own_connections_only() -> None:
    listener = await site(total=10, per_peer=2)
    other = opened(listener, peer="10.0.0.9")
    own = [opened(listener), opened(listener)]
    listener.used(other)  # type: ignore[arg-type]
    opened(listener)  # the peer's own least recently used makes room, though another's was used longer ago
    assert (other.closed, own[0].closed, own[1].closed) == (False, True, False)
    for connection in listener._open:
        connection.quiet = False  # type: ignore[attr-defined]
    assert not listener.admit(Stub(listener))  # type: ignore[arg-type]
    assert listener.admit(Stub(listener, peer="10.0.0.8"))  # type: ignore[arg-type]
