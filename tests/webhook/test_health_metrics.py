"""GET /healthz, /readyz and /metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.webhook.conftest import Webhook
from tests.webhook.reviews import NODE_KIND, node, review


async def test_healthz_is_always_ok(webhook: Webhook) -> None:
    webhook.readiness[0] = False
    response = await webhook.client.get("/healthz")
    assert response.status == 200


async def test_readyz_follows_the_certificate(webhook: Webhook) -> None:
    assert (await webhook.client.get("/readyz")).status == 200
    webhook.readiness[0] = False
    response = await webhook.client.get("/readyz")
    assert response.status == 503
    assert await response.text() == "no valid serving certificate loaded, or the deletion guard's caches not synced yet"


async def test_metrics_are_prometheus_text_with_every_family(webhook: Webhook) -> None:
    await webhook.review(
        "/validate-preserve-annotation",
        review(kind=NODE_KIND, operation="CREATE", obj=node(annotations={"node.machine.sapcloud.io/preserve": "x"})),
    )
    await webhook.client.post("/validate-shoot", data=b"x")
    response = await webhook.client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    families = {family.name: family for family in text_string_to_metric_families(await response.text())}
    prefix = "machine_preservation_webhook"
    assert {
        f"{prefix}_requests",
        f"{prefix}_denials",
        f"{prefix}_patches",
        f"{prefix}_errors",
        f"{prefix}_request_duration_seconds",
        f"{prefix}_certificate_expiry_timestamp_seconds",
        f"{prefix}_certificate_reloads",
    } <= set(families)
    requests = {
        s.labels["endpoint"]: s.value for s in families[f"{prefix}_requests"].samples if s.name.endswith("_total")
    }
    assert requests == {
        "validate-preserve-annotation": 1,
        "mutate-node-ca-annotation": 0,
        "mutate-node-mcm-marker": 0,
        "validate-machine-deletion": 0,
        "validate-shoot": 1,
    }
    errors = [s for s in families[f"{prefix}_errors"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in errors] == [({"endpoint": "validate-shoot", "kind": "bad_request"}, 1.0)]
    buckets = [s for s in families[f"{prefix}_request_duration_seconds"].samples if s.name.endswith("_bucket")]
    assert any(s.labels["le"] == "+Inf" and s.value == 1 for s in buckets)


async def test_each_app_has_its_own_registry(webhook: Webhook) -> None:
    from machine_preservation.webhook.metrics import WebhookMetrics

    other = WebhookMetrics()
    other.requests.labels("validate-shoot").inc(5)
    assert webhook.sample("machine_preservation_webhook_requests_total", endpoint="validate-shoot") == 0
