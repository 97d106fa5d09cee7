"""What can go wrong, as kubectl says it: one error type carrying its message and its exit code, and the
mapping from an API answer (its status and Status message) to that error. Pure: the shell makes the requests.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Final


class ExitCode(IntEnum):
    """The plugin's exit codes (documented in `--help` and docs/operations.md)."""

    OK = 0
    ERROR = 1  # anything else: the server unreachable, a kubeconfig that does not load, a server error
    USAGE = 2  # a bad command line (argparse's own code)
    NOT_FOUND = 3  # no such node (or namespace, or Machines API)
    FORBIDDEN = 4  # not logged in, or no right to the verb on the resource
    NOT_INSTALLED = 5  # machine-preservation is not installed in this cluster
    DENIED = 6  # the admission chain (our webhook, or the API server's policy) refused the change
    NOT_MCM_MANAGED = 7  # the node is not a node of an MCM-managed pool


EXIT_CODES_HELP: Final = "\n".join(
    [
        "exit codes:",
        "  0  ok",
        "  1  error (server unreachable, kubeconfig, server error)",
        "  2  usage",
        "  3  not found (node, namespace, Machines API)",
        "  4  forbidden or unauthorized",
        "  5  machine-preservation not installed in the cluster",
        "  6  denied by admission (the webhook's or the policy's message is shown)",
        "  7  not a node of an MCM-managed pool",
    ]
)

# An API server's message is shown verbatim up to this many characters (a webhook's denial is a few hundred).
MESSAGE_LIMIT: Final = 2000


class PluginError(Exception):
    """An outcome that ends the command: `message` for stderr (after `error: `), `code` for the exit status."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def status_message(body: bytes) -> str:
    """The `message` of a Status answer, else the body's text; cut to MESSAGE_LIMIT."""
    text = body.decode(errors="replace")
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("message"), str):
        text = document["message"]
    return cut(text.strip(), MESSAGE_LIMIT)


def cut(text: str, limit: int) -> str:
    """`text`, at most `limit` characters: a longer one ends in `…` (shoot owners write Nodes: any size)."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def described(resource: str, name: str | None, namespace: str | None) -> str:
    """How kubectl names the object or collection: `nodes "n1"`, `configmaps "x" in namespace "kube-system"`."""
    what = f'{resource} "{name}"' if name else resource
    return f'{what} in namespace "{namespace}"' if namespace else what


def answer_error(
    status: int, body: bytes, *, verb: str, resource: str, name: str | None = None, namespace: str | None = None
) -> PluginError:
    """The error an answer that is not a success means, for the request `verb resource [name] [in namespace]`."""
    what = described(resource, name, namespace)
    message = status_message(body)
    if status == 401:
        return PluginError("you must be logged in to the server (Unauthorized)", ExitCode.FORBIDDEN)
    if status == 403:
        return PluginError(f"you may not {verb} {what}: {message}", ExitCode.FORBIDDEN)
    if status == 404:
        return PluginError(f"{what} not found", ExitCode.NOT_FOUND)
    return PluginError(f"{verb} {what}: the server answered {status}: {message}", ExitCode.ERROR)


def denial(body: bytes) -> PluginError:
    """The admission chain's refusal of a change, its message verbatim."""
    return PluginError(f"the change was denied: {status_message(body)}", ExitCode.DENIED)
