"""Malformed reviews get HTTP 400 with a reason (413 when too big), never a 500; the uid is echoed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.webhook.conftest import SMALL_BODY_LIMIT, Webhook
from tests.webhook.reviews import MACHINE_KIND, MACHINE_SET_KIND, NODE_KIND, SHOOT_KIND, machine, node, review

ENDPOINTS = (
    "/validate-preserve-annotation",
    "/mutate-node-ca-annotation",
    "/validate-machine-deletion",
    "/validate-shoot",
)


def good() -> dict[str, Any]:
    return review(kind=NODE_KIND, operation="UPDATE", obj=node(), old=node(), uid="the-uid")


def edited(**changes: Any) -> dict[str, Any]:
    body = good()
    for dotted, value in changes.items():
        target = body
        *parents, last = dotted.split("__")
        for part in parents:
            target = target[part]
        if value is ...:
            del target[last]
        else:
            target[last] = value
    return body


@pytest.mark.parametrize(
    ("body", "reason", "uid"),
    [
        (b"{not json", "body is not JSON", ""),
        (b"\xff\xfe", "body is not JSON", ""),
        (b"[1, 2]", "body is not an AdmissionReview: expected a JSON object", ""),
        (b"null", "body is not an AdmissionReview: expected a JSON object", ""),
        (json.dumps(edited(kind="Pod")).encode(), 'body is not an AdmissionReview: kind is "Pod"', "the-uid"),
        (
            json.dumps(edited(apiVersion="admission.k8s.io/v1beta1")).encode(),
            'unsupported apiVersion "admission.k8s.io/v1beta1": only admission.k8s.io/v1 is served',
            "the-uid",
        ),
        (json.dumps(edited(request=...)).encode(), "AdmissionReview has no request", ""),
        (json.dumps(edited(request__uid=...)).encode(), "request.uid is missing", ""),
        (json.dumps(edited(request__uid="")).encode(), "request.uid is missing", ""),
        (json.dumps(edited(request__uid=7)).encode(), "request.uid is missing", ""),
        (
            json.dumps(edited(request__operation="PATCH")).encode(),
            "malformed AdmissionReview: request.operation",
            "the-uid",
        ),
        (json.dumps(edited(request__kind=...)).encode(), "malformed AdmissionReview: request.kind", "the-uid"),
        (
            json.dumps(edited(request__kind=MACHINE_SET_KIND)).encode(),
            "this endpoint handles core/Node, machine.sapcloud.io/Machine, not machine.sapcloud.io/MachineSet",
            "the-uid",
        ),
        (json.dumps(edited(request__object=None)).encode(), "request.object is missing", "the-uid"),
        (json.dumps(edited(request__oldObject=None)).encode(), "request.oldObject is missing", "the-uid"),
        (
            json.dumps(edited(request__object={"metadata": {"annotations": {"a": 1}}})).encode(),
            "request.object is not a valid Node: metadata.annotations.a: Input should be a valid string",
            "the-uid",
        ),
        (b"[" * 50_000, "body is not JSON we accept: nested too deeply", ""),
    ],
)
async def test_bad_bodies_get_400_with_a_reason(webhook: Webhook, body: bytes, reason: str, uid: str) -> None:
    response = await webhook.client.post("/validate-preserve-annotation", data=body)
    assert response.status == 400
    answer = await response.json()
    assert answer["response"]["uid"] == uid
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    assert answer["response"]["status"]["reason"] == "BadRequest"
    assert answer["response"]["status"]["message"].startswith(reason)
    assert (
        webhook.sample(
            "machine_preservation_webhook_errors_total", endpoint="validate-preserve-annotation", kind="bad_request"
        )
        == 1
    )


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        (
            "/mutate-node-ca-annotation",
            review(kind=MACHINE_KIND, operation="UPDATE", obj=machine(), old=machine()),
            "this endpoint handles core/Node, not",
        ),
        (
            "/validate-machine-deletion",
            review(kind=NODE_KIND, operation="DELETE", old=node()),
            "this endpoint handles machine.sapcloud.io/Machine, not core/Node",
        ),
        ("/validate-machine-deletion", review(kind=MACHINE_KIND, operation="DELETE"), "request.oldObject is missing"),
        (
            "/validate-shoot",
            review(kind=NODE_KIND, operation="CREATE", obj=node()),
            "this endpoint handles core.gardener.cloud/Shoot, not core/Node",
        ),
        ("/validate-shoot", review(kind=SHOOT_KIND, operation="CREATE"), "request.object is missing"),
    ],
)
async def test_wrong_kinds_and_missing_objects_per_endpoint(
    webhook: Webhook, path: str, body: dict[str, Any], reason: str
) -> None:
    status, answer = await webhook.post(path, body)
    assert status == 400
    assert answer["response"]["status"]["message"].startswith(reason)
    assert answer["response"]["uid"] == body["request"]["uid"]


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_oversized_bodies_get_413(webhook: Webhook, path: str) -> None:
    body = edited(request__object=node(annotations={"big": "x" * SMALL_BODY_LIMIT}))
    response = await webhook.client.post(path, data=json.dumps(body).encode())
    assert response.status == 413
    answer = await response.json()
    assert answer["response"]["status"]["reason"] == "RequestEntityTooLarge"
    assert f"exceeds the limit of {SMALL_BODY_LIMIT} bytes" in answer["response"]["status"]["message"]


async def test_oversized_chunked_bodies_get_413_too(webhook: Webhook) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(SMALL_BODY_LIMIT // 1024 + 2):
            yield b" " * 1024

    response = await webhook.client.post("/validate-shoot", data=chunks())
    assert response.status == 413
    assert webhook.sample("machine_preservation_webhook_errors_total", endpoint="validate-shoot", kind="too_large") == 1


async def test_a_body_that_never_completes_gets_408_instead_of_a_hang(webhook: Webhook) -> None:
    server = webhook.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(
            b"POST /validate-shoot HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"apiVersion": '
        )
        await writer.drain()
        status_line = await reader.readline()
    finally:
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 408")
    assert webhook.sample("machine_preservation_webhook_errors_total", endpoint="validate-shoot", kind="timeout") == 1


async def test_a_body_just_under_the_limit_is_judged(webhook: Webhook) -> None:
    body = good()
    padding = SMALL_BODY_LIMIT - len(json.dumps(body).encode()) - 200
    body["request"]["object"]["metadata"]["labels"]["pad"] = "x" * padding
    assert (await webhook.review("/validate-preserve-annotation", body))["allowed"] is True


async def test_get_on_an_admission_endpoint_is_not_allowed(webhook: Webhook) -> None:
    response = await webhook.client.get("/validate-shoot")
    assert response.status == 405
