"""The `machine-preservation` command line: one console script, one subcommand per job.

Each component registers its own subcommand (a `register(subcommands)` function next to its code);
the chosen subcommand's handler returns the process exit code.

The development tools (the local control plane, the playground) are left out of the production image, so
their subcommands are registered only when their packages are there.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

Handler = Callable[[argparse.Namespace], int]
Registrar = Callable[["argparse._SubParsersAction[Any]"], None]

# What the image ships: always registered, an import error here is a real error.
PRODUCTION_COMMANDS = (
    "machine_preservation.certs.commands",
    "machine_preservation.webhook.commands",
    "machine_preservation.controller.commands",
)
# Development tools, absent from the image.
DEVELOPMENT_COMMANDS = (
    "machine_preservation.cluster.commands",
    "machine_preservation.playground.commands",
)
# Packages the image leaves out.
DEVELOPMENT_PACKAGES = (
    "machine_preservation.cluster",
    "machine_preservation.playground",
)
# The order subcommands are listed in.
COMMAND_ORDER = (DEVELOPMENT_COMMANDS[0], *PRODUCTION_COMMANDS, DEVELOPMENT_COMMANDS[1])


def _is_left_out(error: ModuleNotFoundError) -> bool:
    """The missing module is one of the development packages (not a dependency missing inside one)."""
    missing = error.name or ""
    return any(missing == package or missing.startswith(package + ".") for package in DEVELOPMENT_PACKAGES)


def registrars() -> list[Registrar]:
    found: list[Registrar] = []
    for module_name in COMMAND_ORDER:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if module_name in DEVELOPMENT_COMMANDS and _is_left_out(error):
                continue
            raise
        register: Registrar = module.register
        found.append(register)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="machine-preservation",
        description="Preserve failed MCM machines for analysis: admission webhook, controller, local tools.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in registrars():
        register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler = args.handler
    sys.exit(handler(args))
