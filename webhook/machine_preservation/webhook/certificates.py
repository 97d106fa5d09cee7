"""The serving certificate: loaded from `tls.crt`/`tls.key`, reloaded when the files change.

The listener's TLS context never changes; its SNI callback (which OpenSSL runs for every handshake, with or
without a server name) hands each new connection the most recently loaded context. Changes are found by
polling a hash of the files' content, because mounted Secrets swap symlinks and do not send reliable file
events (kopf does the same). A changed pair that does not load, or is not currently valid, is rejected and the
previous certificate stays in use.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import ssl
from pathlib import Path
from typing import Final

from cryptography import x509

from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.webhook.metrics import WebhookMetrics

logger = logging.getLogger(__name__)

CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CA_FILE: Final = "ca.crt"


# TLS 1.2 suites: ephemeral ECDH key exchange (forward secrecy; no RSA key transport, no finite-field DHE)
# and AEAD ciphers only (no CBC). TLS 1.3 suites are configured apart and are all AEAD with ephemeral keys.
# Go's TLS client (the API server) offers all of these; OpenSSL picks TLS 1.3 whenever the client offers it.
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL"


def server_context() -> ssl.SSLContext:
    """A server context that accepts TLS 1.2 with ECDHE + AEAD suites, and TLS 1.3."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    # Renegotiation (TLS 1.2) lets a client make the server redo expensive handshakes on one connection.
    context.options |= ssl.OP_NO_RENEGOTIATION
    return context


class CertificateStore:
    def __init__(
        self,
        *,
        cert_dir: Path,
        metrics: WebhookMetrics,
        clock: Clock = system_clock,
    ) -> None:
        self.cert_dir = cert_dir
        self._metrics = metrics
        self._clock = clock
        self._digest = b""
        self._current: ssl.SSLContext | None = None
        self.not_after: dt.datetime | None = None
        self.listener_context = server_context()
        self.listener_context.sni_callback = self._select

    def _select(self, connection: ssl.SSLObject, _server_name: str | None, _listener: ssl.SSLContext) -> None:
        if self._current is not None:
            connection.context = self._current

    def ready(self) -> bool:
        """A certificate is loaded and valid now."""
        return self._current is not None and self.not_after is not None and self.not_after > self._clock()

    def reload(self) -> bool:
        """Load the files if their content changed; True when a new certificate is now in use."""
        cert_path, key_path = self.cert_dir / CERT_FILE, self.cert_dir / KEY_FILE
        try:
            cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
        except OSError:
            return False  # not written yet: keep what we have and look again later
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).digest()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            not_after = x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
            if not_after <= self._clock():
                raise ValueError(f"certificate expired at {not_after.isoformat()}")
            context = server_context()
            context.load_cert_chain(cert_path, key_path)
        except (ValueError, ssl.SSLError, OSError) as error:
            self._metrics.certificate_reloads.labels("rejected").inc()
            logger.warning("serving certificate in %s not loaded, keeping the previous one: %s", self.cert_dir, error)
            return False
        self._current, self.not_after = context, not_after
        self._metrics.certificate_reloads.labels("loaded").inc()
        self._metrics.certificate_expiry.set(not_after.timestamp())
        logger.info("serving certificate loaded from %s (valid until %s)", self.cert_dir, not_after.isoformat())
        return True

    async def watch(self, *, interval: float) -> None:
        """Reload whenever the files change; runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.reload()
