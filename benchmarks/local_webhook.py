"""What the webhook benchmarks share: a server on loopback, its certificates, and the port it announces."""

from __future__ import annotations

import datetime as dt
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path

from machine_preservation.certs.authority import generate_ca, issue_serving_cert

HOST = "127.0.0.1"


def write_certificates(directory: Path) -> ssl.SSLContext:
    """A serving pair for localhost and 127.0.0.1 in `directory`; returns a client context trusting its CA."""
    now = dt.datetime.now(dt.UTC)
    ca = generate_ca(common_name="benchmark-ca", now=now, valid_for=dt.timedelta(hours=1))
    pair = issue_serving_cert(
        ca=ca, dns_names=("localhost",), ip_addresses=(HOST,), now=now, valid_for=dt.timedelta(hours=1)
    )
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    return ssl.create_default_context(cadata=ca.cert_pem.decode())


def webhook_command(cert_dir: Path, *flags: str) -> list[str]:
    """The `machine-preservation webhook` command on loopback, on a free port it reports at INFO."""
    command = [sys.executable, "-m", "machine_preservation.cli", "--log-level", "INFO", "webhook"]
    return [*command, "--host", HOST, "--port", "0", "--cert-dir", str(cert_dir), *flags]


def announced_port(process: subprocess.Popen[str], name: str) -> int:
    """The port `process` reports serving on (on stderr) within a minute; it is killed if it does not."""
    assert process.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if match := re.search(r"serving on https://127\.0\.0\.1:(\d+)", line):
            return int(match.group(1))
        if not line and process.poll() is not None:
            break
    process.kill()
    raise RuntimeError(f"{name} did not start")
