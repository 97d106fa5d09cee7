"""A CA rotation in a Gardener seed waits for the shoots: the certs manager, with the seed chart's arguments and
under its ServiceAccount (the chart's RBAC), moves the serving certificate to a new CA only once every shoot's
ManagedResource carrying the new bundle has been applied by that shoot's gardener-resource-manager (played here by
writing the ManagedResource's status as GRM does). Time is the manager's clock, moved by the test."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as sync_client
from kubernetes.aio import client, config

from machine_preservation.certs import commands as certs_commands
from machine_preservation.certs.manager import CertificateManager
from machine_preservation.certs.pairs import issued_by, load_certificates
from machine_preservation.cli.main import build_parser
from machine_preservation.core.gardener import shoot_resources as sr
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration import chart as standalone
from tests.integration.test_certs_seed_webhooks import (
    CERTS,
    MOUNT,
    admin,
    extension_namespace,
    remove_installation,
    render,
    service_account_kubeconfig,
)

__all__ = ["admin", "extension_namespace"]

RESOURCES = ("resources.gardener.cloud", "v1alpha1")
SECRET = "gardener-extension-machine-preservation-webhook-certs"


@pytest.fixture(scope="module")
def managed_resources_crd(control_plane: ControlPlane) -> None:
    gardener.install_seed_crds(control_plane.kubeconfig, operator=False)


@pytest.fixture
def shoot_namespaces(kube_client: sync_client.ApiClient) -> Iterator[list[str]]:
    core = sync_client.CoreV1Api(kube_client)
    names = [f"shoot--ca--{uuid.uuid4().hex[:5]}" for _ in range(2)]
    for name in names:
        core.create_namespace({"metadata": {"name": name}})
    yield names
    for name in names:
        core.delete_namespace(name)


async def test_the_serving_certificate_moves_to_a_new_ca_once_every_shoot_applied_it(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: sync_client.ApiClient,
    admin: client.ApiClient,
    extension_namespace: str,
    shoot_namespaces: list[str],
    managed_resources_crd: None,
    seed_system: None,
    tmp_path: Path,
) -> None:
    namespace = extension_namespace
    release = f"mp-{namespace[-6:]}"
    documents = render(toolchain, tmp_path, namespace=namespace, release=release)
    custom = sync_client.CustomObjectsApi(kube_client)
    core = sync_client.CoreV1Api(kube_client)

    def put_resource(shoot: str, bundle: bytes, *, applied: bool) -> None:
        """The extension's ManagedResource made with `bundle` (annotated), and GRM's status for it."""
        annotations = {sr.CA_BUNDLE_ANNOTATION: sr.ca_bundle_digest(bundle)}
        try:
            current = custom.get_namespaced_custom_object(*RESOURCES, shoot, "managedresources", sr.MANAGED_RESOURCE)
        except sync_client.ApiException:
            _, resource = sr.managed_resource(shoot, [], ca_bundle=bundle)
            current = custom.create_namespaced_custom_object(*RESOURCES, shoot, "managedresources", resource)
        else:
            # A new bundle makes new objects, so a new data Secret: the spec changes, the generation moves on.
            secret = f"data-{sr.ca_bundle_digest(bundle)[:8]}"
            patch = {"metadata": {"annotations": annotations}, "spec": {"secretRefs": [{"name": secret}]}}
            current = custom.patch_namespaced_custom_object(
                *RESOURCES, shoot, "managedresources", sr.MANAGED_RESOURCE, patch
            )
        generation = current["metadata"]["generation"]
        status: dict[str, Any] = {
            "observedGeneration": generation if applied else generation - 1,
            "conditions": [
                {
                    "type": sr.RESOURCES_APPLIED,
                    "status": "True",
                    "reason": "ApplySucceeded",
                    "message": "All resources are applied.",
                    "lastTransitionTime": "2026-11-28T00:00:00Z",
                    "lastUpdateTime": "2026-11-28T00:00:00Z",
                }
            ],
        }
        custom.patch_namespaced_custom_object_status(
            *RESOURCES, shoot, "managedresources", sr.MANAGED_RESOURCE, {"status": status}
        )

    def stored() -> dict[str, bytes]:
        data = core.read_namespaced_secret(SECRET, namespace).data or {}
        return {key: base64.b64decode(value) for key, value in data.items()}

    cluster_scoped = [d for d in documents if "namespace" not in d["metadata"]]
    try:
        standalone.kubectl(toolchain.kubectl, control_plane.kubeconfig, "create", documents=documents)
        config_map = standalone.find(documents, "ConfigMap", "gardener-extension-machine-preservation-seed-webhooks")
        mounted = tmp_path / "seed-webhooks"
        mounted.mkdir()
        for key, text in config_map["data"].items():
            (mounted / key).write_text(text)
        certs = standalone.find(documents, "Deployment", CERTS)["spec"]["template"]["spec"]["containers"][0]
        args = [a.replace(MOUNT, str(mounted)) for a in certs["args"]]
        assert f"--shoot-managed-resource={sr.MANAGED_RESOURCE}" in args
        settings = certs_commands.settings_from(build_parser().parse_args(args))
        policy = settings.policy
        now = [dt.datetime.now(dt.UTC)]
        kubeconfig = await service_account_kubeconfig(admin, control_plane, namespace, CERTS, tmp_path)
        async with await config.new_client_from_config(config_file=str(kubeconfig)) as as_certs:
            manager = CertificateManager(
                settings=settings, api_client=as_certs, remote_clients={}, clock=lambda: now[0]
            )
            await manager.sync_once()
            (ca,) = load_certificates(stored()["ca.crt"])
            rotate_at = ca.not_valid_after_utc - policy.ca_rotate_before
            # Shortly before the CA's rotation time, with a serving certificate renewed as the loop keeps it.
            now[0] = rotate_at - dt.timedelta(hours=1)
            await manager.sync_once()
            first = stored()
            for shoot in shoot_namespaces:
                put_resource(shoot, first["ca-bundle.crt"], applied=True)
            assert not (await manager.sync_once()).rotated

            # Step 1 at the CA's rotation time: the new CA joins the bundle (and is injected into the seed's
            # configuration); the serving certificate stays with the old CA.
            now[0] = rotate_at + dt.timedelta(seconds=1)
            assert (await manager.sync_once()).rotated
            rotated = stored()
            assert len(load_certificates(rotated["ca-bundle.crt"])) == 2
            assert rotated["tls.crt"] == first["tls.crt"]

            # Past the propagation delay, the seed's configuration trusts the new CA, but no shoot has applied it.
            now[0] += policy.propagation_delay + dt.timedelta(seconds=1)
            assert not (await manager.sync_once()).rotated
            assert stored()["tls.crt"] == first["tls.crt"]
            # One shoot applies it; the other's GRM has the new ManagedResource but has not applied it yet.
            put_resource(shoot_namespaces[0], rotated["ca-bundle.crt"], applied=True)
            put_resource(shoot_namespaces[1], rotated["ca-bundle.crt"], applied=False)
            assert not (await manager.sync_once()).rotated
            assert stored()["tls.crt"] == first["tls.crt"]
            # Every shoot has applied it: step 2.
            put_resource(shoot_namespaces[1], rotated["ca-bundle.crt"], applied=True)
            result = await manager.sync_once()
            assert "moving the serving certificate to the new CA" in result.rotated
            moved = stored()
            assert moved["tls.crt"] != first["tls.crt"]
            (serving,) = load_certificates(moved["tls.crt"])
            (new_ca,) = load_certificates(moved["ca.crt"])
            assert issued_by(serving, new_ca)
            assert not issued_by(serving, ca)
    finally:
        await asyncio.to_thread(
            remove_installation,
            toolchain,
            control_plane.kubeconfig,
            cluster_scoped,
            release=release,
            namespace=namespace,
        )
