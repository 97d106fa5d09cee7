"""The HTTPS server: TLS 1.2+, readiness tied to a valid certificate, reload without restart."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from machine_preservation.certs.authority import KeyPair, generate_ca
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.polling import eventually_async
from tests.webhook.conftest import StaticMachineSets
from tests.webhook.reviews import NODE_KIND, node, review

NOW = dt.datetime.now(dt.UTC)


def make_ca(name: str) -> KeyPair:
    return generate_ca(common_name=name, now=NOW, valid_for=dt.timedelta(days=1))


def client_context(ca: KeyPair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.cert_pem.decode())


async def served_serial(port: int) -> int:
    """The serial number of the certificate a new connection is served (no verification: we only look)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def ca() -> KeyPair:
    return make_ca("test-ca-1")


def webhook_server(cert_dir: Path) -> WebhookServer:
    """The server on an ephemeral loopback port, polling `cert_dir` quickly."""
    return WebhookServer(
        host="127.0.0.1",
        port=0,
        cert_dir=cert_dir,
        settings=AdmissionSettings(),
        machine_sets=StaticMachineSets(),
        cert_poll_interval=0.05,
    )


@pytest.fixture
async def server(tmp_path: Path, ca: KeyPair) -> AsyncIterator[WebhookServer]:
    install(tmp_path, local_serving_pair(ca))
    async with webhook_server(tmp_path) as running:
        yield running


async def get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, force_close=True)) as session,
        session.get(f"https://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_serves_reviews_over_verified_tls(server: WebhookServer, ca: KeyPair) -> None:
    body = review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={"node.machine.sapcloud.io/preserve": "x"}))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca))) as session,
        session.post(f"https://127.0.0.1:{server.port}/validate-preserve-annotation", json=body) as response,
    ):
        assert response.status == 200
        assert (await response.json())["response"]["allowed"] is False
    assert await get(server.port, "/readyz", client_context(ca)) == (200, "ok")
    assert server.port > 0


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls_below_1_2_is_refused_and_1_2_accepted(server: WebhookServer, ca: KeyPair) -> None:
    old = client_context(ca)
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer TLS 1.1 so that the server is what refuses
    with pytest.raises(aiohttp.ClientConnectorError):
        await get(server.port, "/healthz", old)
    exact = client_context(ca)
    exact.maximum_version = ssl.TLSVersion.TLSv1_2
    assert await get(server.port, "/healthz", exact) == (200, "ok")


async def test_the_expiry_is_exported(server: WebhookServer) -> None:
    assert server.certificates.not_after is not None
    exported = server.metrics.registry.get_sample_value(
        "machine_preservation_webhook_certificate_expiry_timestamp_seconds"
    )
    assert exported == server.certificates.not_after.timestamp()


async def test_a_changed_certificate_is_served_to_new_connections_without_restart(
    server: WebhookServer, ca: KeyPair, tmp_path: Path
) -> None:
    first = await served_serial(server.port)
    other_ca = make_ca("test-ca-2")
    replacement = local_serving_pair(other_ca, valid_for=dt.timedelta(hours=3))
    install(tmp_path, replacement)

    async def changed() -> bool:
        return await served_serial(server.port) != first

    await eventually_async(changed)
    assert await served_serial(server.port) == replacement.certificate.serial_number
    assert await get(server.port, "/readyz", client_context(other_ca)) == (200, "ok")
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await get(server.port, "/readyz", client_context(ca))
    exported = server.metrics.registry.get_sample_value(
        "machine_preservation_webhook_certificate_expiry_timestamp_seconds"
    )
    assert exported == replacement.certificate.not_valid_after_utc.timestamp()


@pytest.mark.parametrize("broken", ["garbage", "expired", "mismatched key"])
async def test_a_broken_replacement_is_rejected_and_the_old_one_kept(
    server: WebhookServer, ca: KeyPair, tmp_path: Path, broken: str
) -> None:
    first = await served_serial(server.port)
    if broken == "garbage":
        (tmp_path / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    elif broken == "expired":
        install(tmp_path, local_serving_pair(ca, now=NOW - dt.timedelta(hours=5), valid_for=dt.timedelta(hours=1)))
    else:
        (tmp_path / "tls.key").write_bytes(local_serving_pair(ca).key_pem)

    async def rejected() -> bool:
        value = server.metrics.registry.get_sample_value(
            "machine_preservation_webhook_certificate_reloads_total", {"result": "rejected"}
        )
        return bool(value)

    await eventually_async(rejected)
    assert await served_serial(server.port) == first
    assert server.certificates.ready()
    assert await get(server.port, "/readyz", client_context(ca)) == (200, "ok")


async def test_without_a_certificate_it_is_not_ready_until_one_appears(tmp_path: Path, ca: KeyPair) -> None:
    async with webhook_server(tmp_path) as running:
        assert not running.certificates.ready()
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(running.port, "/readyz", client_context(ca))
        install(tmp_path, local_serving_pair(ca))

        async def ready() -> bool:
            return running.certificates.ready()

        await eventually_async(ready)
        assert await get(running.port, "/readyz", client_context(ca)) == (200, "ok")
