"""The webhook's memory under idle and slow connections, with and without its connection bounds.

Starts the real `machine-preservation webhook` command on 127.0.0.1 twice: once with its bounds switched off
in effect (timeouts of an hour, no practical connection limit: how it behaved before they existed), once
with its defaults (or the flags given here). Against each it opens N idle TLS connections (handshake done,
nothing sent) and N slow ones (handshake done, half a request head sent, then nothing), and prints the
server's RSS (from /proc) before, with all of them open, and after its header timeout has passed, with the
cost per open connection, how many were open (at the limit, newer ones close older ones), whether a normal
request still got an answer meanwhile, how many were still open after the timeout, and the RSS with a second
wave like the first open (memory of closed connections is reused). Last, against a fresh webhook, the RSS per
kept-alive connection after each sent one ~66 KB Node UPDATE review (what the API server's pool holds between
requests). About a minute and a half with the defaults.

    .venv/bin/python benchmarks/webhook_connections.py                  # 500 idle + 500 slow
    .venv/bin/python benchmarks/webhook_connections.py --connections 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from local_webhook import HOST, announced_port, webhook_command, write_certificates
from machine_preservation.webhook.connections import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS
from webhook_load import ENDPOINT, review_body

HALF_HEAD = b"POST /validate-preserve-annotation HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
UNBOUNDED = ["--header-timeout", "3600", "--idle-timeout", "3600", "--max-connections", "1000000"]
OPEN_CONCURRENCY = 50
MiB = 1024 * 1024

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def start_webhook(cert_dir: Path, flags: list[str]) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(webhook_command(cert_dir, *flags), stderr=subprocess.PIPE, text=True)
    return process, announced_port(process, "webhook")


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) * 1024


async def request_ok(port: int, context: ssl.SSLContext) -> bool:
    """One normal admission request on a new connection: True if answered 200."""
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "benchmark",
                "kind": {"group": "", "version": "v1", "kind": "Node"},
                "resource": {"group": "", "version": "v1", "resource": "nodes"},
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}},
            },
        }
    ).encode()
    head = (
        f"POST /validate-preserve-annotation HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(HOST, port, ssl=context)
            writer.write(head + body)
            status = await reader.readline()
            writer.close()
            return status.startswith(b"HTTP/1.1 200")
    except (OSError, TimeoutError):
        return False


async def open_many(port: int, context: ssl.SSLContext, count: int, first_bytes: bytes) -> list[Stream]:
    """Open `count` TLS connections and send `first_bytes` on each; those the server refused are left out."""
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one() -> Stream | None:
        async with gate:
            try:
                async with asyncio.timeout(10):
                    reader, writer = await asyncio.open_connection(HOST, port, ssl=context)
                    if first_bytes:
                        writer.write(first_bytes)
                        await writer.drain()
            except (OSError, TimeoutError):
                return None
            return reader, writer

    opened = await asyncio.gather(*(one() for _ in range(count)))
    return [stream for stream in opened if stream is not None]


async def still_open(streams: list[Stream]) -> int:
    """How many connections the server has not closed: a read that neither ends nor fails within 0.2 s."""

    async def alive(reader: asyncio.StreamReader) -> bool:
        try:
            async with asyncio.timeout(0.2):
                await reader.read(1)
        except TimeoutError:
            return True
        except OSError:
            return False
        return False

    return sum(await asyncio.gather(*(alive(reader) for reader, _ in streams)))


async def close_all(streams: list[Stream]) -> None:
    for _, writer in streams:
        writer.transport.abort()
    await asyncio.sleep(0.2)


@dataclass
class Result:
    label: str
    offered: int
    before: int
    during: int
    open_during: int
    normal_request: bool
    open_after: int
    after: int
    second_wave: int


async def measure(label: str, flags: list[str], *, connections: int, wait: float, cert_dir: Path) -> Result:
    context = write_certificates(cert_dir)
    process, port = start_webhook(cert_dir, flags)
    try:
        assert await request_ok(port, context), "the webhook does not answer"
        await asyncio.sleep(0.5)
        before = rss_bytes(process.pid)
        streams = await open_many(port, context, connections, b"")
        streams += await open_many(port, context, connections, HALF_HEAD)
        await asyncio.sleep(0.5)
        during = rss_bytes(process.pid)
        open_during = await still_open(streams)  # at the limit, newer connections made older ones close
        normal_request = await request_ok(port, context)
        print(f"  {label}: {open_during} of {2 * connections} open; waiting {wait:g} s", file=sys.stderr)
        await asyncio.sleep(wait)
        open_after = await still_open(streams)
        after = rss_bytes(process.pid)
        # A second wave like the first: memory freed by closed connections is reused, not added to.
        again = await open_many(port, context, connections, b"")
        again += await open_many(port, context, connections, HALF_HEAD)
        await asyncio.sleep(0.5)
        second_wave = rss_bytes(process.pid)
        await close_all(streams + again)
        return Result(
            label, 2 * connections, before, during, open_during, normal_request, open_after, after, second_wave
        )
    finally:
        process.terminate()
        process.wait(timeout=30)


async def kept_alive(count: int, cert_dir: Path) -> tuple[int, float]:
    """RSS per connection of `count` kept-alive connections that each had one review judged: (open, KiB each)."""
    context = write_certificates(cert_dir)
    process, port = start_webhook(cert_dir, UNBOUNDED)
    body = review_body()
    request = (
        f"POST {ENDPOINT} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    try:
        assert await request_ok(port, context), "the webhook does not answer"
        await asyncio.sleep(0.5)
        before = rss_bytes(process.pid)
        streams = await open_many(port, context, count, request)
        answered = await asyncio.gather(*(reader.readuntil(b'"allowed": true') for reader, _ in streams))
        await asyncio.sleep(0.5)
        per = (rss_bytes(process.pid) - before) / len(answered) / 1024
        await close_all(streams)
        return len(answered), per
    finally:
        process.terminate()
        process.wait(timeout=30)


def report(results: list[Result], limit_mib: int) -> None:
    print(
        "| webhook | open / offered | RSS before | RSS with them open | per open connection "
        "| normal request meanwhile | still open after the timeout | RSS then | RSS, second wave open |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        per = (r.during - r.before) / r.open_during / 1024 if r.open_during else 0.0
        print(
            f"| {r.label} | {r.open_during} / {r.offered} | {r.before / MiB:.1f} MiB | {r.during / MiB:.1f} MiB "
            f"| {per:.0f} KiB | {'answered' if r.normal_request else 'refused'} | {r.open_after} "
            f"| {r.after / MiB:.1f} MiB | {r.second_wave / MiB:.1f} MiB |"
        )
    worst = max(max(r.during, r.second_wave) for r in results if r.label.startswith("bounded"))
    verdict = "under" if worst < limit_mib * MiB else "OVER"
    print(f"bounded webhook peak RSS {worst / MiB:.1f} MiB: {verdict} the chart's {limit_mib} MiB memory limit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=500, help="idle connections, and as many slow ones")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT)
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS)
    parser.add_argument("--memory-limit-mib", type=int, default=256, help="the chart's webhook memory limit")
    args = parser.parse_args()
    bounded = ["--header-timeout", str(args.header_timeout), "--max-connections", str(args.max_connections)]
    wait = args.header_timeout + 2
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for label, flags in (
            ("unbounded (before)", UNBOUNDED),
            (f"bounded (max {args.max_connections}, header timeout {args.header_timeout:g} s)", bounded),
        ):
            cert_dir = Path(directory) / label.split()[0]
            cert_dir.mkdir()
            results.append(
                asyncio.run(measure(label, flags, connections=args.connections, wait=wait, cert_dir=cert_dir))
            )
        cert_dir = Path(directory) / "kept-alive"
        cert_dir.mkdir()
        count, per_kept_alive = asyncio.run(kept_alive(args.max_connections, cert_dir))
    report(results, args.memory_limit_mib)
    print(f"kept-alive connections after one ~66 KB review each: {count} open, {per_kept_alive:.0f} KiB per connection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
