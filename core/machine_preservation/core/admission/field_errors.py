"""Kubernetes field errors (k8s.io/apimachinery/pkg/util/validation/field), rendered the same way.

`spec.provider.workers[1].machineControllerManager.autoPreserveFailedMachineMax: Invalid value: 5: must be
less than or equal to maximum (4)`: path, error type, the bad value (ints unquoted, strings quoted; omitted for
Required and Forbidden), detail. Several errors aggregate to `[first, second]`, duplicates dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

_MAX_RENDERED_VALUE = 80


class ErrorType(StrEnum):
    INVALID = "Invalid value"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    REQUIRED = "Required value"
    DUPLICATE = "Duplicate value"


_VALUE_OMITTED = (ErrorType.FORBIDDEN, ErrorType.REQUIRED)


@dataclass(frozen=True)
class FieldPath:
    """A field path as Kubernetes prints it: `a.b[3].c[some/key]`."""

    text: str

    def child(self, name: str) -> FieldPath:
        return FieldPath(f"{self.text}.{name}" if self.text else name)

    def index(self, position: int) -> FieldPath:
        return FieldPath(f"{self.text}[{position}]")

    def key(self, name: str) -> FieldPath:
        return FieldPath(f"{self.text}[{name}]")

    def __str__(self) -> str:
        return self.text


def root(*names: str) -> FieldPath:
    path = FieldPath("")
    for name in names:
        path = path.child(name)
    return path


def render_value(value: Any) -> str:
    """A bad value as Go's field errors print it (%v for integers and booleans, %q for strings); a float as
    sent, since Go's typed fields never hold one."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # As sent: a JSON `2.0` is not the integer 2 (Python's repr is the shortest text that reads back).
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    except (RecursionError, ValueError):  # absurdly nested, or not JSON after all: say so instead of failing
        return "<unrenderable value>"
    return text if len(text) <= _MAX_RENDERED_VALUE else text[: _MAX_RENDERED_VALUE - 3] + "..."


@dataclass(frozen=True)
class FieldError:
    type: ErrorType
    path: FieldPath
    detail: str
    value: Any = None

    def render(self) -> str:
        body = str(self.type) if self.type in _VALUE_OMITTED else f"{self.type}: {render_value(self.value)}"
        if self.detail:
            body += f": {self.detail}"
        return f"{self.path}: {body}"


def invalid(path: FieldPath, value: Any, detail: str) -> FieldError:
    return FieldError(ErrorType.INVALID, path, detail, value)


def not_supported(path: FieldPath, value: Any, supported: Iterable[str]) -> FieldError:
    listed = ", ".join(render_value(option) for option in supported)
    return FieldError(ErrorType.NOT_SUPPORTED, path, f"supported values: {listed}", value)


def forbidden(path: FieldPath, detail: str) -> FieldError:
    return FieldError(ErrorType.FORBIDDEN, path, detail)


def required(path: FieldPath) -> FieldError:
    return FieldError(ErrorType.REQUIRED, path, "")


def duplicate(path: FieldPath, value: Any) -> FieldError:
    return FieldError(ErrorType.DUPLICATE, path, "", value)


def aggregate(errors: Iterable[FieldError]) -> str:
    """One message for all errors, in order, duplicates dropped (like ErrorList.ToAggregate)."""
    rendered = list(dict.fromkeys(error.render() for error in errors))
    if len(rendered) == 1:
        return rendered[0]
    return "[" + ", ".join(rendered) + "]"
