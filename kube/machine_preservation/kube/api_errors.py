"""What an answer of the Kubernetes API means, decided in one place for every component: each status the
controller, the webhook or the certificates manager tells apart has a meaning here, everything else is OTHER
(kopf's `check_response` does the same), and `NO_ANSWER` is what a request raises when there was no answer."""

from __future__ import annotations

import enum
import json
from typing import Any, Final

import aiohttp
from kubernetes.aio.client.exceptions import ApiException


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


# What a request raises when the API server gave no answer: it is unreachable, dropped the connection or did
# not answer in time. A retry may succeed; nothing was decided about the request.
NO_ANSWER: Final = (TimeoutError, aiohttp.ClientError, OSError)


async def read_json(response: Any, *, absent: frozenset[ApiError] = frozenset({ApiError.NOT_FOUND})) -> Any:
    """The JSON body of a raw answer (a `*_without_preload_content` call's response); None where its status means
    one of `absent`; any other failure raises the ApiException the typed client would have."""
    if classify(response.status) in absent:
        await response.read()
        return None
    await ensure_ok(response)
    return json.loads(await response.read())


async def ensure_ok(response: Any) -> None:
    """Raise the ApiException the typed client would have unless a raw answer's status is 200."""
    if response.status != 200:
        body = await response.read()
        raise ApiException(status=response.status, reason=response.reason, body=body.decode(errors="replace"))
