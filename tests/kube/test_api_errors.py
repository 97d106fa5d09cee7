"""The meaning every component gives each status of an API answer, and each way of getting none."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from kubernetes.aio.client.exceptions import ApiException, NotFoundException

from machine_preservation.kube.api_errors import (
    RETRYABLE,
    ApiError,
    Conflict,
    Failed,
    Forbidden,
    Gone,
    Invalid,
    NoAnswer,
    NotFound,
    TooManyRequests,
    Unavailable,
    api_call,
    call,
    classify,
    ensure_ok,
    ensure_success,
    is_failure,
    read_json,
)


@pytest.mark.parametrize(
    ("status", "meaning"),
    [
        (403, ApiError.FORBIDDEN),
        (404, ApiError.NOT_FOUND),
        (409, ApiError.CONFLICT),
        (410, ApiError.GONE),
        (422, ApiError.INVALID),
        (429, ApiError.TOO_MANY_REQUESTS),
        (400, ApiError.OTHER),
        (500, ApiError.OTHER),
        (None, ApiError.OTHER),  # an ApiException raised without a response
    ],
)
def test_each_status_has_one_meaning(status: int | None, meaning: ApiError) -> None:
    assert classify(status) is meaning


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        (200, False),
        (201, False),
        (404, False),  # gone: the caller is done with it
        (409, False),  # taken or stale: the caller retries from fresh state
        (410, False),  # a watch relists
        (429, False),  # a PodDisruptionBudget says "not now"
        (400, True),
        (401, True),
        (403, True),
        (422, True),
        (500, True),
        (503, True),
    ],
)
def test_a_failure_is_an_answer_no_caller_asked_for(status: int, failure: bool) -> None:
    assert is_failure(status) is failure


@pytest.mark.parametrize(
    ("status", "meaning"),
    [
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (410, Gone),
        (422, Invalid),
        (429, TooManyRequests),
        (500, Unavailable),
        (502, Unavailable),
        (503, Unavailable),
        (504, Unavailable),
        (599, Unavailable),
        (400, Failed),
        (401, Failed),
        (405, Failed),
        (413, Failed),
        (0, Failed),  # the library's own "no usable answer" (e.g. a bad parameter)
        (None, Failed),
    ],
)
def test_a_refusal_is_raised_as_its_meaning(status: int | None, meaning: type[Failed]) -> None:
    with pytest.raises(Failed) as raised, api_call():
        raise ApiException(status=status, reason="why", body="details")
    assert type(raised.value) is meaning
    # still an ApiException with what the answer said, for a handler further up that catches any refusal
    assert isinstance(raised.value, ApiException)
    assert (raised.value.status, raised.value.reason, raised.value.body) == (status, "why", "details")


def test_the_librarys_own_subtypes_are_typed_by_their_status() -> None:
    with pytest.raises(NotFound), api_call():
        raise NotFoundException(status=404, reason="Not Found")


def test_a_typed_error_passes_through_unchanged() -> None:
    conflict = Conflict(status=409, reason="taken")
    with pytest.raises(Conflict) as raised, api_call():
        raise conflict
    assert raised.value is conflict


_KEY = ConnectionKey("api", 443, True, None, None, None, None)


@pytest.mark.parametrize(
    "failure",
    [
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientConnectorError(_KEY, OSError(111, "refused")),
        aiohttp.ClientOSError(104, "reset"),
        aiohttp.ClientPayloadError("cut short"),
        aiohttp.ServerTimeoutError(),
        aiohttp.ClientError(),
        TimeoutError(),
        ConnectionResetError(),
        OSError(113, "no route"),
    ],
)
def test_no_answer_is_raised_as_no_answer(failure: Exception) -> None:
    with pytest.raises(NoAnswer) as raised, api_call():
        raise failure
    assert raised.value.__cause__ is failure


@pytest.mark.parametrize("failure", [ValueError("a bug"), KeyError("x"), asyncio.CancelledError()])
def test_anything_else_is_left_alone(failure: BaseException) -> None:
    with pytest.raises(type(failure)) as raised, api_call():
        raise failure
    assert raised.value is failure


@pytest.mark.parametrize(
    "failure",
    [
        NoAnswer("x"),
        aiohttp.ServerDisconnectedError(),
        TimeoutError(),
        OSError(),
        ApiException(status=500),
        Unavailable(status=503),
        Forbidden(status=403),
    ],
)
def test_every_failed_request_is_retryable(failure: Exception) -> None:
    assert isinstance(failure, RETRYABLE)


@pytest.mark.parametrize("failure", [ValueError(), KeyError(), RuntimeError()])
def test_a_bug_is_not_retryable(failure: Exception) -> None:
    assert not isinstance(failure, RETRYABLE)


class _Answer:
    def __init__(self, status: int, body: bytes = b'{"a": 1}') -> None:
        self.status, self.reason, self._body = status, "why", body
        self.was_read = False

    async def read(self) -> bytes:
        self.was_read = True
        return self._body


@pytest.mark.parametrize(
    ("status", "meaning"),
    [
        (403, Forbidden),
        (409, Conflict),
        (410, Gone),
        (422, Invalid),
        (429, TooManyRequests),
        (503, Unavailable),
        (401, Failed),
    ],
)
async def test_a_raw_answer_is_read_as_its_meaning(status: int, meaning: type[Failed]) -> None:
    with pytest.raises(Failed) as raised:
        await read_json(_Answer(status, b"refused"))
    assert type(raised.value) is meaning
    assert (raised.value.status, raised.value.body) == (status, "refused")


async def test_a_raw_answer_read() -> None:
    assert await read_json(_Answer(200)) == {"a": 1}
    assert await read_json(_Answer(404)) is None
    assert await read_json(_Answer(403), absent=frozenset({ApiError.FORBIDDEN})) is None
    await ensure_ok(_Answer(200))
    with pytest.raises(NotFound):
        await ensure_ok(_Answer(404))


async def test_an_answer_whose_body_nobody_needs_is_read_and_judged_by_its_status() -> None:
    created, refused = _Answer(201), _Answer(429, b"budget")
    await ensure_success(created)
    assert created.was_read
    with pytest.raises(TooManyRequests) as raised:
        await ensure_success(refused)
    assert (raised.value.status, raised.value.body, refused.was_read) == (429, "budget", True)
    with pytest.raises(Failed):
        await ensure_success(_Answer(302))


async def test_call_returns_the_answer_or_raises_its_meaning() -> None:
    async def answer() -> str:
        return "ok"

    async def refused() -> str:
        raise ApiException(status=409, reason="taken")

    async def dropped() -> str:
        raise aiohttp.ServerDisconnectedError()

    assert await call(answer()) == "ok"
    with pytest.raises(Conflict):
        await call(refused())
    with pytest.raises(NoAnswer):
        await call(dropped())
