"""What an answer of the Kubernetes API means, decided in one place for every component: each status the
controller, the webhook or the certificates manager tells apart has a meaning here, everything else is OTHER
(kopf's `check_response` does the same), and `NO_ANSWER` is what a request raises when there was no answer.

A request made `with api_call():` or awaited by `call(...)` (or an answer read by `read_json`, `ensure_ok` or
`ensure_success`) raises the meaning as a type: `NotFound`, `Conflict`, `Gone`, `Invalid`, `TooManyRequests`,
`Forbidden`, `Unavailable`, any other status as `Failed` (their base), and `NoAnswer`; callers catch meanings, not
status codes. `Failed` is an `ApiException`, so a handler further up that catches any refusal keeps catching
these."""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

import aiohttp
from kubernetes.aio.client.exceptions import ApiException

T = TypeVar("T")


class ApiError(enum.Enum):
    NOT_FOUND = "not found"  # 404: the object (or its namespace) does not exist
    CONFLICT = "conflict"  # 409: a stale resourceVersion or precondition, or a name already taken
    INVALID = "invalid"  # 422: refused as invalid, which includes a JSON patch whose `test` op failed
    TOO_MANY_REQUESTS = "too many requests"  # 429: e.g. an eviction a PodDisruptionBudget does not allow now
    GONE = "gone"  # 410: a watch's resourceVersion is too old to resume from
    FORBIDDEN = "forbidden"  # 403: no right to it
    OTHER = "other"


_BY_STATUS = {
    403: ApiError.FORBIDDEN,
    404: ApiError.NOT_FOUND,
    409: ApiError.CONFLICT,
    410: ApiError.GONE,
    422: ApiError.INVALID,
    429: ApiError.TOO_MANY_REQUESTS,
}


def classify(status: int | None) -> ApiError:
    """The meaning of an HTTP status of an API answer (an `ApiException`'s or a raw response's) that is not a
    success."""
    return _BY_STATUS.get(status or 0, ApiError.OTHER)


# Answers that are an outcome the caller acts on (the object is gone, the name or version taken, a PDB's "not
# now", a watch to relist): the API did what it does. Every other status of 400 or more says the request failed.
OUTCOMES: Final = frozenset({ApiError.NOT_FOUND, ApiError.CONFLICT, ApiError.TOO_MANY_REQUESTS, ApiError.GONE})


def is_failure(status: int) -> bool:
    """Whether an answer's status says the request failed (refused as bad or invalid, forbidden, unauthorized, a
    server error), as opposed to a success or one of the OUTCOMES."""
    return status >= 400 and classify(status) not in OUTCOMES


class Failed(ApiException):
    """The API server answered a request with a status that is not a success (and none of the meanings below)."""


class NotFound(Failed):
    """404: the object (or its namespace, or its kind) does not exist."""


class Conflict(Failed):
    """409: a stale resourceVersion or precondition, or a name already taken."""


class Gone(Failed):
    """410: a watch's resourceVersion is too old to resume from."""


class Invalid(Failed):
    """422: refused as invalid, which includes a JSON patch whose `test` op failed."""


class TooManyRequests(Failed):
    """429: not now, e.g. an eviction a PodDisruptionBudget does not allow yet."""


class Forbidden(Failed):
    """403: no right to it."""


class Unavailable(Failed):
    """5xx: the API server (or what it forwards to) failed; nothing says the request was refused."""


class NoAnswer(Exception):
    """The API server gave no answer: it is unreachable, dropped the connection or did not answer in time. A retry
    may succeed; nothing was decided about the request."""


_TYPED: Final[dict[ApiError, type[Failed]]] = {
    ApiError.NOT_FOUND: NotFound,
    ApiError.CONFLICT: Conflict,
    ApiError.GONE: Gone,
    ApiError.INVALID: Invalid,
    ApiError.TOO_MANY_REQUESTS: TooManyRequests,
    ApiError.FORBIDDEN: Forbidden,
}


def failed(status: int | None, reason: str | None, body: str | None = None) -> Failed:
    """The typed error of an answer with `status` (not a success)."""
    if 500 <= (status or 0) <= 599:
        kind: type[Failed] = Unavailable
    else:
        kind = _TYPED.get(classify(status), Failed)
    return kind(status=status, reason=reason, body=body)


# What a request raises when the API server gave no answer, untyped (below `api_call`) and typed.
NO_ANSWER: Final = (NoAnswer, TimeoutError, aiohttp.ClientError, OSError)
# Every way a request can fail: an answer that is not a success, or none. A loop that tries again later (leader
# election, an informer, the certificates manager) retries on these; anything else is a bug, not the API's doing.
RETRYABLE: Final = (ApiException, *NO_ANSWER)


@contextlib.contextmanager
def api_call() -> Iterator[None]:
    """Raise what the requests inside fail with as its meaning: a status as `Failed` (or its subtype), no answer
    as `NoAnswer`."""
    try:
        yield
    except Failed:
        raise
    except ApiException as error:
        raise failed(error.status, error.reason, error.body) from error
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        raise NoAnswer(str(error) or type(error).__name__) from error


async def call(request: Awaitable[T]) -> T:
    """What `request` returns; what it fails with raised as its meaning, as `api_call` does."""
    with api_call():
        return await request


async def read_object(
    request: Callable[..., Awaitable[Any]], *args: str, seconds: float | None = None
) -> Mapping[str, Any]:
    """One object as JSON by a `*_without_preload_content` request, bounded by `seconds`; raises its meaning
    (`NotFound`, `NoAnswer`, ...) or ValueError for an answer that is not a JSON object."""
    with api_call():
        document = await read_json(await request(*args, _request_timeout=seconds), absent=frozenset())
    if not isinstance(document, Mapping):
        raise ValueError("the answer is not a JSON object")
    return document


async def read_json(response: Any, *, absent: frozenset[ApiError] = frozenset({ApiError.NOT_FOUND})) -> Any:
    """The JSON body of a raw answer (a `*_without_preload_content` call's response); None where its status means
    one of `absent`; any other failure raises its typed error (`Failed`)."""
    if classify(response.status) in absent:
        await response.read()
        return None
    await ensure_ok(response)
    return json.loads(await response.read())


async def ensure_success(response: Any) -> None:
    """Read a raw answer whose body nobody needs (so that its connection is reused); raise its typed error
    (`Failed`) unless its status is a success (2xx)."""
    body = await response.read()
    if not 200 <= response.status < 300:
        raise failed(response.status, response.reason, body.decode(errors="replace"))


async def ensure_ok(response: Any) -> None:
    """Raise the typed error (`Failed`) of a raw answer unless its status is 200."""
    if response.status != 200:
        body = await response.read()
        raise failed(response.status, response.reason, body.decode(errors="replace"))
