"""The tests' polling helpers retry what an object not there yet looks like, from either kubernetes client."""

from __future__ import annotations

import pytest
from kubernetes.aio.client.exceptions import ApiException as AioApiException
from kubernetes.client.exceptions import ApiException

from tests.polling import eventually, eventually_async


async def test_an_aio_not_found_is_retried_until_the_object_is_there() -> None:
    calls = 0

    async def read() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise AioApiException(status=404, reason="Not Found")
        return "found"

    assert await eventually_async(read, limit=5, interval=0.01) == "found"
    assert calls == 3


def test_a_blocking_not_found_is_retried_until_the_object_is_there() -> None:
    answers = iter([ApiException(status=404, reason="Not Found"), "found"])

    def read() -> object:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert eventually(read, limit=5, interval=0.01) == "found"


async def test_other_errors_end_the_wait_at_once() -> None:
    async def read() -> None:
        raise KeyError("a bug in the check")

    with pytest.raises(KeyError):
        await eventually_async(read, limit=5, interval=0.01)
