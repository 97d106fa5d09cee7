"""The extension's `providerConfig`: per-pool settings for Gardener versions whose Shoot API has none.

A Shoot enables the extension with an entry of `spec.extensions` of type `machine-preservation` that is not
`disabled: true`; gardenlet copies the entry's `providerConfig` into the seed's `Extension` (`spec.providerConfig`),
and the seed's `Cluster` carries the whole Shoot. The document:

    apiVersion: machine-preservation.extensions.gardener.cloud/v1alpha1
    kind: PreservationConfig
    workers:
    - name: worker1                     # a pool of spec.provider.workers
      autoPreserveFailedMachineMax: 1   # the pool's total, spread over its zones as the Shoot's own field
      machinePreserveTimeout: 72h       # a Go duration

It is decoded strictly, as Gardener decodes an extension's configuration: apiVersion and kind must be these;
unknown fields, wrong types (a max that is not an integer, a timeout that is not a string; worded as for the
worker fields) and a pool named twice are errors, all reported at once as Kubernetes field errors under the
caller's path (`spec.extensions[0].providerConfig...`). An absent or null field is not set. What the values may
be (the timeout a Go duration ≥ 0 within the bound, the max ≥ 0 within the pool's maximum) and whether the pool
exists depend on the Shoot and are judged with the rules of the Shoot's own worker fields: at admission
(admission/shoot.py), and by the controller, which skips an invalid value (pool_settings.py).

Bounded before it is decoded (anyone who may edit a Shoot writes it; the Shoot admission fails closed): a document
whose compact JSON is longer than MAX_DOCUMENT_BYTES (64 KiB) is `Too long`, one with more than MAX_WORKERS (256)
`workers` is `Too many`, and nothing more is judged in it. Gardener sets no limit on a Shoot's worker pools (its
validation bounds their names, 15 characters, not their number), but each entry must name a pool of its own, and
shoots have a few dozen pools at most; 256 entries with the longest names and values take 30 KiB. The size is
judged on a lower bound of the JSON's length (a number counts one byte) that stops as soon as it passes the limit,
so a megabyte costs no more than 64 KiB to judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from machine_preservation.core.admission.field_errors import (
    MAX_ERRORS,
    FieldError,
    FieldPath,
    aggregate,
    compact_json_exceeds,
    duplicate,
    forbidden,
    invalid,
    more_errors,
    not_supported,
    required,
    root,
    too_long,
    too_many,
)
from machine_preservation.core.durations import NOT_A_DURATION_STRING

EXTENSION_TYPE: Final = "machine-preservation"
API_VERSION: Final = "machine-preservation.extensions.gardener.cloud/v1alpha1"
KIND: Final = "PreservationConfig"
EXTENSIONS_PATH: Final = root("spec", "extensions")
# The bounds of a document (see the module).
MAX_DOCUMENT_BYTES: Final = 64 * 1024
MAX_WORKERS: Final = 256
# Decoding errors built into field errors; the rest are counted (an aggregate names MAX_ERRORS at most).
_BUILT_ERRORS: Final = 2 * MAX_ERRORS


class _Strict(BaseModel):
    # Aliases only (the JSON names): `auto_preserve_failed_machine_max` in a document is an unknown field.
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True, strict=True)


class WorkerPreservation(_Strict):
    """One pool's settings; None where the document does not set them."""

    name: str = Field(min_length=1)
    auto_preserve_failed_machine_max: int | None = None
    # A Go duration as written: its syntax and range are judged with the Shoot's rules (see the module).
    machine_preserve_timeout: str | None = None


