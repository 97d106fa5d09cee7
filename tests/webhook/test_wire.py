"""The wire format: any bytes either parse into a review or raise BadRequest, nothing else."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.verdict import PatchOperation, Verdict, allow, deny
from machine_preservation.webhook.wire import BadRequest, parse_review, review_response, uid_of

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
