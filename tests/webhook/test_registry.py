"""The server serves what the registry registers (core.webhook_configurations.REGISTRY), the same table the charts'
rendered configurations are held to (tests/webhook/configurations.py, `registration_problems`): every path and
only those, on each path every kind registered there and no other, and an internal error by the registered
failurePolicy (tests/webhook/test_internal_errors.py)."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from aiohttp import web

from machine_preservation.core.webhook_configurations import REGISTRY, shoot_path
from machine_preservation.webhook.app import Routes, WebhookConfig, build_app
from machine_preservation.webhook.metrics import WebhookMetrics
from tests.webhook.conftest import NOW, SETTINGS, StaticMachineSets, Webhook
from tests.webhook.reviews import MACHINE_KIND, MACHINE_SET_KIND, NODE_KIND, SHOOT_KIND, review

KINDS = {"Node": NODE_KIND, "Machine": MACHINE_KIND, "Shoot": SHOOT_KIND, "MachineSet": MACHINE_SET_KIND}


def _admission_paths(app: web.Application) -> set[str]:
    return {route.resource.canonical for route in app.router.routes() if route.method == "POST"}


def _registered_paths(routes: Routes) -> set[str]:
    plain = {r.path for r in REGISTRY} if routes != "shoots" else set()
    per_shoot = {shoot_path("{namespace}", r.path) for r in REGISTRY if r.per_shoot} if routes != "seed" else set()
    return plain | per_shoot


@pytest.mark.parametrize("routes", get_args(Routes))
def test_the_server_serves_exactly_the_registered_paths(routes: Routes) -> None:
    config = WebhookConfig(
        settings=SETTINGS,
        machine_sets=StaticMachineSets(),
        ready=lambda: True,
        metrics=WebhookMetrics(),
        clock=lambda: NOW,
    )
    served = _admission_paths(build_app(config, routes=routes))
    assert served == _registered_paths(routes)
    assert {route.resource.canonical for route in build_app(config).router.routes() if route.method == "GET"} == {
        "/healthz",
        "/readyz",
        "/metrics",
    }


def _cases() -> list[Any]:
    paths = {r.path for r in REGISTRY} | {shoot_path("shoot--p--s", r.path) for r in REGISTRY if r.per_shoot}
    return [pytest.param(path, kind, id=f"{path}-{kind}") for path in sorted(paths) for kind in KINDS]


@pytest.mark.parametrize(("path", "kind"), _cases())
async def test_each_path_takes_the_kinds_registered_there_and_no_other(webhook: Webhook, path: str, kind: str) -> None:
    per_shoot = path.startswith("/shoots/")
    registered = any(r.kind == kind and (path == r.path or (r.per_shoot and path.endswith(r.path))) for r in REGISTRY)
    # An operation the endpoint does not judge: answered without looking at the objects.
    status, answer = await webhook.post(path, review(kind=KINDS[kind], operation="CONNECT"))
    if registered:
        assert status == 200, answer
        assert answer["response"]["allowed"] is True
    else:
        assert status == 400, (per_shoot, answer)
        assert "this endpoint handles" in answer["response"]["status"]["message"]
