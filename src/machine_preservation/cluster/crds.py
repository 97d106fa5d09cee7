"""Installing the CRDs the product works with (MCM's Machine kinds and a Shoot stand-in)."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


def crd_manifests() -> list[dict[str, Any]]:
    """The CRD documents shipped with the package, in a stable order."""
    directory = resources.files("machine_preservation.cluster") / "crds"
    return [
        yaml.safe_load(entry.read_text())
        for entry in sorted(directory.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    ]


def install_crds(kubeconfig: Path, *, timeout: float = 60.0) -> None:
    """Create or replace every CRD, then wait until each is Established."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    with api_client:
        api = client.ApiextensionsV1Api(api_client)
        names = []
        for manifest in crd_manifests():
            names.append(manifest["metadata"]["name"])
            apply_crd(api, manifest)
        deadline = time.monotonic() + timeout
        for name in names:
            while not _established(api, name):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established after {timeout}s")
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


def _established(api: client.ApiextensionsV1Api, name: str) -> bool:
    crd = api.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)
