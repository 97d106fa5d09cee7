"""The startup check against the real apiserver: a CRD without the field really prunes it, the check
says so with the fix, and the CLI exits with that error instead of starting."""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.cluster.crds import crd_manifests
from machine_preservation.controller.crd_check import CrdCheckFailed, verify_machine_crd
from tests.controller.support import eventually

GROUP = "prune-check.machine-preservation.test"


@pytest.fixture
async def pruning_crd(api: client.ApiClient) -> AsyncIterator[str]:
    """A copy of our Machine CRD in another group, without preserveExpiryTime (as an older MCM's)."""
    crd: dict[str, Any] = copy.deepcopy(
        next(m for m in crd_manifests() if m["metadata"]["name"] == "machines.machine.sapcloud.io")
    )
    name = f"machines.{GROUP}"
    crd["metadata"] = {"name": name}
    crd["spec"]["group"] = GROUP
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["status"]["properties"]["currentStatus"]["properties"]["preserveExpiryTime"]
    extensions = client.ApiextensionsV1Api(api)
    await extensions.create_custom_resource_definition(crd)  # type: ignore[arg-type]

    async def established() -> bool:
        current = await extensions.read_custom_resource_definition(name)
        conditions = (current.status.conditions if current.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await eventually(established)
    yield name
    await extensions.delete_custom_resource_definition(name)


async def test_the_installed_machine_crd_passes(api: client.ApiClient) -> None:
    await verify_machine_crd(api)


async def test_a_crd_without_the_field_prunes_it_and_the_check_names_the_fix(
    api: client.ApiClient, namespace: str, pruning_crd: str
) -> None:
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "Machine", "metadata": {"name": "m"}, "spec": {}}
    await custom.create_namespaced_custom_object(GROUP, "v1alpha1", namespace, "machines", body)
    status = {"status": {"currentStatus": {"phase": "Failed", "preserveExpiryTime": "2030-01-01T00:00:00Z"}}}
    written = await custom.patch_namespaced_custom_object_status(
        GROUP, "v1alpha1", namespace, "machines", "m", status, _content_type="application/merge-patch+json"
    )
    assert isinstance(written, dict)
    assert written["status"]["currentStatus"] == {"phase": "Failed"}, "the apiserver pruned the expiry"

    with pytest.raises(CrdCheckFailed) as failed:
        await verify_machine_crd(api, name=pruning_crd)
    assert f"The Machine CRD {pruning_crd} (v1alpha1) would prune status.currentStatus.preserveExpiryTime" in str(
        failed.value
    )
    assert "Fix:" in str(failed.value)


async def test_the_cli_refuses_to_start_when_the_check_fails(kubeconfig_for: Any, namespace: str) -> None:
    # An identity that may not read CRDs: the check cannot confirm the schema, so the controller must not run.
    kubeconfig = kubeconfig_for("nobody")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "machine_preservation",
        "controller",
        f"--control-kubeconfig={kubeconfig}",
        f"--target-kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--metrics-port=0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "error: Cannot read the Machine CRD machines.machine.sapcloud.io: HTTP 403" in stderr.decode()
