"""`--mcm-native-preservation=auto` against the real API server: MCM's Deployment and CRDs as the webhook reads
them at start, with and without the rights or objects to read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kubernetes import client

from machine_preservation.core.mcm_evidence import MACHINE_CRD, MACHINE_SET_CRD, cluster_evidence
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.webhook.machine_sets import new_api_client
from machine_preservation.webhook.mcm_detection import decide, read_evidence


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


async def _evidence(kubeconfig: Path, namespace: str | None) -> Any:
    api_client = await new_api_client(kubeconfig=kubeconfig)
    async with api_client:
        return await read_evidence(api_client, namespace=namespace)


def test_the_image_of_mcms_deployment_decides(
    control_plane: ControlPlane, kube_client: client.ApiClient, namespace: str
) -> None:
    apps = client.AppsV1Api(kube_client)
    apps.create_namespaced_deployment(namespace, _mcm_deployment("r/machine-controller-manager:v0.61.3"))
    evidence = asyncio.run(_evidence(control_plane.kubeconfig, namespace))
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
    old = asyncio.run(decide(mode=auto, kubeconfig=control_plane.kubeconfig, namespace=namespace))
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
    assert asyncio.run(decide(mode=auto, kubeconfig=control_plane.kubeconfig, namespace=namespace)).native


def test_without_a_deployment_or_rights_the_crds_decide_and_nothing_fails(
    control_plane: ControlPlane, namespace: str, kubeconfig_for: Any
) -> None:
    # No Deployment in the namespace: the CRDs decide.
    evidence = asyncio.run(_evidence(control_plane.kubeconfig, namespace))
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
