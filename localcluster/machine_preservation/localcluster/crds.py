"""Installing the CRDs the product works with: MCM's Machine kinds, a Shoot stand-in and Gardener's Cluster.

Two sources for MCM's kinds: the copies shipped with this package (the default), or MCM's own CRDs of a given
version, unchanged from its Go module (`mcm_version=...`; these add MachineClass, which real MCM needs).
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.localcluster.mcm import gardener_cluster_crd, mcm_crds

SHOOT_CRD = "core.gardener.cloud_shoots.yaml"


def crd_manifests(mcm_version: str | None = None) -> list[dict[str, Any]]:
    """The CRD documents to install, in a stable order.

    Without `mcm_version`: the ones shipped with the package. With it: MCM's own CRDs of that version (from
    its Go module, unchanged), the Shoot CRD shipped with the package and Gardener's `Cluster` CRD."""
    directory = resources.files("machine_preservation.localcluster") / "crds"
    if mcm_version is None:
        return [
            yaml.safe_load(entry.read_text())
            for entry in sorted(directory.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".yaml")
        ]
    manifests = [single_document(path) for path in sorted(mcm_crds(mcm_version).glob("*.yaml"))]
    manifests.append(yaml.safe_load((directory / SHOOT_CRD).read_text()))
    manifests.append(single_document(gardener_cluster_crd()))
    return manifests


def single_document(path: Path) -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if len(documents) != 1 or documents[0].get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path}: expected exactly one CustomResourceDefinition")
    document: dict[str, Any] = documents[0]
    return document


def install_crds(kubeconfig: Path, *, mcm_version: str | None = None, timeout: float = 60.0) -> None:
    """Create or replace every CRD (see `crd_manifests` for `mcm_version`), then wait until each is Established and
    its resources can be listed (right after Established the API server still answers 429 "storage is
    (re)initializing" for a moment, which would fail whoever lists first)."""
    install_crd_manifests(kubeconfig, crd_manifests(mcm_version), timeout=timeout)


def install_crd_manifests(kubeconfig: Path, manifests: list[dict[str, Any]], *, timeout: float = 60.0) -> None:
    """Create or replace these CRDs, then wait until each is Established and listable (see `install_crds`)."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    with api_client:
        api = client.ApiextensionsV1Api(api_client)
        for manifest in manifests:
            apply_crd(api, manifest)
        deadline = time.monotonic() + timeout
        for manifest in manifests:
            name = manifest["metadata"]["name"]
            while not (_established(api, name) and _listable(api_client, manifest)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established and listable after {timeout}s")
                time.sleep(0.1)


def apply_crd(api: client.ApiextensionsV1Api, manifest: dict[str, Any]) -> None:
    """Create the CRD, or replace the existing one with this definition."""
    crd = client.V1CustomResourceDefinition.model_validate(manifest)
    name = manifest["metadata"]["name"]
    try:
        api.create_custom_resource_definition(crd)
    except ApiException as error:
        if error.status != 409:
            raise
        current = api.read_custom_resource_definition(name)
        crd.metadata.resource_version = current.metadata.resource_version  # type: ignore[union-attr]
        api.replace_custom_resource_definition(name, crd)


def _listable(api_client: client.ApiClient, manifest: dict[str, Any]) -> bool:
    spec = manifest["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served", True))
    try:
        client.CustomObjectsApi(api_client).list_cluster_custom_object(
            spec["group"], version, spec["names"]["plural"], limit=1
        )
    except ApiException as error:
        if error.status == 429:
            return False
        raise
    return True


def _established(api: client.ApiextensionsV1Api, name: str) -> bool:
    crd = api.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)
