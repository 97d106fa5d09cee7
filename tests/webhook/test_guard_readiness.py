"""Which webhook process watches for the deletion guard, and what its /readyz says: the seed chart's shoots process
(`--routes=shoots`) never starts the guard's caches and is ready without them; a process serving the Machine
routes (`seed`, or `all` standalone) starts them with the server and answers /readyz 503 until they have synced."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.webhook.app import Routes
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.webhook.conftest import StaticMachineSets
from tests.webhook.test_server_tls import client_context, make_ca


@dataclass
class Syncing(StaticMachineSets):
    """The stand-in, counting its starts, synced only once the test says so."""

    starts: int = 0
    done: bool = False

    async def start(self) -> None:
        self.starts += 1

    def synced(self) -> bool:
        return self.done


Serve = Callable[[Routes], Awaitable[tuple[WebhookServer, Syncing]]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[tuple[Serve, ssl.SSLContext]]:
    ca = make_ca("readiness-ca")
    install(tmp_path, local_serving_pair(ca))
    started: list[WebhookServer] = []

    async def run(routes: Routes) -> tuple[WebhookServer, Syncing]:
        source = Syncing()
        server = WebhookServer(
            host="127.0.0.1",
            port=0,
            cert_dir=tmp_path,
            settings=AdmissionSettings(),
            machine_sets=source,
            routes=routes,
        )
        await server.start()
        started.append(server)
        return server, source

    yield run, client_context(ca)
    for server in started:
        await server.stop()


async def _readyz(server: WebhookServer, context: ssl.SSLContext) -> int:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.get(f"https://127.0.0.1:{server.port}/readyz") as response,
    ):
        return response.status


async def test_the_shoots_process_never_watches_and_is_ready_without_the_caches(
    serve: tuple[Serve, ssl.SSLContext],
) -> None:
    run, context = serve
    server, source = await run("shoots")
    assert source.starts == 0
    assert await _readyz(server, context) == 200


@pytest.mark.parametrize("routes", ["seed", "all"])
async def test_a_process_serving_the_guard_watches_and_is_ready_once_synced(
    serve: tuple[Serve, ssl.SSLContext], routes: Routes
) -> None:
    run, context = serve
    server, source = await run(routes)
    assert source.starts == 1
    assert await _readyz(server, context) == 503
    source.done = True
    assert await _readyz(server, context) == 200
