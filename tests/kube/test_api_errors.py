"""The meaning the controller gives each status of an API answer."""

from __future__ import annotations

import pytest

from machine_preservation.kube.api_errors import ApiError, classify


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
