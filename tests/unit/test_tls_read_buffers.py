"""The command's small TLS read buffers: large bodies still arrive whole, both ways, over a real TLS connection
on 127.0.0.1 (the webhook reads 66 KB reviews, the controller multi-MB list pages)."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import datetime as dt
import hashlib
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from machine_preservation.certs.authority import generate_ca, issue_serving_cert
from machine_preservation.cli.main import TLS_READ_BUFFER, limit_tls_read_buffers
from tests.certificates import install

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def small_buffers() -> Iterator[None]:
    before = asyncio.sslproto.SSLProtocol.max_size
    limit_tls_read_buffers()
    yield
    asyncio.sslproto.SSLProtocol.max_size = before


@pytest.mark.parametrize("size", [1, TLS_READ_BUFFER - 1, TLS_READ_BUFFER + 1, 5 * 1024 * 1024])
async def test_bodies_larger_than_the_buffer_arrive_whole(small_buffers: None, tmp_path: Path, size: int) -> None:
    ca = generate_ca(common_name="ca", now=NOW, valid_for=dt.timedelta(days=1))
    pair = issue_serving_cert(
        ca=ca, dns_names=("localhost",), ip_addresses=("127.0.0.1",), now=NOW, valid_for=dt.timedelta(days=1)
    )
    install(tmp_path, pair)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    body = os.urandom(size)

    async def digest_and_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = await reader.readexactly(size)
        writer.write(hashlib.sha256(received).digest() + received)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(digest_and_echo, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        client_context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
        assert writer.transport.get_extra_info("ssl_object") is not None
        writer.write(body)
        await writer.drain()
        digest, echoed = await asyncio.wait_for(reader.readexactly(32), 30), await reader.readexactly(size)
        writer.close()
        assert digest == hashlib.sha256(body).digest(), "the server read the body whole"
        assert echoed == body, "the client read it back whole"
    finally:
        server.close()
        await server.wait_closed()
