"""What the listener negotiates, through real handshakes: TLS 1.3 when offered; with TLS 1.2 only ECDHE key
exchange with AEAD ciphers; never CBC, RSA key transport or finite-field DHE, whatever key the certificate
has (ours are ECDSA; a provided certificate may be RSA). TLS 1.1 and below: test_server_tls.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.webhook.test_server_tls import NOW, make_ca, webhook_server


def rsa_pair_files(cert_dir: Path) -> None:
    """A self-signed RSA serving certificate, as an operator might provide one."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (cert_dir / "tls.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (cert_dir / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.fixture(params=["ecdsa", "rsa"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, WebhookServer]]:
    if request.param == "ecdsa":
        install(tmp_path, local_serving_pair(make_ca("tls-policy-ca")))
    else:
        rsa_pair_files(tmp_path)
    async with webhook_server(tmp_path) as running:
        yield request.param, running


def client(*, ciphers: str | None = None, tls12_only: bool = False) -> ssl.SSLContext:
    """A client that offers exactly `ciphers` (TLS 1.2 names); it only looks, it does not verify."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if tls12_only:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers is not None:
        context.set_ciphers(ciphers)
    return context


async def negotiate(port: int, context: ssl.SSLContext) -> tuple[str, str]:
    """(protocol version, cipher) of a completed handshake; raises OSError when there is none."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        version, cipher = ssl_object.version(), ssl_object.cipher()[0]
        assert isinstance(version, str)
        return version, cipher
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_default_client_gets_tls13(server: tuple[str, WebhookServer]) -> None:
    _, running = server
    version, cipher = await negotiate(running.port, client())
    assert version == "TLSv1.3"
    assert cipher in ("TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256")


@pytest.mark.parametrize("cipher", ["AES128-GCM-SHA256", "AES256-GCM-SHA384", "CHACHA20-POLY1305"])
async def test_tls12_with_ecdhe_and_an_aead_cipher_is_accepted(server: tuple[str, WebhookServer], cipher: str) -> None:
    key_type, running = server
    suite = f"ECDHE-{'ECDSA' if key_type == 'ecdsa' else 'RSA'}-{cipher}"
    assert await negotiate(running.port, client(ciphers=suite, tls12_only=True)) == ("TLSv1.2", suite)


# CBC suites (with ECDHE and with RSA key transport), RSA key transport with AEAD, finite-field DHE with AEAD.
REFUSED = {
    "ecdsa": ["ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-AES128-SHA"],
    "rsa": [
        "ECDHE-RSA-AES128-SHA256",
        "ECDHE-RSA-AES256-SHA384",
        "ECDHE-RSA-AES128-SHA",
        "AES128-SHA256",
        "AES128-GCM-SHA256",
        "AES256-GCM-SHA384",
        "DHE-RSA-AES128-GCM-SHA256",
        "DHE-RSA-AES256-SHA256",
    ],
}


async def test_cbc_rsa_key_exchange_and_dhe_suites_are_refused(server: tuple[str, WebhookServer]) -> None:
    key_type, running = server
    for suite in REFUSED[key_type]:
        # @SECLEVEL=0: the client offers the suite even where its own defaults would not. The server ends a
        # failed handshake without an alert, so the client sees a reset or an SSL error.
        with pytest.raises((ConnectionError, ssl.SSLError)):
            await negotiate(running.port, client(ciphers=f"{suite}:@SECLEVEL=0", tls12_only=True))
    failed = running.metrics.registry.get_sample_value(
        "machine_preservation_webhook_connections_dropped_total", {"listener": "all", "reason": "tls_handshake"}
    )
    assert failed == len(REFUSED[key_type])
    # The same client offering one good suite too gets it: the refusal is about the suites, not the client.
    good = "ECDHE-ECDSA-AES128-GCM-SHA256" if key_type == "ecdsa" else "ECDHE-RSA-AES128-GCM-SHA256"
    offered = ":".join([*REFUSED[key_type], good, "@SECLEVEL=0"])
    assert await negotiate(running.port, client(ciphers=offered, tls12_only=True)) == ("TLSv1.2", good)
