"""`--mcm-native-preservation=auto` against the real API server: MCM's Deployment and CRDs as the webhook reads
them at start, with and without the rights or objects to read; and per namespace
(`--mcm-native-preservation-per-namespace`), as one webhook serving many shoots reads them when requests need them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.mcm_evidence import MACHINE_CRD, MACHINE_SET_CRD, cluster_evidence
from machine_preservation.core.mcm_generation import ClusterEvidence, NativePreservationMode
from machine_preservation.core.webhook_configurations import CA_ANNOTATION_PATH, shoot_path
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import seed_install
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.webhook.app import WebhookConfig, build_app
from machine_preservation.webhook.mcm_detection import NativeByNamespace, decide, read_evidence
from machine_preservation.webhook.metrics import WebhookMetrics
from tests.controller.running import chart_identity
from tests.integration.seed_identity import seed_chart_identity
from tests.webhook.conftest import AiohttpClient, StaticMachineSets
from tests.webhook.reviews import NODE_KIND, node, review


def _mcm_deployment(image: str) -> dict[str, Any]:
    labels = {"app": "machine-controller-manager"}
    return {
        "metadata": {"name": "machine-controller-manager", "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "machine-controller-manager-provider-fake", "image": "r/provider:v9.9.9"},
                        {"name": "machine-controller-manager", "image": image},
                    ]
                },
            },
        },
    }


def _webhook_identity(control_plane: ControlPlane, namespace: str) -> Path:
    """The standalone chart's webhook ServiceAccount of a release serving `namespace`."""
    return asyncio.run(chart_identity(control_plane.kubeconfig, namespace, leader_election=False, component="webhook"))


async def _evidence(kubeconfig: Path, namespace: str | None) -> Any:
    api_client = await new_api_client(kubeconfig=kubeconfig)
    async with api_client:
        return await read_evidence(api_client, namespace=namespace)


def test_the_image_of_mcms_deployment_decides(
    control_plane: ControlPlane, kube_client: client.ApiClient, namespace: str
) -> None:
    apps = client.AppsV1Api(kube_client)
    apps.create_namespaced_deployment(namespace, _mcm_deployment("r/machine-controller-manager:v0.61.3"))
    webhook = _webhook_identity(control_plane, namespace)
    evidence = asyncio.run(_evidence(webhook, namespace))
    assert evidence.mcm_image == "r/machine-controller-manager:v0.61.3"
    # The CRDs read as the installed ones say.
    extensions = client.ApiextensionsV1Api(kube_client)
    installed = {
        name: json.loads(extensions.read_custom_resource_definition(name, _preload_content=False).data)
        for name in (MACHINE_CRD, MACHINE_SET_CRD)
    }
    expected = cluster_evidence(
        deployment=None, machine_crd=installed[MACHINE_CRD], machine_set_crd=installed[MACHINE_SET_CRD]
    )
    assert (evidence.machine_crd_has_expiry, evidence.machine_set_crd_has_auto_max) == (
        expected.machine_crd_has_expiry,
        expected.machine_set_crd_has_auto_max,
    )
    assert evidence.machine_crd_has_expiry is not None

    auto = NativePreservationMode.AUTO
    old = asyncio.run(decide(mode=auto, kubeconfig=webhook, namespace=namespace))
    assert (old.native, old.because) == (False, "MCM's image r/machine-controller-manager:v0.61.3 is v0.61.3")
    apps.patch_namespaced_deployment(
        "machine-controller-manager",
        namespace,
        {
            "spec": {
                "template": {"spec": {"containers": [{"name": "machine-controller-manager", "image": "r/m:v0.62.1"}]}}
            }
        },
    )
    assert asyncio.run(decide(mode=auto, kubeconfig=webhook, namespace=namespace)).native


def test_without_a_deployment_or_rights_the_crds_decide_and_nothing_fails(
    control_plane: ControlPlane, namespace: str, kubeconfig_for: Any
) -> None:
    # No Deployment in the namespace: the CRDs decide.
    evidence = asyncio.run(_evidence(_webhook_identity(control_plane, namespace), namespace))
    assert evidence.mcm_image is None
    assert evidence.machine_crd_has_expiry is not None
    # An identity without any rights: no evidence at all, and "not native".
    nobody = kubeconfig_for("system:serviceaccount:nowhere:nobody")
    blind = asyncio.run(_evidence(nobody, namespace))
    assert (blind.mcm_image, blind.machine_crd_has_expiry, blind.machine_set_crd_has_auto_max) == (None, None, None)
    decision = asyncio.run(decide(mode=NativePreservationMode.AUTO, kubeconfig=nobody, namespace=namespace))
    assert (decision.native, decision.because) == (False, "neither MCM's version nor its CRDs could be read")
    # An explicit mode reads nothing.
    explicit = asyncio.run(decide(mode=NativePreservationMode.TRUE, kubeconfig=nobody, namespace=namespace))
    assert (explicit.native, explicit.because) == (True, "set to true")


# --- per namespace ----------------------------------------------------------------------------------------------


def _set_image(apps: client.AppsV1Api, namespace: str, image: str) -> None:
    containers = [{"name": "machine-controller-manager", "image": image}]
    apps.patch_namespaced_deployment(
        "machine-controller-manager", namespace, {"spec": {"template": {"spec": {"containers": containers}}}}
    )


