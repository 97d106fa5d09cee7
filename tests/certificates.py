"""Certificates for tests that serve TLS on this machine."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from machine_preservation.certs.authority import KeyPair, issue_serving_cert


def local_serving_pair(
    ca: KeyPair, *, now: dt.datetime | None = None, valid_for: dt.timedelta = dt.timedelta(hours=2)
) -> KeyPair:
    """A serving certificate and key for localhost and 127.0.0.1, signed by `ca`, valid from `now`."""
    return issue_serving_cert(
        ca=ca,
        dns_names=("localhost",),
        ip_addresses=("127.0.0.1",),
        now=now or dt.datetime.now(dt.UTC),
        valid_for=valid_for,
    )


def install(cert_dir: Path, pair: KeyPair) -> None:
    """Write `pair` where the webhook server reads its certificate (tls.crt, tls.key)."""
    (cert_dir / "tls.key").write_bytes(pair.key_pem)
    (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
