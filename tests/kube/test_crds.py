"""The control cluster's CRDs read once for every user: `SharedRead` and `read_crd`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from machine_preservation.kube.api_errors import Forbidden, NoAnswer, NotFound, read_object
from machine_preservation.kube.crds import SharedRead


class _Reads:
    def __init__(self, *outcomes: Any) -> None:
        self.outcomes, self.count = list(outcomes), 0
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self) -> Any:
        self.count += 1
        await self.release.wait()
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def test_callers_at_once_share_one_read() -> None:
    read = _Reads("facts")
    read.release.clear()
    shared = SharedRead(read, max_age=60.0)
    waiting = [asyncio.create_task(shared.get()) for _ in range(5)]
    await asyncio.sleep(0)
    read.release.set()
    assert await asyncio.gather(*waiting) == ["facts"] * 5
    assert read.count == 1


async def test_a_value_is_read_again_once_it_is_max_age_old() -> None:
    now = [0.0]
    read = _Reads("first", "second")
    shared = SharedRead(read, max_age=60.0, clock=lambda: now[0])
    assert await shared.get() == "first"
    now[0] = 59.9
    assert await shared.get() == "first"
    now[0] = 60.0
    assert await shared.get() == "second"
    assert read.count == 2


async def test_fresh_for_shortens_what_a_value_is_kept() -> None:
    now = [0.0]
    read = _Reads((None, "crd"), ("crd", "crd"), ("other", "crd"))
    shared = SharedRead(read, max_age=60.0, clock=lambda: now[0], fresh_for=lambda v: 60.0 if None not in v else 5.0)
    assert await shared.get() == (None, "crd")
    now[0] = 5.0  # the part that could not be read is tried again soon
    assert await shared.get() == ("crd", "crd")
    now[0] = 64.9  # a whole read is kept for max_age
    assert await shared.get() == ("crd", "crd")
    assert read.count == 2


async def test_a_read_that_fails_keeps_nothing() -> None:
    read = _Reads(NoAnswer("refused"), "facts")
    shared = SharedRead(read, max_age=60.0)
    with pytest.raises(NoAnswer):
        await shared.get()
    assert await shared.get() == "facts"
    assert read.count == 2


class _Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.reason, self._body = status, "why", body

    async def read(self) -> bytes:
        return self._body


async def test_read_object_raises_meanings() -> None:
    async def answer(status: int, body: bytes, **_: Any) -> _Answer:
        return _Answer(status, body)

    async def unreachable(*_: Any, **__: Any) -> _Answer:
        raise OSError(111, "refused")

    assert await read_object(answer, 200, b'{"kind": "CRD"}') == {"kind": "CRD"}  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        await read_object(answer, 404, b"{}")  # type: ignore[arg-type]
    with pytest.raises(Forbidden):
        await read_object(answer, 403, b"{}")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a JSON object"):
        await read_object(answer, 200, b"[1]")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Expecting value"):
        await read_object(answer, 200, b"not json")  # type: ignore[arg-type]
    with pytest.raises(NoAnswer):
        await read_object(unreachable, seconds=1.0)
