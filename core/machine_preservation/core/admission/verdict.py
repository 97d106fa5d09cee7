"""The outcome of one admission decision, independent of the wire format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PatchOperation:
    """One RFC 6902 operation; `path` is an RFC 6901 pointer, already escaped."""

    op: str
    path: str
    value: Any = None

    def as_json(self) -> dict[str, Any]:
        if self.op == "remove":
            return {"op": self.op, "path": self.path}
        return {"op": self.op, "path": self.path, "value": self.value}


@dataclass(frozen=True)
class Verdict:
    """Allowed (possibly with a patch and warnings) or denied with a status code, reason and message."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[PatchOperation, ...] = ()


def allow(*, warnings: tuple[str, ...] = (), patch: tuple[PatchOperation, ...] = ()) -> Verdict:
    return Verdict(allowed=True, warnings=warnings, patch=patch)


def deny(message: str, *, warnings: tuple[str, ...] = (), code: int = 403, reason: str = "Forbidden") -> Verdict:
    return Verdict(allowed=False, message=message, code=code, reason=reason, warnings=warnings)


def escape_pointer_token(token: str) -> str:
    """RFC 6901: `~` becomes `~0`, then `/` becomes `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def describe(kind: str, name: str, generate_name: str = "") -> str:
    """`Node "n1"`; an object still to be named by the server shows its generateName prefix."""
    shown = name or (f"{generate_name}<generated>" if generate_name else "<unnamed>")
    return f'{kind} "{shown}"'
