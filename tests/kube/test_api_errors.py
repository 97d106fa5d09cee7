"""The meaning the controller gives each status of an API answer."""

from __future__ import annotations

import pytest

from machine_preservation.kube.api_errors import ApiError, classify, is_failure


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
