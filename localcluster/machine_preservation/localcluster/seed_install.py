"""The Gardener seed chart installed as gardenlet installs it, on a local seed (developer tooling for the
end-to-end tests and the playground; not part of the image).

gardenlet renders charts/gardener-extension-machine-preservation with the values it injects (`gardenlet_values`)
into the extension namespace. Here the rendered ServiceAccounts and RBAC are applied as they are, and the
webhook and extension processes run on this machine with the rendered container arguments, authenticated as the
rendered ServiceAccounts (tokens from the TokenRequest API), so the chart's RBAC is what they get. What only a
pod has is replaced: listen addresses and ports (127.0.0.1, free ports), the certificate directory (the webhook's
own self-signed certificate for 127.0.0.1 instead of the certs manager's), the webhook's URL (127.0.0.1 instead
of the Service), and the kubeconfig (in-cluster config becomes a token kubeconfig).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio import client

from machine_preservation.localcluster.controlplane import ControlPlane

RELEASE = "machine-preservation"
CHART_NAME = "gardener-extension-machine-preservation"
EXTENSION_DEPLOYMENT = CHART_NAME
WEBHOOK_DEPLOYMENT = f"{CHART_NAME}-webhook"
# The kinds that make up the components' identities and rights (the admission policy limits what RBAC cannot name).
IDENTITY_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
TOKEN_SECONDS = 24 * 3600


def seed_chart_directory() -> Path:
    # localcluster/machine_preservation/localcluster/seed_install.py -> repository root
    chart = Path(__file__).resolve().parents[3] / "charts" / CHART_NAME
    if not chart.is_dir():
        raise FileNotFoundError(f"the seed chart is not at {chart}: run this from a source checkout")
    return chart


def gardenlet_values(*, seed_name: str = "local") -> dict[str, Any]:
    """Every value gardenlet v1.150 can merge over an extension's chart values (pkg/gardenlet/controller/
    controllerinstallation/controllerinstallation/reconciler.go), as it would for a self-hosted shoot cluster that
    is a Seed too, with the garden kubeconfig injected, on gardenadm's bootstrap control plane node: so the local
    seed's chart passes the schema check every v1.150 gardenlet's does. The chart reads only gardener.seed.name."""
    networks = {
        "nodes": "10.3.0.0/16",
        "pods": "10.1.0.0/16",
        "services": "10.2.0.0/16",
        "shootDefaults": {"pods": "10.4.0.0/16", "services": "10.5.0.0/16"},
        "blockCIDRs": [],
        "ipFamilies": ["IPv4"],
    }
    return {
        "gardener": {
            "version": "v1.150.0",
            "garden": {"clusterIdentity": "local-garden", "genericKubeconfigSecretName": "generic-garden-kubeconfig"},
            "seed": {
                "name": seed_name,
                "clusterIdentity": f"{seed_name}-seed",
                "annotations": {},
                "labels": {"seed.gardener.cloud/provider": "local"},
                "provider": "local",
                "region": "local",
                "volumeProvider": "",
                "volumeProviders": [],
                "ingressDomain": f"ingress.{seed_name}.seed.local",
                "protected": False,
                "visible": True,
                "taints": [],
                "networks": networks,
                "blockCIDRs": [],
                "spec": {
                    "provider": {"type": "local", "region": "local"},
                    "networks": copy.deepcopy(networks),
                    "ingress": {"domain": f"ingress.{seed_name}.seed.local"},
                    "settings": {"scheduling": {"visible": True}},
                },
            },
            # features.DefaultFeatureGate.GetAll(): every gate gardenlet v1.150 knows, at its default.
            "gardenlet": {
                "featureGates": {
                    "AllAlpha": False,
                    "AllBeta": False,
                    "BackupEntryForGarden": True,
                    "CloudProfileCapabilities": True,
                    "CustomDNSServerInNodeLocalDNS": True,
                    "DefaultSeccompProfile": False,
                    "DisableNginxIngressInGarden": True,
                    "DisableNginxIngressInSeed": True,
                    "DisableNginxIngressInShoot": False,
                    "DoNotCopyBackupCredentials": True,
                    "InPlaceNodeUpdates": False,
                    "IstioTLSTermination": True,
                    "LiveControlPlaneMigration": False,
                    "OpenTelemetryCollector": True,
                    "PrometheusHealthChecks": False,
                    "RemoveHTTPProxyLegacyPort": False,
                    "RemoveVali": False,
                    "VPNBondingModeRoundRobin": False,
                    "VersionClassificationLifecycle": False,
                    "VictoriaLogsBackend": False,
                }
            },
            # A self-hosted shoot that is a Seed is named as the Seed.
            "selfHostedShootCluster": True,
            "shoot": {
                "name": seed_name,
                "namespace": "garden",
                "labels": {},
                "annotations": {},
                "spec": {"provider": {"type": "local"}, "region": "local"},
                "clusterIdentity": f"{seed_name}-shoot",
            },
        },
        # Free ports gardenadm found on the bootstrap control plane node; the chart uses none.
        "usablePorts": [39001, 39002, 39003, 39004, 39005],
    }


def render(
    helm: Path, *, namespace: str, values: Mapping[str, Any], directory: Path, release: str = RELEASE
) -> list[dict[str, Any]]:
    """`helm template` of the seed chart as `release` (gardenlet: the registration's name) in `namespace`; another
    release name keeps the cluster-wide RBAC of installations side by side apart."""
    directory.mkdir(parents=True, exist_ok=True)
    values_file = directory / "values.yaml"
    values_file.write_text(yaml.safe_dump(dict(values)))
    result = subprocess.run(
        [str(helm), "template", release, str(seed_chart_directory()), "--namespace", namespace, "-f", str(values_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def find(documents: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for document in documents:
        if document.get("kind") == kind and document["metadata"]["name"] == name:
            return dict(document)
    raise LookupError(f"the chart renders no {kind} {name}")


def container_args(documents: Iterable[Mapping[str, Any]], deployment: str, container: str | None = None) -> list[str]:
    """The arguments of a rendered Deployment's container named `container` (None: its first)."""
    containers = find(documents, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    chosen = containers[0] if container is None else next(c for c in containers if c["name"] == container)
    return list(chosen.get("args") or [])


def service_account_of(documents: Iterable[Mapping[str, Any]], deployment: str) -> str:
    spec = find(documents, "Deployment", deployment)["spec"]["template"]["spec"]
    return str(spec["serviceAccountName"])


def replace_args(args: Sequence[str], replacements: Mapping[str, str | None], extra: Sequence[str] = ()) -> list[str]:
    """`args` with each `--flag=...` named in `replacements` set to its value (None: dropped), then `extra`."""
    result: list[str] = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in replacements:
            value = replacements[flag]
            if value is not None:
                result.append(f"{flag}={value}")
        else:
            result.append(arg)
    return [*result, *extra]


def identities(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rendered ServiceAccounts, RBAC and admission policies, as they are (`product.apply_manifests` creates
    them)."""
    return [dict(document) for document in documents if document.get("kind") in IDENTITY_KINDS]


async def service_account_kubeconfig(
    admin: client.ApiClient, seed: ControlPlane, *, namespace: str, name: str, path: Path
) -> Path:
    """A kubeconfig with a token of ServiceAccount `namespace/name` (TokenRequest), for a process off-cluster."""
    request = {"spec": {"audiences": [seed.issuer], "expirationSeconds": TOKEN_SECONDS}}
    answer = await client.CoreV1Api(admin).create_namespaced_service_account_token(
        name,
        namespace,
        request,  # type: ignore[arg-type]
    )
    assert answer.status is not None
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "seed",
        "clusters": [
            {
                "name": "seed",
                "cluster": {
                    "server": seed.server,
                    "certificate-authority-data": base64.b64encode(seed.ca.cert_pem).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": {"token": answer.status.token}}],
        "contexts": [{"name": "seed", "context": {"cluster": "seed", "user": name}}],
    }
    await asyncio.to_thread(_write_private, path, yaml.safe_dump(config))
    return path


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)


def seed_webhook_configuration(documents: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The seed's Machine ValidatingWebhookConfiguration the chart asks for: rendered as it is, or as the manifest
    the certs manager keeps in force (a ConfigMap holding it)."""
    for document in documents:
        if document.get("kind") == "ValidatingWebhookConfiguration":
            return dict(document)
        if document.get("kind") == "ConfigMap":
            for text in (document.get("data") or {}).values():
                candidate = yaml.safe_load(text)
                if isinstance(candidate, dict) and candidate.get("kind") == "ValidatingWebhookConfiguration":
                    return candidate
    raise LookupError("the chart renders no seed ValidatingWebhookConfiguration")


def served_by(configuration: Mapping[str, Any], *, url: str, ca_bundle: bytes) -> dict[str, Any]:
    """`configuration` with each webhook's Service reference replaced by `url` + its path, and the CA."""
    result = dict(configuration)
    webhooks = []
    for webhook in configuration.get("webhooks") or []:
        path = (webhook.get("clientConfig", {}).get("service") or {}).get("path", "")
        client_config = {"url": url.rstrip("/") + path, "caBundle": base64.b64encode(ca_bundle).decode()}
        webhooks.append({**webhook, "clientConfig": client_config})
    result["webhooks"] = webhooks
    return result