@contextmanager
def _shoots(kube_client: client.ApiClient, **images: str) -> Iterator[dict[str, str]]:
    """Shoot namespaces, each with an MCM Deployment of the given image; by key, the namespace's name."""
    tag = uuid.uuid4().hex[:6]
    core, apps = client.CoreV1Api(kube_client), client.AppsV1Api(kube_client)
    names = {key: f"shoot--{tag}--{key}" for key in images}
    for key, image in images.items():
        core.create_namespace({"metadata": {"name": names[key]}})
        apps.create_namespaced_deployment(names[key], _mcm_deployment(image))
    try:
        yield names
    finally:
        for name in names.values():
            core.delete_namespace(name)


def _user_drops_ca() -> dict[str, Any]:
    """A user removes the CA annotation from a node that carries MCM's `…-by-mcm` marker."""
    ca, by_mcm = v.CA_SCALE_DOWN_DISABLED_ANNOTATION, v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    old, new = node(annotations={ca: "true", by_mcm: "true"}), node(annotations={by_mcm: "true"})
    return review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old)


class _CountingNatives(NativeByNamespace):
    """Counts the namespace reads the cache lets through to the API server."""

    reads = 0

    async def _read_namespace(self, api_client: client.ApiClient, namespace: str, seconds: float) -> ClusterEvidence:
        self.reads += 1
        return await super()._read_namespace(api_client, namespace, seconds)


async def test_a_shoots_node_requests_follow_that_shoots_mcm(
    control_plane: ControlPlane, kube_client: client.ApiClient, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """One webhook, two shoots: `…-by-mcm` is a preservation in the shoot whose MCM is v0.62 and none in the
    v0.61 one; after an upgrade, the v0.61 shoot's node requests follow once the TTL has passed."""
    apps = client.AppsV1Api(kube_client)
    ttl = 3.0
    identity = await seed_chart_identity(control_plane, tmp_path, deployment=seed_install.WEBHOOK_DEPLOYMENT)
    natives = _CountingNatives.from_kubeconfig(identity, ttl=ttl)
    assert isinstance(natives, _CountingNatives)
    app = build_app(
        WebhookConfig(
            settings=AdmissionSettings(),
            machine_sets=StaticMachineSets(),
            native=natives,
            ready=lambda: True,
            metrics=WebhookMetrics(),
        )
    )
    web = await aiohttp_client(app)

    async def restored(namespace: str) -> bool:
        response = await web.post(shoot_path(namespace, CA_ANNOTATION_PATH), json=_user_drops_ca())
        assert response.status == 200
        answer = (await response.json())["response"]
        assert answer["allowed"] is True
        return "patch" in answer

    with _shoots(kube_client, new="r/machine-controller-manager:v0.62.0", old="r/mcm:v0.61.3") as shoots:
        started = time.monotonic()
        assert await restored(shoots["new"])
        assert not await restored(shoots["old"])
        read_at = time.monotonic()  # the old shoot's decision runs out before read_at + ttl
        # Cold reads against the API server fit well inside the node webhooks' 5 s.
        assert read_at - started < 2 * 2.0
        assert natives.reads == 2
        # Cached: no read for the next requests.
        assert await restored(shoots["new"])
        assert not await restored(shoots["old"])
        assert natives.reads == 2

        await asyncio.to_thread(_set_image, apps, shoots["old"], "r/mcm:v0.62.1")
        # Within the TTL the decision read before stands (the first reads were well under a second ago) ...
        assert not await restored(shoots["old"])
        assert natives.reads == 2
        # ... after it, the upgrade is followed.
        await asyncio.sleep(max(0.0, read_at + ttl - time.monotonic()) + 0.1)
        assert await restored(shoots["old"])
        assert natives.reads == 3
        # The other shoot kept its own decision, and a rollback is followed too.
        await asyncio.to_thread(_set_image, apps, shoots["new"], "r/machine-controller-manager:v0.61.9")
        await asyncio.sleep(ttl + 0.1)
        assert not await restored(shoots["new"])
        assert await restored(shoots["old"])


async def test_without_rights_a_namespace_is_not_native_and_nothing_fails(
    control_plane: ControlPlane, kube_client: client.ApiClient, kubeconfig_for: Any, tmp_path: Path
) -> None:
    nobody = kubeconfig_for("system:serviceaccount:nowhere:nobody")
    with _shoots(kube_client, new="r/machine-controller-manager:v0.62.0") as shoots:
        natives = NativeByNamespace.from_kubeconfig(nobody)
        try:
            started = time.monotonic()
            assert await natives.native(shoots["new"]) is False
            assert time.monotonic() - started < 2.0
        finally:
            await natives.close()
        # The same cluster read with the seed chart's webhook rights says native: the refusal above was no
        # accident of the setup.
        identity = await seed_chart_identity(control_plane, tmp_path, deployment=seed_install.WEBHOOK_DEPLOYMENT)
        seeing = NativeByNamespace.from_kubeconfig(identity)
        try:
            assert await seeing.native(shoots["new"]) is True
        finally:
            await seeing.close()
