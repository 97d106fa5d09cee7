"""The `machine-preservation` command line: one console script, one subcommand per job.

Each component registers its own subcommand (a `register(subcommands)` function next to its code);
the chosen subcommand's handler returns the process exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from machine_preservation.certs import commands as certs_commands
from machine_preservation.cluster import commands as cluster_commands
from machine_preservation.controller import commands as controller_commands
from machine_preservation.playground import commands as playground_commands
from machine_preservation.webhook import commands as webhook_commands

Handler = Callable[[argparse.Namespace], int]
Registrar = Callable[["argparse._SubParsersAction[Any]"], None]

REGISTRARS: list[Registrar] = [
    cluster_commands.register,
    certs_commands.register,
    webhook_commands.register,
    controller_commands.register,
    playground_commands.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="machine-preservation",
        description="Preserve failed MCM machines for analysis: admission webhook, controller, local tools.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in REGISTRARS:
        register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler = args.handler
    sys.exit(handler(args))
