"""Reading a watch answer's body: events one JSON object per line, however the body is cut into chunks."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.kube.api_errors import Gone
from machine_preservation.kube.informer import BudgetExceeded, watch_event, watch_events

Event = tuple[str, Mapping[str, Any]]


class Chunks:
    """A body that arrives in the given chunks (the part of aiohttp's StreamReader the reader uses)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def read(chunks: list[bytes], *, max_bytes: int | None = None) -> list[Event]:
    return [(kind, obj) for _, kind, obj in read_sized(chunks, max_bytes=max_bytes)]


def read_sized(chunks: list[bytes], *, max_bytes: int | None = None) -> list[tuple[int, str, Mapping[str, Any]]]:
    async def collect() -> list[tuple[int, str, Mapping[str, Any]]]:
        return [event async for event in watch_events(Chunks(chunks), max_bytes=max_bytes)]  # type: ignore[arg-type]

    return asyncio.run(collect())


def cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    return [body[a:b] for a, b in itertools.pairwise(points)]


objects = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=8), "resourceVersion": st.from_regex(r"[0-9]{1,6}", fullmatch=True)}
        ),
        "data": st.text(max_size=300),  # may hold "\n" (escaped in the JSON) and non-ASCII
    }
)
events = st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]), objects), max_size=8)


@given(events=events, cuts=st.lists(st.integers(min_value=0), max_size=30), final_newline=st.booleans())
def test_every_event_is_read_once_in_order_wherever_the_chunks_are_cut(
    events: list[Event], cuts: list[int], final_newline: bool
) -> None:
    body = b"\n".join(json.dumps({"type": kind, "object": obj}).encode() for kind, obj in events)
    if final_newline and body:
        body += b"\n"
    assert read(cut(body, cuts)) == events


def test_an_object_of_many_chunks_is_read_whole() -> None:
    # An annotation alone may hold 256 KiB.
    big = {"metadata": {"name": "big", "annotations": {"a": "x" * 300_000}}}
    body = json.dumps({"type": "ADDED", "object": big}).encode() + b"\n"
    assert read([body[i : i + 16_384] for i in range(0, len(body), 16_384)]) == [("ADDED", big)]


def test_each_event_comes_with_its_size() -> None:
    lines = [json.dumps({"type": "ADDED", "object": {"metadata": {"name": "x" * n}}}).encode() for n in (1, 500)]
    assert [size for size, _, _ in read_sized([b"\n".join(lines)])] == [len(lines[0]), len(lines[1])]


def test_an_event_over_the_budget_is_refused_before_it_is_read_whole() -> None:
    big = {"metadata": {"name": "big", "annotations": {"a": "x" * 300_000}}}
    body = json.dumps({"type": "ADDED", "object": big}).encode() + b"\n"
    small = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "small"}}}).encode() + b"\n"
    chunks = [small, *(body[i : i + 16_384] for i in range(0, len(body), 16_384))]
    read_chunks: list[bytes] = []

    class Counting(Chunks):
        async def iter_any(self) -> AsyncIterator[bytes]:
            async for chunk in super().iter_any():
                read_chunks.append(chunk)
                yield chunk

    async def collect() -> list[str]:
        found = []
        async for _, _, obj in watch_events(Counting(chunks), max_bytes=100_000):  # type: ignore[arg-type]
            found.append(obj["metadata"]["name"])
        return found

    with pytest.raises(BudgetExceeded, match="one watch event comes to more than"):
        asyncio.run(collect())
    assert len(read_chunks) < len(chunks) // 2  # stopped soon after the budget, not at the end of the event
    assert read([small, body], max_bytes=len(body)) == [("ADDED", {"metadata": {"name": "small"}}), ("ADDED", big)]


def test_blank_lines_are_not_events() -> None:
    line = json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}).encode()
    assert read([b"\n", line, b"\n\r\n\n"]) == [("BOOKMARK", {"metadata": {"resourceVersion": "7"}})]


def test_an_error_event_raises_its_meaning() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 5 (9)"}
    with pytest.raises(Gone) as raised:
        watch_event(json.dumps({"type": "ERROR", "object": status}).encode())
    assert raised.value.status == 410
    assert raised.value.reason == "Expired: too old resource version: 5 (9)"


@pytest.mark.parametrize(
    "line",
    [
        b"404 page not found",
        b'{"kind": "Status", "code": 500}',  # a Status, not an event
        b'{"type": "ADDED"}',
        b'{"type": "ADDED", "object": "x"}',
        b'{"type": 3, "object": {}}',
        b"[1, 2]",
        b'{"type": "ADDED", "object": {',  # cut off
    ],
)
def test_what_is_not_an_event_is_an_unreadable_answer(line: bytes) -> None:
    with pytest.raises(ValueError, match="the watch answered"):
        watch_event(line)
