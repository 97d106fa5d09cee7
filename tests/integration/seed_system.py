"""What every Gardener seed has besides Gardener's own CRDs: the VPA and prometheus-operator (their CRDs as Gardener
ships them for seeds) and the `garden` namespace; the seed chart's objects need them."""

from __future__ import annotations

import contextlib

import pytest
import yaml
from kubernetes import client

from machine_preservation.localcluster.crds import apply_crd
from machine_preservation.localcluster.mcm import GARDENER_MODULE, GARDENER_VERSION, go_module_dir
from tests.polling import eventually

SEED_SYSTEM_CRDS = (
    "example/seed-crds/10-crd-autoscaling.k8s.io_verticalpodautoscalers.yaml",
    "example/seed-crds/10-crd-monitoring.coreos.com_prometheusrules.yaml",
    "example/seed-crds/10-crd-monitoring.coreos.com_servicemonitors.yaml",
)


@pytest.fixture(scope="session")
def seed_system(kube_client: client.ApiClient) -> None:
    api = client.ApiextensionsV1Api(kube_client)
    names = []
    for path in SEED_SYSTEM_CRDS:
        manifest = yaml.safe_load((go_module_dir(GARDENER_MODULE, GARDENER_VERSION) / path).read_text())
        apply_crd(api, manifest)
        names.append(manifest["metadata"]["name"])

    def established() -> bool:
        crds = [api.read_custom_resource_definition(name) for name in names]
        return all(
            any(c.type == "Established" and c.status == "True" for c in (crd.status and crd.status.conditions) or [])
            for crd in crds
        )

    eventually(established)
    with contextlib.suppress(client.exceptions.ApiException):
        client.CoreV1Api(kube_client).create_namespace({"metadata": {"name": "garden"}})
