"""The API clients look nothing up in the environment per request: the proxy the environment names for the API
server is resolved once, when the client is made (by urllib's rules), and ~/.netrc is never read. Each test
serves the API on 127.0.0.1 with aiohttp and looks at what arrives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes.aio import client

from machine_preservation.kube.clients import Proxy, api_client, environment_proxy
from tests.polling import eventually_async

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("variables", "server", "expected"),
    [
        ({}, "https://api.example:443", None),
        ({"https_proxy": "http://proxy.corp:3128"}, "https://api.example", Proxy("http://proxy.corp:3128", {})),
        ({"HTTPS_PROXY": "http://proxy.corp:3128"}, "https://api.example", Proxy("http://proxy.corp:3128", {})),
        ({"http_proxy": "http://proxy.corp:3128"}, "https://api.example", None),  # another scheme's proxy
        ({"https_proxy": "http://p:1", "no_proxy": "api.example"}, "https://api.example:6443", None),
        ({"https_proxy": "http://p:1", "no_proxy": ".example"}, "https://api.example", None),
        ({"https_proxy": "http://p:1", "no_proxy": "*"}, "https://api.example", None),
        ({"https_proxy": "http://p:1", "no_proxy": "other.example"}, "https://api.example", Proxy("http://p:1", {})),
        (
            {"https_proxy": "http://user:secret@proxy.corp:3128"},
            "https://api.example",
            Proxy("http://proxy.corp:3128", {"Proxy-Authorization": "Basic dXNlcjpzZWNyZXQ="}),
        ),
        (  # percent-encoded credentials are sent decoded: "us@r" and "p:ss"
            {"https_proxy": "http://us%40r:p%3Ass@proxy.corp:3128/"},
            "https://api.example",
            Proxy("http://proxy.corp:3128/", {"Proxy-Authorization": "Basic dXNAcjpwOnNz"}),
        ),
    ],
)
def test_the_environments_proxy_for_a_server(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], server: str, expected: Proxy | None
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(server) == expected


EMPTY_NODE_LIST = {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": []}


@contextlib.asynccontextmanager
async def serving(answer: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """A server on 127.0.0.1 answering every request with `answer`; its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def seen() -> AsyncIterator[tuple[str, list[web.Request]]]:
    """A server on 127.0.0.1 that answers every request with an empty NodeList and keeps the requests."""
    requests: list[web.Request] = []

    async def answer(request: web.Request) -> web.Response:
        requests.append(request)
        return web.json_response(EMPTY_NODE_LIST)

    async with serving(answer) as server:
        yield server, requests


async def list_nodes(host: str) -> None:
    api = api_client(client.Configuration(host=host))
    try:
        await client.CoreV1Api(api).list_node()
    finally:
        await api.close()


async def test_netrc_is_never_read(
    seen: tuple[str, list[web.Request]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, requests = seen
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    await list_nodes(server)
    assert [r.path for r in requests] == ["/api/v1/nodes"]
    assert "Authorization" not in requests[0].headers  # aiohttp's trust_env would send the netrc's Basic auth


async def test_the_proxy_is_the_one_named_when_the_client_was_made(
    seen: tuple[str, list[web.Request]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, through_proxy = seen
    monkeypatch.setenv("http_proxy", proxy)
    api = api_client(client.Configuration(host="http://api.invalid:6443"))
    monkeypatch.delenv("http_proxy")  # read once: a later change of the environment is not looked up
    try:
        await client.CoreV1Api(api).list_node()
    finally:
        await api.close()
    assert [str(r.url) for r in through_proxy] == ["http://api.invalid:6443/api/v1/nodes"]


async def test_no_proxy_sends_the_request_straight_to_the_server(
    seen: tuple[str, list[web.Request]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, requests = seen
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    await list_nodes(server)
    assert [r.path for r in requests] == ["/api/v1/nodes"]


@pytest.mark.parametrize(("max_idle", "left_open"), [(2, 2), (None, 10)])
async def test_a_burst_leaves_at_most_max_idle_connections_open(max_idle: int | None, left_open: int) -> None:
    """A shoot's drain (10 evictions at once) must not leave its connections open (SHOOT_IDLE_CONNECTIONS); every
    other client keeps aiohttp's pool, which holds them for its keep-alive."""
    transports: list[asyncio.BaseTransport] = []
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.Response:
        if request.transport is not None and request.transport not in transports:
            transports.append(request.transport)
        await release.wait()  # all 10 in flight at once: 10 connections
        return web.json_response(EMPTY_NODE_LIST)

    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(serving(answer))
        api = api_client(client.Configuration(host=server), max_idle=max_idle)
        stack.push_async_callback(api.close)
        burst = asyncio.gather(*(client.CoreV1Api(api).list_node() for _ in range(10)))
        await eventually_async(lambda: len(transports) == 10, limit=5, interval=0.01)
        release.set()
        await burst
        await eventually_async(lambda: sum(not t.is_closing() for t in transports) == left_open, limit=5, interval=0.01)
        await asyncio.sleep(0.2)  # and no more close
        assert sum(not t.is_closing() for t in transports) == left_open
