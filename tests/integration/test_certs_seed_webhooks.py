"""The seed's Machine webhook configuration, kept by the certs manager, on a real kube-apiserver.

gardenlet hands the seed chart to the seed's gardener-resource-manager (GRM), which re-applies every rendered
object on each sync. The chart therefore renders the ValidatingWebhookConfiguration for GRM to create once
(`resources.gardener.cloud/ignore`), and its manifest in a ConfigMap: the certs manager keeps the configuration as
the manifest says, with the caBundle, by patching it; it cannot create one. Here the chart's objects are created as
GRM creates them, the certs manager runs with the rendered arguments under the rendered ServiceAccount (so the
chart's RBAC is what it gets), the chart's objects are re-applied with a plain update as GRM re-applies them, and
the manifest changes as a chart upgrade changes it."""

from __future__ import annotations

import asyncio
import base64
import copy
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as sync_client
from kubernetes.aio import client, config

from machine_preservation.certs import commands as certs_commands
from machine_preservation.certs.manager import CertificateManager
from machine_preservation.cli.main import build_parser
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration import chart as standalone

CHART = Path(__file__).resolve().parents[2] / "charts" / "gardener-extension-machine-preservation"
CERTS = "gardener-extension-machine-preservation-certs"
MOUNT = "/etc/machine-preservation/seed-webhooks"
DELETION = "deletion.machines.machine-preservation.sapcloud.io"


def remove(toolchain: Toolchain, kubeconfig: Path, documents: list[dict[str, Any]]) -> None:
    subprocess.run(
        [str(toolchain.kubectl), f"--kubeconfig={kubeconfig}", "delete", "--ignore-not-found", "-f", "-"],
        input=yaml.safe_dump_all(documents),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def remove_installation(
    toolchain: Toolchain, kubeconfig: Path, cluster_scoped: list[dict[str, Any]], *, release: str, namespace: str
) -> None:
    """What a test's installation leaves behind: its cluster-scoped objects, the seed webhook configuration and the
    namespace."""
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": release},
    }
    namespaced = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    remove(toolchain, kubeconfig, [*cluster_scoped, configuration, namespaced])


