"""Property: whatever arrives at whichever endpoint, the answer is a 200, 400 or 413, never a 5xx; it echoes
the uid when the request carries one; the same body always gets the same answer; nothing is an internal error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from tests.webhook.conftest import Webhook
from tests.webhook.reviews import ADMIN, CONTROLLER, MACHINE_KIND, MCM, NODE_KIND, SHOOT_KIND

ENDPOINTS = (
    "/validate-preserve-annotation",
    "/mutate-node-ca-annotation",
    "/validate-machine-deletion",
    "/validate-shoot",
)

scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
keys = st.sampled_from(
    [
        v.PRESERVE_ANNOTATION,
        *v.CONTROLLER_OWNED_ANNOTATIONS,
        v.CA_SCALE_DOWN_DISABLED_ANNOTATION,
        v.MACHINE_PRIORITY_ANNOTATION,
        "team",
    ]
) | st.text(max_size=10)
values = st.sampled_from(
    ["", "now", "when-failed", "false", "auto-preserve", "auto-preserved", "true", "Now", " "]
) | st.text(max_size=8)
annotation_maps = st.dictionaries(keys, values, max_size=6)


@st.composite
def objects(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    metadata: dict[str, Any] = {"name": draw(st.sampled_from(["a", "", "m1"])), "namespace": "ns"}
    if draw(st.booleans()):
        metadata["annotations"] = draw(annotation_maps)
    metadata["ownerReferences"] = [{"kind": "MachineSet", "name": "ms", "controller": True}]
    document: dict[str, Any] = {"metadata": metadata}
    document["status"] = draw(
        st.sampled_from(
            [
                {},
                {"conditions": [{"type": "Preserved", "status": "True"}]},
                {"currentStatus": {"phase": "Failed"}},
                {"currentStatus": {"phase": "Failed", "preserveExpiryTime": "2030-01-01T00:00:00Z"}},
            ]
        )
    )
    if draw(st.booleans()):
        document["spec"] = {
            "provider": {
                "workers": draw(
                    st.lists(
                        st.fixed_dictionaries(
                            {
                                "name": st.sampled_from(["a", "b"]),
                                "maximum": st.integers(-1, 5) | json_values,
                                "machineControllerManager": st.fixed_dictionaries(
                                    {
                                        "autoPreserveFailedMachineMax": st.integers(-2, 7) | json_values,
                                        "machinePreserveTimeout": st.sampled_from(["1h", "-1h", "1000h", "x"])
                                        | json_values,
                                    }
                                ),
                            }
                        ),
                        max_size=3,
                    )
                )
            }
        }
    return document


DEFECTS = ("raw-json", "api-version", "kind", "uid", "request-kind", "operation", "drop-field")


@st.composite
def reviews(draw: st.DrawFn) -> Any:
    """A well-formed review with arbitrary objects, and in about half the examples one defect."""
    request: dict[str, Any] = {
        "uid": draw(st.text(min_size=1, max_size=10)),
        "kind": draw(st.sampled_from([NODE_KIND, MACHINE_KIND, SHOOT_KIND])),
        "operation": draw(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])),
        "userInfo": {
            "username": draw(st.sampled_from([ADMIN, CONTROLLER, MCM])),
            "groups": draw(st.sampled_from([[], ["system:nodes"]])),
        },
        "object": draw(objects()),
        "oldObject": draw(objects()),
        "dryRun": draw(st.booleans()),
    }
    body: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    defect = draw(st.sampled_from((None,) * len(DEFECTS) + DEFECTS))
    if defect == "raw-json":
        return draw(json_values)
    if defect == "api-version":
        body["apiVersion"] = draw(st.sampled_from(["admission.k8s.io/v1beta1", "v1"]) | json_values)
    elif defect == "kind":
        body["kind"] = draw(st.sampled_from(["Review", "Pod"]) | json_values)
    elif defect == "uid":
        request["uid"] = draw(json_values)
    elif defect == "request-kind":
        request["kind"] = draw(st.just({"group": "", "version": "v1", "kind": "Pod"}) | json_values)
    elif defect == "operation":
        request["operation"] = draw(json_values)
    elif defect == "drop-field":
        del request[draw(st.sampled_from(sorted(request)))]
    return body


def expected_uid(body: Any) -> str:
    request = body.get("request") if isinstance(body, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(body=reviews(), endpoint=st.sampled_from(ENDPOINTS))
async def test_no_5xx_uid_echoed_and_deterministic(webhook: Webhook, body: Any, endpoint: str) -> None:
    data = json.dumps(body).encode()
    answers = []
    for _ in range(2):
        response = await webhook.client.post(endpoint, data=data)
        assert response.status in (200, 400, 413)
        answers.append((response.status, await response.json()))
    assert answers[0] == answers[1]
    status, answer = answers[0]
    assert answer["response"]["uid"] == expected_uid(body)
    if status == 200:
        assert isinstance(answer["response"]["allowed"], bool)
        event("judged")
    name = endpoint.lstrip("/")
    assert webhook.sample("machine_preservation_webhook_errors_total", endpoint=name, kind="internal") == 0