class PreservationConfig(_Strict):
    api_version: Literal["machine-preservation.extensions.gardener.cloud/v1alpha1"]
    kind: Literal["PreservationConfig"]
    workers: list[WorkerPreservation] = Field(default_factory=list)

    @field_validator("workers", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    def worker(self, pool: str) -> WorkerPreservation | None:
        return next((worker for worker in self.workers if worker.name == pool), None)


class InvalidPreservationConfig(ValueError):
    """The document does not decode; `errors` names every problem by its field path."""

    def __init__(self, errors: tuple[FieldError, ...]) -> None:
        super().__init__()
        self.errors = errors

    def __str__(self) -> str:
        # Rendered when asked for: the Shoot admission aggregates `errors` with its own.
        return aggregate(self.errors)


_CONFIG_FIELDS: Final = tuple(field.alias or name for name, field in PreservationConfig.model_fields.items())
_WORKER_FIELDS: Final = tuple(field.alias or name for name, field in WorkerPreservation.model_fields.items())
_CONFIG_FIELD_SET: Final = frozenset(_CONFIG_FIELDS)
_WORKER_FIELD_SET: Final = frozenset(_WORKER_FIELDS)
# As the Shoot's worker fields say it.
_FIELD_TYPE_DETAILS: Final = {"machinePreserveTimeout": NOT_A_DURATION_STRING}
_TYPE_DETAILS: Final = {
    "int_type": "must be an integer",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
}


def _unknown_field(path: FieldPath, known: tuple[str, ...]) -> FieldError:
    return forbidden(path, f"unknown field (known fields: {', '.join(known)})")


def _field_path(base: FieldPath, loc: tuple[int | str, ...]) -> FieldPath:
    path = base
    for part in loc:
        path = path.index(part) if isinstance(part, int) else path.child(part)
    return path


def _field_error(base: FieldPath, error: ErrorDetails) -> FieldError:
    loc = error["loc"]
    path = _field_path(base, loc)
    kind, value = error["type"], error.get("input")
    if kind == "missing" or kind == "string_too_short":
        return required(path)
    if kind == "extra_forbidden":
        return _unknown_field(path, _WORKER_FIELDS if len(loc) > 1 else _CONFIG_FIELDS)
    if kind == "literal_error":
        return not_supported(path, value, [API_VERSION if loc == ("apiVersion",) else KIND])
    detail = _TYPE_DETAILS.get(kind)
    if detail is not None and loc and loc[-1] in _FIELD_TYPE_DETAILS:
        detail = _FIELD_TYPE_DETAILS[str(loc[-1])]
    return invalid(path, value, detail or error["msg"])


def _duplicates(raw: Any, base: FieldPath) -> list[FieldError]:
    """Every pool named again after its first entry (judged on the raw document, so that these come with the
    other errors)."""
    workers = raw.get("workers") if isinstance(raw, Mapping) else None
    seen: set[str] = set()
    errors: list[FieldError] = []
    for index, worker in enumerate(workers if isinstance(workers, list) else []):
        name = worker.get("name") if isinstance(worker, Mapping) else None
        if isinstance(name, str) and name:
            if name in seen:
                errors.append(duplicate(base.child("workers").index(index).child("name"), name))
            seen.add(name)
    return errors


def _bound_errors(raw: Any, path: FieldPath) -> list[FieldError]:
    """A document too large to be judged (see the module)."""
    errors: list[FieldError] = []
    workers = raw.get("workers") if isinstance(raw, Mapping) else None
    if isinstance(workers, list) and len(workers) > MAX_WORKERS:
        errors.append(too_many(path.child("workers"), len(workers), MAX_WORKERS))
    if compact_json_exceeds(raw, MAX_DOCUMENT_BYTES):
        errors.append(too_long(path, MAX_DOCUMENT_BYTES))
    return errors


def _without_unknown_fields(raw: Any, path: FieldPath) -> tuple[Any, list[FieldError]]:
    """Thousands of unknown fields fit in 64 KiB, and the decoder would build an error for each: when there are more
    than are built, the document without them and their errors (the first ones built, in the document's order, the
    rest counted). Otherwise the document as it is and no errors: the decoder reports them, in its own order."""
    if not isinstance(raw, Mapping):
        return raw, []
    workers = raw.get("workers")
    entries: list[Any] = workers if isinstance(workers, list) else []  # at most MAX_WORKERS
    # Counted with set operations (no loop over the fields themselves).
    total = len(raw.keys() - _CONFIG_FIELD_SET) + sum(
        len(entry.keys() - _WORKER_FIELD_SET) for entry in entries if isinstance(entry, Mapping)
    )
    if total <= _BUILT_ERRORS:
        return raw, []
    errors: list[FieldError] = []
    for key in raw:
        if len(errors) == _BUILT_ERRORS:
            break
        if key not in _CONFIG_FIELD_SET:
            errors.append(_unknown_field(path.child(str(key)), _CONFIG_FIELDS))
    for index, entry in enumerate(entries):
        if len(errors) == _BUILT_ERRORS:
            break
        if isinstance(entry, Mapping):
            unknown = (key for key in entry if key not in _WORKER_FIELD_SET)
            for key in islice(unknown, _BUILT_ERRORS - len(errors)):
                errors.append(_unknown_field(path.child("workers").index(index).child(str(key)), _WORKER_FIELDS))
    errors.append(more_errors(path, total - len(errors)))
    known = {key: raw[key] for key in _CONFIG_FIELDS if key in raw}
    if isinstance(workers, list):
        known["workers"] = [
            {key: entry[key] for key in _WORKER_FIELDS if key in entry} if isinstance(entry, Mapping) else entry
            for entry in entries
        ]
    return known, errors


def parse_preservation_config(raw: Any, *, path: FieldPath) -> PreservationConfig:
    """Decode a `providerConfig` as written (JSON); raises InvalidPreservationConfig with field paths under
    `path`. A document beyond the bounds (see the module) is not decoded: its errors say so, and only that."""
    if bounds := _bound_errors(raw, path):
        raise InvalidPreservationConfig(tuple(bounds))
    known, errors = _without_unknown_fields(raw, path)
    config: PreservationConfig | None = None
    try:
        config = PreservationConfig.model_validate(known)
    except ValidationError as error:
        # Only the first ones are built: a document within the bounds may still hold thousands of bad fields.
        errors += [_field_error(path, details) for details in error.errors(include_url=False)[:_BUILT_ERRORS]]
        if error.error_count() > _BUILT_ERRORS:
            errors.append(more_errors(path, error.error_count() - _BUILT_ERRORS))
    errors += _duplicates(raw, path)
    if errors or config is None:
        raise InvalidPreservationConfig(tuple(errors))
    return config


@dataclass(frozen=True)
class PreservationExtension:
    """The Shoot's enabled entry of this extension in `spec.extensions`."""

    index: int
    provider_config: Any  # as written; None when the entry has none

    @property
    def path(self) -> FieldPath:
        return EXTENSIONS_PATH.index(self.index).child("providerConfig")


def preservation_extension(shoot: Any) -> PreservationExtension | None:
    """The first entry of `spec.extensions` with type `machine-preservation` and not `disabled: true` (Gardener
    allows one entry per type); None when there is none. Parts of the wrong type count as absent."""
    spec = shoot.get("spec") if isinstance(shoot, Mapping) else None
    extensions = spec.get("extensions") if isinstance(spec, Mapping) else None
    for index, extension in enumerate(extensions if isinstance(extensions, list) else []):
        if (
            isinstance(extension, Mapping)
            and extension.get("type") == EXTENSION_TYPE
            and extension.get("disabled") is not True
        ):
            return PreservationExtension(index=index, provider_config=extension.get("providerConfig"))
    return None