def reapplied(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What GRM updates on a sync: every object, except those it only creates (`resources.gardener.cloud/ignore`:
    the Secrets the certs manager fills)."""
    return [
        d
        for d in documents
        if (d["metadata"].get("annotations") or {}).get("resources.gardener.cloud/ignore") != "true"
    ]


def render(toolchain: Toolchain, tmp_path: Path, *, namespace: str, release: str) -> list[dict[str, Any]]:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"gardener": {"version": "v1.150.0", "seed": {"name": "aws-eu1"}}}))
    result = standalone.helm(
        toolchain.helm, "template", release, str(CHART), "--namespace", namespace, "-f", str(values)
    )
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture
def extension_namespace(kube_client: sync_client.ApiClient) -> str:
    """The extension namespace gardenlet creates; the test deletes it itself (that is part of what it checks)."""
    name = f"extension-mp-{uuid.uuid4().hex[:6]}"
    sync_client.CoreV1Api(kube_client).create_namespace(
        {"metadata": {"name": name, "labels": {"gardener.cloud/role": "extension"}}}
    )
    return name


@pytest.fixture
async def admin(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api_client = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api_client:
        yield api_client


async def service_account_kubeconfig(
    admin: client.ApiClient, control_plane: ControlPlane, namespace: str, name: str, directory: Path
) -> Path:
    """A kubeconfig with a token of the ServiceAccount (TokenRequest): the process gets the chart's RBAC."""
    answer = await client.CoreV1Api(admin).create_namespaced_service_account_token(
        name,
        namespace,
        {"spec": {"audiences": [control_plane.issuer], "expirationSeconds": 3600}},  # type: ignore[arg-type]
    )
    assert answer.status is not None
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    for user in kubeconfig["users"]:
        user["user"] = {"token": answer.status.token}
    path = directory / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


def bundles(configuration: sync_client.V1ValidatingWebhookConfiguration) -> list[bytes]:
    return [base64.b64decode(w.client_config.ca_bundle or "") for w in configuration.webhooks]


async def test_the_certs_manager_creates_keeps_and_updates_the_seed_configuration(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: sync_client.ApiClient,
    admin: client.ApiClient,
    extension_namespace: str,
    tmp_path: Path,
    seed_system: None,
) -> None:
    namespace = extension_namespace
    release = f"mp-{namespace[-6:]}"
    documents = render(toolchain, tmp_path, namespace=namespace, release=release)
    cluster_scoped = [d for d in documents if "namespace" not in d["metadata"]]
    # Created once, never updated by GRM (it would wipe the caBundle).
    assert {(d["kind"], d["metadata"]["name"]) for d in documents if d not in reapplied(documents)} == {
        ("Secret", "gardener-extension-machine-preservation-webhook-certs"),
        ("Secret", "gardener-extension-machine-preservation-webhook-tls"),
        ("ValidatingWebhookConfiguration", release),
    }
    registration = sync_client.AdmissionregistrationV1Api(kube_client)
    core = sync_client.CoreV1Api(kube_client)
    try:
        # GRM creates the chart's objects.
        standalone.kubectl(toolchain.kubectl, control_plane.kubeconfig, "create", documents=documents)
        # The kubelet's view of the ConfigMap, mounted into the certs manager.
        config_map = standalone.find(documents, "ConfigMap", "gardener-extension-machine-preservation-seed-webhooks")
        mounted = tmp_path / "seed-webhooks"
        mounted.mkdir()
        for key, text in config_map["data"].items():
            (mounted / key).write_text(text)
        manifest = yaml.safe_load(config_map["data"]["validatingwebhookconfiguration.yaml"])
        assert manifest["metadata"]["name"] == release

        # The rendered certs manager, under its ServiceAccount.
        certs = standalone.find(documents, "Deployment", CERTS)["spec"]["template"]["spec"]["containers"][0]
        args = [a.replace(MOUNT, str(mounted)) for a in certs["args"]]
        settings = certs_commands.settings_from(build_parser().parse_args(args))
        kubeconfig = await service_account_kubeconfig(admin, control_plane, namespace, CERTS, tmp_path)
        async with await config.new_client_from_config(config_file=str(kubeconfig)) as as_certs:
            manager = CertificateManager(settings=settings, api_client=as_certs, remote_clients={})
            first = await manager.sync_once()
            assert first.injected == (f"validating/{release}",)
            live = registration.read_validating_webhook_configuration(release)
            secret = core.read_namespaced_secret("gardener-extension-machine-preservation-webhook-certs", namespace)
            trusted = base64.b64decode(secret.data["ca-bundle.crt"])
            assert bundles(live) == [trusted, trusted]
            assert [w.name for w in live.webhooks] == [w["name"] for w in manifest["webhooks"]]
            assert (await manager.sync_once()).injected == (), "nothing to do: the defaulted object is as wanted"

            # GRM's next sync: every rendered object re-applied with a plain update. The configuration is not among
            # them any more, so its caBundle survives.
            standalone.kubectl(toolchain.kubectl, control_plane.kubeconfig, "replace", documents=reapplied(documents))
            assert bundles(registration.read_validating_webhook_configuration(release)) == [trusted, trusted]
            assert (await manager.sync_once()).injected == ()

            # What GRM did with the old chart (the configuration as rendered, without caBundle): repaired next pass.
            stripped = registration.read_validating_webhook_configuration(release)
            for webhook in stripped.webhooks:
                webhook.client_config.ca_bundle = None
            registration.replace_validating_webhook_configuration(release, stripped)
            assert bundles(registration.read_validating_webhook_configuration(release)) == [b"", b""]
            assert (await manager.sync_once()).injected == (f"validating/{release}",)
            assert bundles(registration.read_validating_webhook_configuration(release)) == [trusted, trusted]

            # A chart upgrade with one more matchCondition: the ConfigMap changes, the kubelet refreshes the file,
            # the next pass brings the live object there, caBundle and all.
            upgraded = copy.deepcopy(manifest)
            deletion = next(w for w in upgraded["webhooks"] if w["name"] == DELETION)
            deletion["matchConditions"].append({"name": "not-a-dry-run", "expression": "!request.dryRun"})
            config_map["data"] = {key: yaml.safe_dump(upgraded) for key in config_map["data"]}
            for key, text in config_map["data"].items():
                (mounted / key).write_text(text)
            assert (await manager.sync_once()).injected == (f"validating/{release}",)
            live = registration.read_validating_webhook_configuration(release)
            conditions = next(w for w in live.webhooks if w.name == DELETION).match_conditions
            assert [c.name for c in conditions] == [c["name"] for c in deletion["matchConditions"]]
            assert conditions[-1].name == "not-a-dry-run"
            assert bundles(live) == [trusted, trusted]
            # GRM's syncs of the upgraded chart leave it so.
            standalone.kubectl(toolchain.kubectl, control_plane.kubeconfig, "replace", documents=reapplied(documents))
            assert bundles(registration.read_validating_webhook_configuration(release)) == [trusted, trusted]
            assert (await manager.sync_once()).injected == ()

            # GRM deletes the installation's objects, this one too (`ignore` only spares it updates): the certs
            # manager, still running for a moment, never brings it back.
            registration.delete_validating_webhook_configuration(release)
            assert (await manager.sync_once()).injected == ()
            names = {c.metadata.name for c in registration.list_validating_webhook_configuration().items}
            assert release not in names
    finally:
        await asyncio.to_thread(
            remove_installation,
            toolchain,
            control_plane.kubeconfig,
            cluster_scoped,
            release=release,
            namespace=namespace,
        )
