"""Rotation under load: seconds-long certificates (CA and serving) rotated by the certs manager while the real
API server keeps calling a webhook over TLS. Every connection is closed after its answer, so every request
is a fresh handshake against whatever certificate and caBundle are current. No request may fail. The manager runs
as the standalone chart's certs manager ServiceAccount under the chart's RBAC (tests/integration/certs_identity.py),
on the release's Secret and webhook configuration; the administrator only sets up, loads and checks."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as sync_client
from kubernetes.aio import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.certs.manager import CertificateManager, ManagerSettings, WebhookConfigurationRef, WebhookKind
from machine_preservation.certs.pairs import fingerprint, load_certificates
from machine_preservation.certs.rotation import RotationPolicy, ServingIdentity
from machine_preservation.localcluster.controlplane import free_port
from machine_preservation.webhook.certificates import CertificateStore
from machine_preservation.webhook.metrics import WebhookMetrics
from tests.integration.certs_identity import CA_SECRET, CertsIdentity

POLICY = RotationPolicy(
    ca_validity=dt.timedelta(seconds=24),
    ca_rotate_before=dt.timedelta(seconds=14),
    ca_overlap=dt.timedelta(seconds=6),
    propagation_delay=dt.timedelta(seconds=2),
    serving_validity=dt.timedelta(seconds=6),
    serving_renew_fraction=0.5,
)
DENIAL = "rotation-probe says no"
# A bound on the whole run, so a broken rotation fails instead of hanging; not a performance check.
GIVE_UP_AFTER = 180.0


@pytest.fixture
async def aio_client(certs: CertsIdentity) -> AsyncIterator[client.ApiClient]:
    """The certs manager's client: its ServiceAccount's token."""
    api_client = await config.new_client_from_config(config_file=str(certs.kubeconfig))
    async with api_client:
        yield api_client


async def review(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    response = web.json_response(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": body["request"]["uid"],
                "allowed": False,
                "status": {"code": 403, "reason": "Forbidden", "message": DENIAL},
            },
        }
    )
    # A new TLS handshake for every request: each one meets the current certificate.
    response.force_close()
    return response


class Load:
    """Dry-run ConfigMap creates in a thread until stopped. Once the webhook has answered once (the API server's
    informer has the configuration), every outcome but the webhook's denial is a failure."""

    def __init__(self, core: sync_client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.core.create_namespaced_config_map(
                    self.namespace, {"metadata": {"generateName": "probe-"}}, dry_run="All"
                )
            except ApiException as error:
                if error.status == 403 and DENIAL in str(error.body):
                    self.answered += 1
                    continue
                outcome = f"{error.status}: {error.body}"
            else:
                outcome = "allowed without asking the webhook"
            if self.answered:
                self.failures.append(outcome)
            time.sleep(0.01)


async def test_short_lived_certificates_rotate_while_requests_keep_flowing(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    certs: CertsIdentity,
    namespace: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    name = certs.configuration  # the release's, which its certs manager may patch
    registration = sync_client.AdmissionregistrationV1Api(kube_client)
    registration.create_validating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "probe.rotation.machine-preservation.test",
                    "clientConfig": {"url": f"https://127.0.0.1:{port}/validate"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    cert_dir = tmp_path / "certs"
    manager = CertificateManager(
        settings=ManagerSettings(
            secret_namespace=namespace,
            secret_name=CA_SECRET,
            cert_dir=cert_dir,
            identity=ServingIdentity(dns_names=("localhost",), ip_addresses=("127.0.0.1",)),
            policy=POLICY,
            configurations=(WebhookConfigurationRef(kind=WebhookKind.VALIDATING, name=name),),
            ca_common_name="rotation-ca",
            resync=dt.timedelta(seconds=1),
        ),
        api_client=aio_client,
        remote_clients={},
    )
    await manager.sync_once()

    # The webhook server's own reloading store (polls the files' content hash).
    metrics = WebhookMetrics()
    store = CertificateStore(cert_dir=cert_dir, metrics=metrics)
    assert store.reload()
    presented: set[dt.datetime | None] = set()
    select = store.listener_context.sni_callback
    assert select is not None

    def count_handshakes(connection: ssl.SSLObject, server_name: str | None, listener: ssl.SSLContext) -> None:
        select(connection, server_name, listener)  # type: ignore[arg-type]
        presented.add(store.not_after)

    store.listener_context.sni_callback = count_handshakes
    app = web.Application()
    app.router.add_post("/validate", review)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=store.listener_context).start()
    watcher = asyncio.create_task(store.watch(interval=0.1))
    stop_manager = asyncio.Event()
    rotating = asyncio.create_task(manager.run(stop=stop_manager))
    load = Load(sync_client.CoreV1Api(kube_client), namespace)
    cas: set[str] = set()
    try:
        worker = asyncio.create_task(asyncio.to_thread(load.run))
        deadline = time.monotonic() + GIVE_UP_AFTER
        while time.monotonic() < deadline and not (len(cas) >= 3 and len(presented) >= 8):
            await asyncio.sleep(0.2)
            cas.update(fingerprint(c) for c in load_certificates((cert_dir / "ca.crt").read_bytes()))
        load.stop.set()
        await worker
    finally:
        load.stop.set()
        stop_manager.set()
        await rotating
        watcher.cancel()
        await runner.cleanup()
        registration.delete_validating_webhook_configuration(name)
    assert load.failures == []
    assert len(cas) >= 3, "the CA must have been rotated at least twice"
    assert len(presented) >= 8, "the API server must have met several rotated serving certificates"
    assert load.answered > len(presented)
    reloads: Any = metrics.registry.get_sample_value(
        "machine_preservation_webhook_certificate_reloads_total", {"result": "loaded"}
    )
    assert reloads >= len(presented)
