"""The wire format: any bytes either parse into a review or raise BadRequest, nothing else."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.verdict import PatchOperation, Verdict, allow, deny
from machine_preservation.webhook.wire import BadRequest, load_json, parse_review, review_response, uid_of

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=200) | json_values.map(lambda value: json.dumps(value).encode()))
def test_anything_parses_or_is_a_bad_request(body: bytes) -> None:
    outcome: Any
    try:
        outcome = parse_review(body)
    except BadRequest as error:
        outcome = error
    if isinstance(outcome, BadRequest):
        assert outcome.status == 400
        assert outcome.reason
    else:
        assert outcome.request.uid


def json_outcome(load: Any, body: bytes) -> tuple[str, str]:
    """What decoding `body` gives, comparable across decoders: the value's repr (NaN != NaN), or the error."""
    try:
        return "value", repr(load(body))
    except (ValueError, RecursionError) as error:
        return type(error).__name__, str(error)


EDGE_CASES = [
    b'{"a": 1, "b": 2, "a": 3}',  # duplicate keys: the last value, at the first key's place
    b'{"s": "\\ud800"}',  # a lone surrogate escape
    b"[NaN, Infinity, -Infinity, 1e400, -0.0, 123456789012345678901234567890]",
    b'\xef\xbb\xbf{"a": 1}',  # UTF-8 with a byte-order mark
    '{"a": "\u00e9"}'.encode("utf-16"),
    '{"a": "\u00e9"}'.encode("utf-32-le"),
    b"[" * 300 + b"]" * 300,
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": "\xff"}',
    b'{"a": 1} trailing',
    b'{"a": "\x01"}',
    b"",
]


@pytest.mark.parametrize("body", EDGE_CASES)
def test_bodies_decode_exactly_as_json_decodes_them(body: bytes) -> None:
    assert json_outcome(load_json, body) == json_outcome(json.loads, body)


@given(st.binary(max_size=200) | json_values.map(lambda value: json.dumps(value).encode()))
def test_any_body_decodes_exactly_as_json_decodes_it(body: bytes) -> None:
    assert json_outcome(load_json, body) == json_outcome(json.loads, body)


@given(json_values)
def test_the_uid_is_found_only_where_a_review_keeps_it(document: Any) -> None:
    found = uid_of(document)
    if found:
        assert document["request"]["uid"] == found
    wrapped = {"request": {"uid": "u-1"}, "other": document}
    assert uid_of(wrapped) == "u-1"


def test_responses_carry_status_only_when_denied_and_patch_only_when_patched() -> None:
    assert review_response(uid="a", verdict=allow()).to_json() == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "a", "allowed": True},
    }
    denied = review_response(uid="b", verdict=deny("no", warnings=("w",))).to_json()["response"]
    assert denied == {
        "uid": "b",
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "no"},
        "warnings": ["w"],
    }
    operation = PatchOperation("add", "/metadata/annotations/a~1b", "true")
    patched = review_response(uid="c", verdict=Verdict(allowed=True, patch=(operation,))).to_json()["response"]
    assert patched["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(patched["patch"])) == [
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "true"}
    ]
