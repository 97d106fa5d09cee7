"""AdmissionReview admission.k8s.io/v1 on the wire, and the checks that turn bad bodies into HTTP 400.

Two channels, kept apart on purpose (as kopf does): a malformed review is an HTTP error (400/413) with a
reason; a well-formed review of an operation we refuse is HTTP 200 with `allowed: false` and a status.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import from_json

from machine_preservation.core.admission.verdict import Verdict

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"


class BadRequest(Exception):
    """The body is not a review we can answer; `status` is the HTTP status (400, 408 or 413)."""

    def __init__(self, reason: str, *, status: int = 400, uid: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.uid = uid


class WireModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class GroupVersionKind(WireModel):
    group: str = ""
    version: str = ""
    kind: str


class UserInfo(WireModel):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)


class AdmissionRequest(WireModel):
    uid: str
    kind: GroupVersionKind
    sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    user_info: UserInfo = Field(default_factory=UserInfo)
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool = False


class AdmissionReviewIn(WireModel):
    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class Status(WireModel):
    code: int
    reason: str = ""
    message: str = ""


class AdmissionResponse(WireModel):
    uid: str
    allowed: bool
    status: Status | None = None
    patch: str | None = None
    patch_type: Literal["JSONPatch"] | None = None
    warnings: list[str] | None = None


class AdmissionReviewOut(WireModel):
    api_version: str = API_VERSION
    kind: str = KIND
    response: AdmissionResponse

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def uid_of(document: Any) -> str:
    """The request uid when the document carries one as a string, else ""."""
    request = document.get("request") if isinstance(document, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""


def load_json(body: bytes) -> Any:
    """`json.loads(body)`, in about half the time for what the API server sends.

    Decoding the review is the largest cost of a request (a Node UPDATE carries two whole Nodes, often 60 KB and
    more). pydantic-core's parser builds the same objects from UTF-8 JSON; whatever it refuses (another encoding,
    a byte-order mark, a lone surrogate escape, deep nesting, anything malformed) is decoded by `json.loads`, so
    the result and every error are exactly json's.
    """
    try:
        return from_json(body, cache_strings="keys")
    except ValueError:
        return json.loads(body)


def parse_review(body: bytes) -> AdmissionReviewIn:
    """The review in `body`, or BadRequest saying what is wrong with it (first problem found)."""
    try:
        document = load_json(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise BadRequest(f"body is not JSON: {error}") from None
    except RecursionError:
        raise BadRequest("body is not JSON we accept: nested too deeply") from None
    uid = uid_of(document)
    if not isinstance(document, dict):
        raise BadRequest("body is not an AdmissionReview: expected a JSON object")
    if document.get("kind") != KIND:
        raise BadRequest(f"body is not an AdmissionReview: kind is {json.dumps(document.get('kind'))}", uid=uid)
    if document.get("apiVersion") != API_VERSION:
        raise BadRequest(
            f"unsupported apiVersion {json.dumps(document.get('apiVersion'))}: only {API_VERSION} is served", uid=uid
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise BadRequest("AdmissionReview has no request", uid=uid)
    if not uid:
        raise BadRequest("request.uid is missing or not a non-empty string")
    try:
        return AdmissionReviewIn.model_validate(document)
    except ValidationError as error:
        raise BadRequest(f"malformed AdmissionReview: {first_problem(error)}", uid=uid) from None


def first_problem(error: ValidationError) -> str:
    """The first thing pydantic found wrong, as `location: message`: one is enough to fix a request."""
    problem = error.errors()[0]
    location = ".".join(str(part) for part in problem["loc"])
    return f"{location}: {problem['msg']}"


def review_response(*, uid: str, verdict: Verdict) -> AdmissionReviewOut:
    status = None if verdict.allowed else Status(code=verdict.code, reason=verdict.reason, message=verdict.message)
    patch = None
    if verdict.patch:
        patch = base64.b64encode(json.dumps([op.as_json() for op in verdict.patch]).encode()).decode()
    return AdmissionReviewOut(
        response=AdmissionResponse(
            uid=uid,
            allowed=verdict.allowed,
            status=status,
            patch=patch,
            patch_type="JSONPatch" if patch else None,
            warnings=list(verdict.warnings) or None,
        )
    )


def bad_request_response(error: BadRequest) -> AdmissionReviewOut:
    """The body of a 4xx: the reason, and the uid when the request carried one."""
    reason = {413: "RequestEntityTooLarge", 408: "Timeout"}.get(error.status, "BadRequest")
    return AdmissionReviewOut(
        response=AdmissionResponse(
            uid=error.uid, allowed=False, status=Status(code=error.status, reason=reason, message=error.reason)
        )
    )
