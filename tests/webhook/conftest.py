"""An in-process webhook app for aiohttp's test client, with a fixed clock and a MachineSet stand-in."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from machine_preservation.core.admission.deletion import MachineSetView, ShootExtension
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.webhook.app import WebhookConfig, build_app
from machine_preservation.webhook.machine_sets import SourceUnavailable, parsed, view_of
from machine_preservation.webhook.metrics import WebhookMetrics
from tests.webhook.reviews import CONTROLLER, MCM

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
SETTINGS = AdmissionSettings(controller_username=CONTROLLER, mcm_usernames=frozenset({MCM}))
SMALL_BODY_LIMIT = 64 * 1024
BODY_TIMEOUT = 0.5


@dataclass
class StaticMachineSets:
    """MachineSetSource over fixed lists (the real one, reading the API server, is in the integration tests)."""

    machine_sets: list[dict[str, Any]] = field(default_factory=list)
    machines: list[dict[str, Any]] = field(default_factory=list)
    machine_deployments: list[dict[str, Any]] = field(default_factory=list)
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)  # Gardener Cluster objects by name
    # Gardener's extension mode: the namespace's Extension of our type by namespace (a namespace not listed has
    # none). False: not that mode, nothing is read (as KubernetesMachineSets without gardener_extension).
    gardener_extension: bool = False
    extensions: dict[str, dict[str, Any]] = field(default_factory=dict)
    failure: str = ""
    cluster_failure: str = ""
    extension_failure: str = ""
    crash: bool = False
    reads: list[tuple[str, str]] = field(default_factory=list)
    cluster_reads: list[str] = field(default_factory=list)
    extension_reads: list[str] = field(default_factory=list)

    async def start(self) -> None:
        pass

    def synced(self) -> bool:
        return True

    async def read(self, *, namespace: str, name: str) -> MachineSetView | None:
        self.reads.append((namespace, name))
        if self.failure:
            raise SourceUnavailable(self.failure)
        if self.crash:
            raise RuntimeError("a bug")
        return view_of(
            name=name,
            machine_sets=[parsed(MachineSet, raw) for raw in self.machine_sets],
            machines=[parsed(Machine, raw) for raw in self.machines],
            machine_deployments=[parsed(MachineDeployment, raw) for raw in self.machine_deployments],
        )

    async def read_cluster(self, *, namespace: str) -> dict[str, Any] | None:
        self.cluster_reads.append(namespace)
        if self.cluster_failure:
            raise SourceUnavailable(self.cluster_failure)
        return self.clusters.get(namespace)

    async def read_extension(self, *, namespace: str) -> ShootExtension | None:
        if not self.gardener_extension:
            return None
        self.extension_reads.append(namespace)
        if self.extension_failure:
            raise SourceUnavailable(self.extension_failure)
        return ShootExtension.read(self.extensions.get(namespace))

    async def close(self) -> None:
        self.reads.clear()
        self.cluster_reads.clear()
        self.extension_reads.clear()


@dataclass
class Webhook:
    client: TestClient[web.Request, web.Application]
    machine_sets: StaticMachineSets
    metrics: WebhookMetrics
    readiness: list[bool]

    async def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        response = await self.client.post(path, json=body)
        return response.status, await response.json()

    async def review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, answer = await self.post(path, body)
        assert status == 200, answer
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == body["request"]["uid"]
        response: dict[str, Any] = answer["response"]
        return response

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


AiohttpClient = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture
async def webhook(aiohttp_client: AiohttpClient) -> Webhook:
    machine_sets = StaticMachineSets()
    metrics = WebhookMetrics()
    readiness = [True]
    app = build_app(
        WebhookConfig(
            settings=SETTINGS,
            machine_sets=machine_sets,
            ready=lambda: readiness[0],
            metrics=metrics,
            max_body_bytes=SMALL_BODY_LIMIT,
            body_timeout=BODY_TIMEOUT,
            clock=lambda: NOW,
        )
    )
    return Webhook(await aiohttp_client(app), machine_sets, metrics, readiness)
