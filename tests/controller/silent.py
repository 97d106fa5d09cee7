"""An API server that never answers, for what must not wait on one forever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from kubernetes.aio import client

from machine_preservation.kube.clients import api_client


@dataclass
class SilentServer:
    api: client.ApiClient  # a client of it
    connections: list[asyncio.StreamWriter] = field(default_factory=list)  # accepted so far


@contextlib.asynccontextmanager
async def silent_api_server(trace_configs: list[aiohttp.TraceConfig] | None = None) -> AsyncIterator[SilentServer]:
    """An endpoint on 127.0.0.1 that accepts connections and never answers: an API server that hangs. Its client
    is made as the product makes one, with `trace_configs`."""
    connections: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with api_client(
            client.Configuration(host=f"http://127.0.0.1:{port}"), trace_configs=trace_configs
        ) as api:
            yield SilentServer(api=api, connections=connections)
    finally:
        for writer in connections:
            writer.close()
        server.close()
