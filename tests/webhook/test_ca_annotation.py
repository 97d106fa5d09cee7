"""POST /mutate-node-ca-annotation: the CA annotation is restored on preserved nodes."""

from __future__ import annotations

from typing import Any

import pytest

from machine_preservation.core import vocabulary as v
from tests.webhook.conftest import Webhook
from tests.webhook.reviews import CONTROLLER, NODE_KIND, apply_patch, decoded_patch, node, review

PATH = "/mutate-node-ca-annotation"
CA = v.CA_SCALE_DOWN_DISABLED_ANNOTATION
MARKER = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
PRESERVED = {CA: "true", MARKER: "true"}


@pytest.mark.parametrize(
    "new",
    [
        node(annotations={MARKER: "true", "team": "sre"}),
        node(annotations={CA: "false", MARKER: "true"}),
        node(annotations={CA: "", MARKER: "true"}),
        node(annotations={}),  # marker and annotation dropped together
    ],
)
async def test_removing_or_changing_it_on_a_preserved_node_is_patched_back(
    webhook: Webhook, new: dict[str, Any]
) -> None:
    body = review(kind=NODE_KIND, operation="UPDATE", obj=new, old=node(annotations=PRESERVED))
    response = await webhook.review(PATH, body)
    assert response["allowed"] is True
    patch = decoded_patch(response)
    assert patch == [
        {
            "op": "add",
            "path": "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled",
            "value": "true",
        }
    ]
    patched = apply_patch(new, patch)
    assert patched["metadata"]["annotations"][CA] == "true"
    assert {k: val for k, val in patched["metadata"]["annotations"].items() if k != CA} == {
        k: val for k, val in new["metadata"]["annotations"].items() if k != CA
    }
    assert response["warnings"] == [f'{CA} restored to "true": the node is preserved by machine-preservation']


async def test_a_node_without_annotations_gets_the_whole_map(webhook: Webhook) -> None:
    new = node(annotations=None, preserved="True")
    response = await webhook.review(
        PATH, review(kind=NODE_KIND, operation="UPDATE", obj=new, old=node(annotations={CA: "true"}, preserved="True"))
    )
    patch = decoded_patch(response)
    assert patch == [{"op": "add", "path": "/metadata/annotations", "value": {CA: "true"}}]
    assert apply_patch(new, patch)["metadata"]["annotations"] == {CA: "true"}


@pytest.mark.parametrize(
    ("old", "new", "username"),
    [
        (node(annotations=PRESERVED), node(annotations={MARKER: "true"}), CONTROLLER),
        (node(annotations={CA: "true"}), node(annotations={}), "alice"),
        (node(annotations={CA: "true"}, preserved="False"), node(annotations={}, preserved="False"), "alice"),
        (node(annotations=PRESERVED), node(annotations={**PRESERVED, "x": "1"}), "alice"),
    ],
)
async def test_other_requests_pass_untouched(
    webhook: Webhook, old: dict[str, Any], new: dict[str, Any], username: str
) -> None:
    response = await webhook.review(
        PATH, review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old, username=username)
    )
    assert response == {"uid": response["uid"], "allowed": True}


async def test_patches_are_counted_and_dry_run_is_patched_alike(webhook: Webhook) -> None:
    old, new = node(annotations=PRESERVED), node(annotations={MARKER: "true"})
    real = await webhook.review(PATH, review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old, uid="u"))
    dry = await webhook.review(
        PATH, review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old, uid="u", dry_run=True)
    )
    assert real == dry
    assert webhook.sample("machine_preservation_webhook_patches_total", endpoint="mutate-node-ca-annotation") == 2


async def test_create_is_not_mutated(webhook: Webhook) -> None:
    body = review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={CA: "false", MARKER: "true"}))
    assert "patch" not in await webhook.review(PATH, body)
