"""Kubernetes field errors (k8s.io/apimachinery/pkg/util/validation/field), rendered the same way.

`spec.provider.workers[1].machineControllerManager.autoPreserveFailedMachineMax: Invalid value: 5: must be
less than or equal to maximum (4)`: path, error type, the bad value (ints unquoted, strings quoted; omitted for
Required, Forbidden and Too long), detail. Several errors aggregate to `[first, second]`, duplicates dropped.

Bounded, whatever the input (anyone who may write a Shoot can send a megabyte): a string value is quoted up to
about 80 characters and then cut (`"abc..."...`), a structure likewise; an aggregate names at most 10 errors and
counts the rest (`[first, ..., tenth, ... and 290 more errors]`), and it stays within 2 KiB (MAX_MESSAGE_BYTES:
fewer errors named, the first one cut if it alone is longer). `shorten` bounds any other text the same way (logged
denials, the Extension's `lastError`).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from enum import StrEnum
from itertools import compress
from typing import Any, Final

_MAX_RENDERED_VALUE = 80
# A structure whose JSON is at most this long (judged on a lower bound) is encoded whole, then cut.
_ENCODED_WHOLE: Final = 1024
# An aggregate names this many errors at most and counts the rest.
MAX_ERRORS: Final = 10
# The most a message may take (UTF-8): a denial, a logged denial, the Extension's `lastError`.
MAX_MESSAGE_BYTES: Final = 2048
_CUT: Final = "...[truncated]"


class ErrorType(StrEnum):
    INVALID = "Invalid value"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    REQUIRED = "Required value"
    DUPLICATE = "Duplicate value"
    TOO_LONG = "Too long"
    TOO_MANY = "Too many"
    # Not Kubernetes': errors found but not built (see `more_errors`).
    MORE = "more errors"


_VALUE_OMITTED = (ErrorType.FORBIDDEN, ErrorType.REQUIRED, ErrorType.TOO_LONG)


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
    sent, since Go's typed fields never hold one. A long string shows its first characters quoted, then `...`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        digits = str(value)  # JSON decoding allows 4,300 digits
        return digits if len(digits) <= _MAX_RENDERED_VALUE else digits[: _MAX_RENDERED_VALUE - 3] + "..."
    if isinstance(value, float):
        # As sent: a JSON `2.0` is not the integer 2 (Python's repr is the shortest text that reads back).
        return repr(value)
    if isinstance(value, str):
        if len(value) <= _MAX_RENDERED_VALUE:
            return json.dumps(value, ensure_ascii=False)
        # Cut before quoting (a megabyte is not encoded to be thrown away); the quoted part reads back as a prefix.
        return json.dumps(value[: _MAX_RENDERED_VALUE - 5], ensure_ascii=False) + "..."
    try:
        if compact_json_exceeds(value, _ENCODED_WHOLE):
            text = json_prefix(value, _MAX_RENDERED_VALUE)
        else:  # small: the C encoder is quicker than writing it piece by piece
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    except (RecursionError, TypeError, ValueError):  # not JSON after all: say so instead of failing
        return "<unrenderable value>"
    return text if len(text) <= _MAX_RENDERED_VALUE else text[: _MAX_RENDERED_VALUE - 3] + "..."


# What the size walk looks into; any other value (a number, a bool, null) is one byte, counted with its container.
_WALKED: Final = frozenset({str, dict, list, tuple})


def _walked(values: Iterable[Any]) -> Iterator[Any]:
    """The strings and containers of `values`, picked without a Python-level loop (the walk's cost per scalar)."""
    values = list(values)
    return compress(values, map(_WALKED.__contains__, map(type, values)))


def compact_json_exceeds(value: Any, limit: int) -> bool:
    """Whether `value`'s compact JSON (`separators=(",", ":")`, UTF-8) is longer than `limit` bytes, judged on a
    lower bound of that length: a character counts one byte, a number, `true`, `false` or `null` one. It is added
    up only until it passes `limit`, so the work is bounded by `limit`, not by `value`: a container's brackets,
    separators and one byte per value are counted before its entries are looked at, and only its strings and
    containers are looked at then (each adding what it takes beyond the byte already counted)."""
    size = 1  # the value's first byte, as if counted by a container
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 1  # and the quotes
        elif isinstance(item, (dict, Mapping)):  # dict first: no ABC check for the usual case
            # `{}`, per entry `"":` and one byte of its value, the commas; then the keys.
            size += 1 + max(5 * len(item) - 1, 0)
            if size > limit:
                return True
            with suppress(TypeError):  # not JSON after all (a key without a length): at least what is counted
                size += sum(map(len, item))
            stack.extend(_walked(item.values()))
        elif isinstance(item, (list, tuple)):
            size += 1 + max(2 * len(item) - 1, 0)  # `[]`, one byte per value, the commas
            if size > limit:
                return True
            stack.extend(_walked(item))
        if size > limit:
            return True
    return False


@dataclass(frozen=True)
class _Text:
    """Text the renderer writes as it is (brackets, separators, keys)."""

    text: str


def json_prefix(value: Any, limit: int) -> str:
    """The compact, key-sorted JSON of `value` (as `json.dumps(..., separators=(",", ":"), sort_keys=True,
    default=str)`) written until it is longer than `limit` characters, then no further: a large structure is never
    encoded whole to be cut. At most `limit` + 1 pieces are written, each container begun lists at most `limit` + 4
    (its first items; an object's smallest keys, found in a pass over them), whatever the size of `value`."""
    parts: list[str] = []
    written = 0
    stack: list[Any] = [value]
    while stack and written <= limit:
        item = stack.pop()
        room = limit - written
        if isinstance(item, _Text):
            text = item.text
        elif isinstance(item, str):
            # Cut before quoting: when cut, more than `room` characters are written before the closing quote.
            text = json.dumps(item[: room + 1], ensure_ascii=False)
        elif isinstance(item, dict):
            # The smallest keys that can be written: each entry takes at least 4 characters and a comma.
            keys = heapq.nsmallest(room // 4 + 1, item)
            stack.append(_Text("}"))
            for position, key in reversed(list(enumerate(keys))):
                stack.append(item[key])
                stack.append(_Text(json.dumps(str(key)[: room + 1], ensure_ascii=False) + ":"))
                if position:
                    stack.append(_Text(","))
            text = "{"
        elif isinstance(item, (list, tuple)):
            shown = item[: room // 2 + 1]  # each item takes at least 1 character and a comma
            stack.append(_Text("]"))
            for position in reversed(range(len(shown))):
                stack.append(shown[position])
                if position:
                    stack.append(_Text(","))
            text = "["
        else:
            text = json.dumps(item, ensure_ascii=False, default=str)
        parts.append(text)
        written += len(text)
    return "".join(parts)


@dataclass(frozen=True)
class FieldError:
    type: ErrorType
    path: FieldPath
    detail: str
    value: Any = None

    def render(self) -> str:
        if self.type is ErrorType.MORE:
            return _more(self.value)
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


def too_long(path: FieldPath, limit: int) -> FieldError:
    """Kubernetes' field.TooLong: the value is not shown."""
    return FieldError(ErrorType.TOO_LONG, path, f"may not be more than {limit} bytes")


def too_many(path: FieldPath, count: int, limit: int) -> FieldError:
    """Kubernetes' field.TooMany: the count is shown."""
    return FieldError(ErrorType.TOO_MANY, path, f"must have at most {limit} items", count)


def more_errors(path: FieldPath, count: int) -> FieldError:
    """Stands for `count` further errors under `path` that were found but not built (a decoder reports thousands
    in a bad document of a few KiB): an aggregate counts them with the errors it does not name."""
    return FieldError(ErrorType.MORE, path, "", count)


def shorten(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text` if its UTF-8 takes at most `limit` bytes, else its beginning marked `...[truncated]` within them."""
    if len(text) <= limit // 4:  # no character takes more than 4 bytes: no need to encode
        return text
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[: max(limit - len(_CUT), 0)].decode(errors="ignore") + _CUT


def _more(count: int) -> str:
    return f"... and {count} more error{'' if count == 1 else 's'}"


def aggregate(errors: Iterable[FieldError]) -> str:
    """One message for all errors, in order, duplicates dropped (like ErrorList.ToAggregate), naming at most
    MAX_ERRORS of them within MAX_MESSAGE_BYTES and counting the rest (`... and 3 more errors`), `more_errors`
    included. The first error is always named (cut if it alone is too long)."""
    unique: dict[str, None] = {}
    unbuilt = 0
    for error in errors:
        if error.type is ErrorType.MORE:
            unbuilt += error.value
        else:
            unique[error.render()] = None
    rendered = list(unique)
    if len(rendered) == 1 and not unbuilt:
        return shorten(rendered[0])
    # Room for the brackets and the count of the rest, whatever it is.
    budget = MAX_MESSAGE_BYTES - 2 - len(", " + _more(len(rendered) + unbuilt))
    named: list[str] = []
    used = 0
    for text in rendered[:MAX_ERRORS]:
        size = len(text.encode()) + (2 if named else 0)
        if used + size > budget:
            if named:
                break
            text = shorten(text, budget)
            size = len(text.encode())
        named.append(text)
        used += size
    if len(named) < len(rendered) + unbuilt:
        named.append(_more(len(rendered) + unbuilt - len(named)))
    return "[" + ", ".join(named) + "]"
