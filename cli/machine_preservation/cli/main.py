"""The `machine-preservation` command line: one console script, one subcommand per component.

Each component registers its own subcommand (a `register(subcommands)` function next to its code); the chosen
subcommand's handler returns the process exit code. The development tools (the local cluster, the playground)
have command lines of their own (`python -m machine_preservation.localcluster`, `... .playground`), so the
image's entry point knows nothing of them.
"""

from __future__ import annotations

import argparse
import asyncio.sslproto
import logging
import sys
from collections.abc import Callable, Sequence

from machine_preservation.certs import commands as certs_commands
from machine_preservation.controller import commands as controller_commands
from machine_preservation.webhook import commands as webhook_commands

Handler = Callable[[argparse.Namespace], int]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# asyncio gives every TLS connection a 256 KiB read buffer (`SSLProtocol.max_size`), ~290 KiB with OpenSSL's
# own state. The extension holds a few connections per shoot (its Nodes watch, requests) and the webhook one per
# API server connection kept alive: with 200 shoots that alone is hundreds of MiB. A TLS record is at most 16 KiB,
# so 32 KiB still takes two records per read; measured ~66 KiB per connection (BENCHMARKS.md).
TLS_READ_BUFFER = 32 * 1024


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="machine-preservation",
        description="Preserve failed MCM machines for analysis: admission webhook, controller, certificates.",
    )
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in (certs_commands.register, webhook_commands.register, controller_commands.register):
        register(subcommands)
    return parser


def limit_tls_read_buffers(size: int = TLS_READ_BUFFER) -> None:
    """Every TLS connection the process opens or accepts from now on reads into a buffer of `size` bytes."""
    asyncio.sslproto.SSLProtocol.max_size = size


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    limit_tls_read_buffers()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler = args.handler
    sys.exit(handler(args))
