"""An API server that never answers, for what must not wait on one forever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from kubernetes.aio import client


@dataclass
class SilentServer:
    api: client.ApiClient  # a client of it
    connections: list[asyncio.StreamWriter] = field(default_factory=list)  # accepted so far


@contextlib.asynccontextmanager
async def silent_api_server() -> AsyncIterator[SilentServer]:
    """An endpoint on 127.0.0.1 that accepts connections and never answers: an API server that hangs."""
    connections: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
            yield SilentServer(api=api, connections=connections)
    finally:
        for writer in connections:
            writer.close()
        server.close()
