"""A loopback TCP proxy the tests can cut and restore, to play an apiserver restart for one client, or slow down
(`delay`: every chunk from the server is passed on that much later)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import yaml

from machine_preservation.localcluster.controlplane import LOOPBACK, free_port


class TcpProxy:
    """Listens on `address`:`port` (default: 127.0.0.1 and a free port), passes on to `upstream`:`upstream_port`."""

    def __init__(
        self, *, upstream_port: int, upstream: str = LOOPBACK, address: str = LOOPBACK, port: int | None = None
    ) -> None:
        self.upstream, self.upstream_port = upstream, upstream_port
        self.address = address
        self.port = port or free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        self.delay = 0.0  # seconds each chunk from the server waits before it is passed on

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.address, self.port)

    async def cut(self) -> None:
        """Stop listening and drop every open connection (what clients see when the apiserver dies)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream, self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers.update({writer, up_writer})

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, answers: bool) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await source.read(65536):
                    if answers and self.delay:
                        await asyncio.sleep(self.delay)
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer, answers=False), pipe(up_reader, writer, answers=True))
        self._writers.difference_update({writer, up_writer})

    def kubeconfig(self, *, source: Path, target: Path) -> Path:
        """A copy of `source` whose server is this proxy."""
        document = yaml.safe_load(source.read_text())
        for entry in document["clusters"]:
            entry["cluster"]["server"] = f"https://{self.address}:{self.port}"
        target.write_text(yaml.safe_dump(document))
        return target
