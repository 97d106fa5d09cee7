"""The Gardener seed chart (charts/gardener-extension-machine-preservation) and the registration examples (example/),
on real tools: helm v4 renders the chart with the values gardenlet injects and checks them against the chart's
schema; a real kube-apiserver accepts every object, compiles the seed webhooks' CEL and routes (or does not route)
Machine deletes to a running webhook; the operator `Extension` CRD from the Gardener module accepts
example/extension.yaml; the Gardener API types (Go source of the module) know every field of
example/controller-registration.yaml."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from machine_preservation.certs import commands as certs_commands
from machine_preservation.certs.authority import service_dns_names
from machine_preservation.certs.rotation import CA_BUNDLE_KEY
from machine_preservation.cli.main import build_parser
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.gardener import shoot_resources
from machine_preservation.localcluster import seed_install
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.crds import apply_crd
from machine_preservation.localcluster.mcm import GARDENER_MODULE, GARDENER_VERSION, go_module_dir
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook import commands as webhook_commands
from machine_preservation.webhook.commands import write_self_signed
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.integration import chart as standalone
from tests.integration.seed_identity import seed_chart_identity
from tests.polling import eventually
from tests.webhook.configurations import registration_problems

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gardener-extension-machine-preservation"
EXAMPLES = ROOT / "example"
# As gardenlet names them: release = the ControllerRegistration's name, namespace extension-<registration>-<random>.
RELEASE = "machine-preservation"
NAMESPACE = "extension-machine-preservation-x7k2f"
NAME = "gardener-extension-machine-preservation"
WEBHOOK = f"{NAME}-webhook"
CERTS = f"{NAME}-certs"
SEED_WEBHOOKS = f"{NAME}-seed-webhooks"
CONTROLLER_USERNAME = f"system:serviceaccount:{NAMESPACE}:{NAME}"
MACHINES = ("machine.sapcloud.io", "v1alpha1")
OPERATOR_EXTENSION_CRD = "example/operator/10-crd-operator.gardener.cloud_extensions.yaml"
PORT_9443 = '[{"port":9443,"protocol":"TCP"}]'
PORT_9444 = '[{"port":9444,"protocol":"TCP"}]'
ENABLED_LABEL = "extensions.gardener.cloud/machine-preservation"

# What gardenlet v1.147 injects (pkg/gardenlet/controller/controllerinstallation/controllerinstallation), as JSON:
# nil maps and slices of the Seed arrive as null.
GARDENLET_VALUES: dict[str, Any] = {
    "gardener": {
        "version": "v1.147.1",
        "garden": {"clusterIdentity": "landscape-dev"},
        "gardenlet": {"featureGates": {"DefaultSeccompProfile": True, "IstioTLSTermination": False}},
        "seed": {
            "name": "aws-eu1",
            "clusterIdentity": "aws-eu1-7f3a2c",
            "annotations": None,
            "labels": {"seed.gardener.cloud/gardenlet": "true", "seed.gardener.cloud/provider": "aws"},
            "provider": "aws",
            "region": "eu-west-1",
            "volumeProvider": "",
            "volumeProviders": None,
            "ingressDomain": "ingress.aws-eu1.example.com",
            "protected": False,
            "visible": True,
            "taints": [{"key": "seed.gardener.cloud/protected"}],
            "networks": {"nodes": "10.250.0.0/16", "pods": "100.96.0.0/11", "services": "100.64.0.0/13"},
            "blockCIDRs": ["169.254.169.254/32"],
            "spec": {
                "provider": {"type": "aws", "region": "eu-west-1", "zones": ["eu-west-1a"]},
                "networks": {"nodes": "10.250.0.0/16", "pods": "100.96.0.0/11", "services": "100.64.0.0/13"},
                "settings": {"scheduling": {"visible": True}},
            },
        },
    }
}


def helm(toolchain: Toolchain, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return standalone.helm(toolchain.helm, *args, check=check)


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def render(
    toolchain: Toolchain,
    tmp_path: Path,
    values: dict[str, Any] | None = None,
    *,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    merged = {**GARDENLET_VALUES, **(values or {})}
    result = helm(
        toolchain, "template", release, str(CHART), "--namespace", namespace, "-f", str(values_file(tmp_path, merged))
    )
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture
def rendered(toolchain: Toolchain, tmp_path: Path) -> list[dict[str, Any]]:
    return render(toolchain, tmp_path)


def seed_webhook_configuration(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The seed ValidatingWebhookConfiguration's manifest, from the ConfigMap the certs manager mounts."""
    text = standalone.find(documents, "ConfigMap", SEED_WEBHOOKS)["data"]["validatingwebhookconfiguration.yaml"]
    manifest: dict[str, Any] = yaml.safe_load(text)
    assert manifest["kind"] == "ValidatingWebhookConfiguration"
    return manifest


def pod_spec(documents: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    spec: dict[str, Any] = standalone.find(documents, "Deployment", deployment)["spec"]["template"]["spec"]
    return spec


def container(documents: list[dict[str, Any]], deployment: str, name: str | None = None) -> dict[str, Any]:
    """The Deployment's only container, or the one called `name`."""
    containers = pod_spec(documents, deployment)["containers"]
    if name is None:
        assert len(containers) == 1
        only: dict[str, Any] = containers[0]
        return only
    named: dict[str, Any] = next(c for c in containers if c["name"] == name)
    return named


def webhook_containers(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = pod_spec(documents, WEBHOOK)["containers"]
    assert [c["name"] for c in containers] == ["webhook", "seed-webhook"]
    return containers


def rules(documents: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str, str]]:
    return {
        (group, resource, verb, ",".join(rule.get("resourceNames", [])))
        for rule in standalone.find(documents, kind, name)["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def expand(group: str, resources: str, verbs: str, names: str = "") -> set[tuple[str, str, str, str]]:
    return {(group, r, v, names) for r in resources.split() for v in verbs.split()}


# --- rendering and schema ------------------------------------------------------------------------------------


def test_lint_with_gardenlets_values(toolchain: Toolchain, tmp_path: Path) -> None:
    result = helm(
        toolchain,
        "lint",
        "--strict",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "-f",
        str(values_file(tmp_path, GARDENLET_VALUES)),
    )
    assert "0 chart(s) failed" in result.stdout


def test_the_installation_is_exactly_these_objects(rendered: list[dict[str, Any]]) -> None:
    prefix = f"extensions.gardener.cloud:{RELEASE}"
    assert sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in rendered) == sorted(
        [
            ("ServiceAccount", NAME, NAMESPACE),
            ("Deployment", NAME, NAMESPACE),
            ("ClusterRole", f"{prefix}:controller", ""),
            ("ClusterRoleBinding", f"{prefix}:controller", ""),
            ("Role", NAME, NAMESPACE),
            ("RoleBinding", NAME, NAMESPACE),
            # What RBAC cannot limit by name: the controller's writes of Secrets and ManagedResources.
            ("ValidatingAdmissionPolicy", f"{NAME}.{NAMESPACE}", ""),
            ("ValidatingAdmissionPolicyBinding", f"{NAME}.{NAMESPACE}", ""),
            ("ServiceAccount", WEBHOOK, NAMESPACE),
            ("Deployment", WEBHOOK, NAMESPACE),
            ("Service", WEBHOOK, NAMESPACE),
            ("PodDisruptionBudget", WEBHOOK, NAMESPACE),
            ("ClusterRole", f"{prefix}:webhook", ""),
            ("ClusterRoleBinding", f"{prefix}:webhook", ""),
            ("Secret", f"{WEBHOOK}-certs", NAMESPACE),
            ("Secret", f"{WEBHOOK}-tls", NAMESPACE),
            ("ServiceAccount", CERTS, NAMESPACE),
            ("Deployment", CERTS, NAMESPACE),
            ("Role", CERTS, NAMESPACE),
            ("RoleBinding", CERTS, NAMESPACE),
            ("ClusterRole", f"{prefix}:seed-webhooks", ""),
            ("ClusterRoleBinding", f"{prefix}:seed-webhooks", ""),
            ("ClusterRole", f"{prefix}:shoot-ca", ""),
            ("ClusterRoleBinding", f"{prefix}:shoot-ca", ""),
            # The seed webhook configuration, created once (the seed's gardener-resource-manager would wipe its
            # caBundle on every sync), and its manifest, which the certs manager keeps it to.
            ("ValidatingWebhookConfiguration", RELEASE, ""),
            ("ConfigMap", SEED_WEBHOOKS, NAMESPACE),
            # What a seed's monitoring, VPA and disruption handling take from an extension.
            ("Service", f"{NAME}-metrics", NAMESPACE),
            ("Service", f"{WEBHOOK}-metrics", NAMESPACE),
            ("ServiceMonitor", WEBHOOK, NAMESPACE),
            ("PodDisruptionBudget", NAME, NAMESPACE),
            ("VerticalPodAutoscaler", NAME, NAMESPACE),
            ("VerticalPodAutoscaler", WEBHOOK, NAMESPACE),
            ("VerticalPodAutoscaler", CERTS, NAMESPACE),
            ("PrometheusRule", NAME, NAMESPACE),
            ("ConfigMap", f"{NAME}-dashboard-{NAMESPACE}", "garden"),
        ]
    )
    # The Secrets are rendered empty: the certs manager owns their data, and gardener-resource-manager only creates
    # them (it would wipe `data` on every sync otherwise).
    secrets = [d for d in rendered if d["kind"] == "Secret"]
    assert all("data" not in d for d in secrets)
    # Likewise the seed webhook configuration: the certs manager keeps its webhooks and caBundle.
    created_once = [*secrets, standalone.find(rendered, "ValidatingWebhookConfiguration", RELEASE)]
    assert all(d["metadata"]["annotations"] == {"resources.gardener.cloud/ignore": "true"} for d in created_once)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # A typo in our own values is still caught, at any depth.
        ({"contoller": {"workers": 2}, "controller": {"wrokers": 2}}, "at '/controller': additional properties"),
        ({"webhook": {"timeoutSecnds": 5}}, "at '/webhook': additional properties 'timeoutSecnds' not allowed"),
        (
            {"gardener": {**GARDENLET_VALUES["gardener"], "seed": {"name": "s", "protected": "no"}}},
            "/gardener/seed/protected",
        ),
        ({"gardener": {"gardenlet": {"featureGates": {"X": "on"}}}}, "/gardener/gardenlet/featureGates/X"),
        ({"webhook": {"replicas": 1}}, "/webhook/replicas"),
        ({"controller": {"workers": 0}}, "/controller/workers"),
        ({"controller": {"extensionWorkers": 0}}, "/controller/extensionWorkers"),
        ({"controller": {"maxConcurrentReconciles": 0}}, "/controller/maxConcurrentReconciles"),
        ({"controller": {"shootNodeBudget": -1}}, "/controller/shootNodeBudget"),
        ({"controller": {"machinePreserveTimeout": "3d"}}, "/controller/machinePreserveTimeout"),
        ({"webhook": {"timeoutSeconds": 30}}, "/webhook/timeoutSeconds"),
    ],
    ids=[
        "our-controller-typo",
        "our-webhook-typo",
        "seed-type",
        "feature-gate-type",
        "replicas",
        "workers",
        "extension-workers",
        "max-concurrent-reconciles",
        "shoot-node-budget",
        "duration",
        "timeout",
    ],
)
def test_schema_rejects(toolchain: Toolchain, tmp_path: Path, values: dict[str, Any], message: str) -> None:
    merged = {**GARDENLET_VALUES, **values}
    result = helm(toolchain, "template", RELEASE, str(CHART), "-f", str(values_file(tmp_path, merged)), check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


# --- what gardenlet v1.150 injects ----------------------------------------------------------------------------
# pkg/gardenlet/controller/controllerinstallation/controllerinstallation/reconciler.go of Gardener v1.150.0 merges
# these over the ControllerDeployment's values (l. 284-374), as JSON (nil maps and slices arrive as null):
# - always: gardener.version (l. 286), gardener.garden.clusterIdentity (l. 287-289; empty in gardenadm) and
#   gardener.gardenlet.featureGates (l. 279-292: every gate gardenlet knows, on or off);
# - with a Seed (the ControllerInstallation's seedRef, or a self-hosted shoot that is a Seed too, l. 153-172):
#   gardener.seed.{name, clusterIdentity, annotations, labels, provider, region, volumeProvider, volumeProviders,
#   protected, visible, taints, networks, blockCIDRs, spec} (l. 295-323), and ingressDomain (l. 325-327);
# - in a self-hosted shoot cluster (gardenadm, or the shoot's own gardenlet): gardener.selfHostedShootCluster
#   (l. 332-333) and gardener.shoot.{name, namespace, labels, annotations, spec} (l. 335-341), and clusterIdentity
#   once the shoot has one (l. 343-345);
# - with the ControllerDeployment's injectGardenKubeconfig: gardener.garden.genericKubeconfigSecretName (l. 350-352);
# - on gardenadm's bootstrap control plane node: the top-level usablePorts, five free ports (l. 356-362, 725-736).

# features.DefaultFeatureGate.GetAll() (pkg/features/features.go), with Kubernetes' AllAlpha and AllBeta.
V1_150_FEATURE_GATES: dict[str, bool] = {
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
V1_150_NETWORKS: dict[str, Any] = {
    "nodes": "10.250.0.0/16",
    "pods": "100.96.0.0/11",
    "services": "100.64.0.0/13",
    "shootDefaults": {"pods": "100.80.0.0/12", "services": "100.112.0.0/13"},
    "blockCIDRs": ["169.254.169.254/32"],
    "ipFamilies": ["IPv4"],
}


def gardenlet_v1_150(
    *,
    seed: bool = True,
    self_hosted: bool = False,
    shoot_identity: bool = True,
    garden_kubeconfig: bool = False,
    usable_ports: bool = False,
    garden_identity: str = "landscape-dev",
) -> dict[str, Any]:
    """The values gardenlet v1.150 merges over an extension chart's, built as its reconciler builds them: `seed`
    with a Seed; `self_hosted` in a self-hosted shoot cluster (with `seed`: one that is a Seed too), the shoot with
    its cluster identity if `shoot_identity`; `garden_kubeconfig` for a ControllerDeployment with
    injectGardenKubeconfig; `usable_ports` on gardenadm's bootstrap control plane node."""
    gardener: dict[str, Any] = {
        "version": "v1.150.0",
        "garden": {"clusterIdentity": garden_identity},
        "gardenlet": {"featureGates": dict(V1_150_FEATURE_GATES)},
    }
    if seed:
        gardener["seed"] = {
            "name": "root",
            "clusterIdentity": "root-7f3a2c",
            "annotations": None,
            "labels": {"seed.gardener.cloud/provider": "local"},
            "provider": "local",
            "region": "local",
            "volumeProvider": "local-path",
            "volumeProviders": [{"purpose": "etcd-main", "name": "local-path"}],
            "protected": True,
            "visible": True,
            "taints": [{"key": "seed.gardener.cloud/protected"}],
            "networks": V1_150_NETWORKS,
            "blockCIDRs": V1_150_NETWORKS["blockCIDRs"],
            "spec": {
                "provider": {"type": "local", "region": "local", "zones": ["0"]},
                "networks": V1_150_NETWORKS,
                "ingress": {"domain": "ingress.root.local.gardener.cloud", "controller": {"kind": "nginx"}},
                "settings": {"scheduling": {"visible": True}},
                "taints": [{"key": "seed.gardener.cloud/protected"}],
                "volume": {"providers": [{"purpose": "etcd-main", "name": "local-path"}]},
            },
            "ingressDomain": "ingress.root.local.gardener.cloud",
        }
    if self_hosted:
        gardener["selfHostedShootCluster"] = True
        gardener["shoot"] = {
            "name": "root",
            "namespace": "garden",
            "labels": None,
            "annotations": {"gardener.cloud/created-by": "gardenadm"},
            "spec": {
                "provider": {
                    "type": "local",
                    "workers": [{"name": "control-plane", "minimum": 1, "maximum": 1, "controlPlane": {}}],
                },
                "kubernetes": {"version": "1.34.1"},
                "networking": {"type": "calico", "nodes": "10.250.0.0/16"},
                "region": "local",
            },
        }
        if shoot_identity:
            gardener["shoot"]["clusterIdentity"] = "root-garden-1a2b3c"
    if garden_kubeconfig:
        gardener["garden"]["genericKubeconfigSecretName"] = "generic-garden-kubeconfig-81f9a2b5"
    values: dict[str, Any] = {"gardener": gardener}
    if usable_ports:
        values["usablePorts"] = [39001, 39002, 39003, 39004, 39005]
    # As JSON, as gardenlet hands them to Helm (and no YAML aliases for the networks named twice).
    copied: dict[str, Any] = json.loads(json.dumps(values))
    return copied


# Every key at once: a self-hosted shoot that is a Seed too, with the garden kubeconfig, on the bootstrap node.
EVERY_V1_150_VALUE = gardenlet_v1_150(seed=True, self_hosted=True, garden_kubeconfig=True, usable_ports=True)


@pytest.mark.parametrize(
    ("values", "seed_name"),
    [
        (gardenlet_v1_150(), "root"),
        (gardenlet_v1_150(garden_kubeconfig=True), "root"),
        (gardenlet_v1_150(seed=False, self_hosted=True), None),
        (gardenlet_v1_150(seed=True, self_hosted=True), "root"),
        (
            gardenlet_v1_150(seed=False, self_hosted=True, shoot_identity=False, usable_ports=True, garden_identity=""),
            None,
        ),
        (EVERY_V1_150_VALUE, "root"),
    ],
    ids=["seed", "garden-kubeconfig", "self-hosted-shoot", "self-hosted-seed", "gardenadm-bootstrap", "every-key"],
)
def test_the_chart_renders_with_the_values_gardenlet_v1_150_injects(
    toolchain: Toolchain, tmp_path: Path, values: dict[str, Any], seed_name: str | None
) -> None:
    """Helm checks the schema when gardenlet renders the chart: a key it rejects is ChartCannotBeRendered on that
    seed. Without a Seed (a self-hosted shoot that is no Seed) the components get no SEED_NAME."""
    documents = render(toolchain, tmp_path, values)
    env = {e["name"]: e.get("value") for e in container(documents, NAME)["env"]}
    assert env.get("SEED_NAME") == seed_name


def test_the_chart_renders_with_keys_a_later_gardenlet_adds(toolchain: Toolchain, tmp_path: Path) -> None:
    """Under `gardener` at any depth, and at the top level: any gardenlet release may add some."""
    gardener = EVERY_V1_150_VALUE["gardener"]
    future = {
        "gardener": {
            **gardener,
            "someNewKey": {"x": 1},
            "seed": {**gardener["seed"], "zone": "a"},
            "shoot": {**gardener["shoot"], "status": {"phase": "Running"}},
            "garden": {**gardener["garden"], "newField": True},
            "gardenlet": {**gardener["gardenlet"], "config": {"logLevel": "info"}},
        },
        "usablePorts": EVERY_V1_150_VALUE["usablePorts"],
        "aNewTopLevelKey": [1, 2],
    }
    assert render(toolchain, tmp_path, future)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhook": {"timeoutSecnds": 5}}, "at '/webhook': additional properties 'timeoutSecnds' not allowed"),
        ({"controller": {"wrokers": 2}}, "at '/controller': additional properties 'wrokers' not allowed"),
        (
            {"certificates": {"resources": {"requests": {"cpuu": "10m"}}}},
            "at '/certificates/resources/requests': additional properties 'cpuu' not allowed",
        ),
        ({"image": {"repository": "r", "tg": "1"}}, "at '/image': additional properties 'tg' not allowed"),
    ],
    ids=["webhook", "controller", "nested", "image"],
)
def test_a_typo_in_our_values_is_rejected_next_to_gardenlets(
    toolchain: Toolchain, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    """Accepting whatever gardenlet adds does not let a typo in our own sections through: helm names its path."""
    merged = {**EVERY_V1_150_VALUE, **values}
    result = helm(toolchain, "template", RELEASE, str(CHART), "-f", str(values_file(tmp_path, merged)), check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def key_paths(values: dict[str, Any]) -> set[str]:
    """The top-level keys, gardener.<key> and gardener.<section>.<key> (not what a Seed's or Shoot's spec or the
    feature gates hold)."""
    paths = set(values)
    for key, value in values.get("gardener", {}).items():
        paths.add(f"gardener.{key}")
        if isinstance(value, dict):
            paths |= {f"gardener.{key}.{inner}" for inner in value}
    return paths


def test_the_local_seed_gets_every_value_gardenlet_v1_150_injects(toolchain: Toolchain, tmp_path: Path) -> None:
    """The end-to-end tests, the benchmarks and the playground install the seed chart with
    seed_install.gardenlet_values(): every key above, so the local seed renders as a v1.150 one would."""
    local = seed_install.gardenlet_values()
    assert key_paths(local) == key_paths(EVERY_V1_150_VALUE)
    assert local["gardener"]["gardenlet"]["featureGates"] == V1_150_FEATURE_GATES
    assert local["gardener"]["version"] == "v1.150.0"
    documents = render(toolchain, tmp_path, local)
    assert {"name": "SEED_NAME", "value": "local"} in container(documents, NAME)["env"]


def test_schema_accepts_every_value_gardenlet_injects(toolchain: Toolchain, tmp_path: Path) -> None:
    """Including the forms a Seed may take: volume providers, no ingress, no taints, garden kubeconfig injection."""
    seed = {
        **GARDENLET_VALUES["gardener"]["seed"],
        "annotations": {"a": "b"},
        "volumeProvider": "ebs",
        "volumeProviders": [{"name": "ebs", "purpose": "etcd-main"}],
        "ingressDomain": None,
        "protected": True,
        "taints": None,
        "blockCIDRs": None,
    }
    gardener = {
        **GARDENLET_VALUES["gardener"],
        "seed": seed,
        "garden": {"clusterIdentity": "g", "genericKubeconfigSecretName": "generic-garden-kubeconfig-1a2b"},
    }
    documents = render(toolchain, tmp_path, {"gardener": gardener})
    assert {"name": "SEED_NAME", "value": "aws-eu1"} in container(documents, NAME)["env"]


# --- the components ------------------------------------------------------------------------------------------


def test_controller_args_and_env(rendered: list[dict[str, Any]]) -> None:
    controller = container(rendered, NAME)
    assert controller["args"] == [
        "--log-level=INFO",
        "extension",
        "--namespace=$(POD_NAMESPACE)",
        f"--webhook-url=https://{WEBHOOK}.{NAMESPACE}.svc:443",
        f"--ca-secret={NAMESPACE}/{WEBHOOK}-certs",
        "--leader-elect",
        "--metrics-port=8080",
        "--metrics-bind-address=0.0.0.0",
        "--machine-preserve-timeout=72h",
        "--max-preserve-timeout=720h",
        "--evidence-grace=24h",
        "--workers=4",
        "--extension-workers=10",
        "--max-concurrent-reconciles=20",
        "--shoot-node-budget=128",
    ]
    env = {e["name"]: e for e in controller["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["SEED_NAME"]["value"] == "aws-eu1"
    deployment = standalone.find(rendered, "Deployment", NAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["labels"]["high-availability-config.resources.gardener.cloud/type"] == "controller"


def test_controller_args_are_accepted_by_the_cli(rendered: list[dict[str, Any]]) -> None:
    parser = build_parser()
    args = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in container(rendered, NAME)["args"]]
    parser.parse_args(args)


def test_values_reach_the_containers(toolchain: Toolchain, tmp_path: Path) -> None:
    documents = render(
        toolchain,
        tmp_path,
        {
            "controller": {
                "logLevel": "DEBUG",
                "machinePreserveTimeout": "24h",
                "workers": 3,
                "extensionWorkers": 20,
                "maxConcurrentReconciles": 50,
                "shootNodeBudget": 64,
                "metricsPort": 9090,
            },
            "maxPreserveTimeout": "168h",
            "webhook": {
                "replicas": 3,
                "port": 10250,
                "seedPort": 10251,
                "timeoutSeconds": 5,
                "maxConnections": 700,
                "seedMaxConnections": 50,
                "maxConnectionsPerPeer": 20,
            },
            "image": {"repository": "registry.example.com/mp", "tag": "1.2.3"},
            "priorityClassName": "",
        },
    )
    args = container(documents, NAME)["args"]
    for expected in ("--log-level=DEBUG", "--machine-preserve-timeout=24h", "--max-preserve-timeout=168h"):
        assert expected in args
    assert "--workers=3" in args
    assert "--extension-workers=20" in args
    assert "--max-concurrent-reconciles=50" in args
    assert "--shoot-node-budget=64" in args
    assert "--metrics-port=9090" in args
    shoots, seed = (c["args"] for c in webhook_containers(documents))
    assert "--max-preserve-timeout=168h" in shoots
    assert "--max-preserve-timeout=168h" in seed
    assert {"--routes=shoots", "--port=10250", "--max-connections=700", "--max-connections-per-peer=20"} <= set(shoots)
    assert {"--routes=seed", "--port=10251", "--max-connections=50", "--max-connections-per-peer=20"} <= set(seed)
    assert standalone.find(documents, "Deployment", WEBHOOK)["spec"]["replicas"] == 3
    service = standalone.find(documents, "Service", WEBHOOK)
    assert service["metadata"]["annotations"]["networking.resources.gardener.cloud/from-world-to-ports"] == (
        '[{"port":10251,"protocol":"TCP"}]'
    )
    assert service["metadata"]["annotations"][
        "networking.resources.gardener.cloud/from-all-webhook-targets-allowed-ports"
    ] == ('[{"port":10250,"protocol":"TCP"}]')
    assert {w["timeoutSeconds"] for w in seed_webhook_configuration(documents)["webhooks"]} == {5}
    for deployment in (NAME, WEBHOOK, CERTS):
        for each in pod_spec(documents, deployment)["containers"]:
            assert each["image"] == "registry.example.com/mp:1.2.3"
        assert "priorityClassName" not in pod_spec(documents, deployment)


def test_webhook_and_certs_commands_are_accepted_by_the_cli(rendered: list[dict[str, Any]]) -> None:
    parser = build_parser()
    shoots = parser.parse_args(container(rendered, WEBHOOK, "webhook")["args"])
    assert (shoots.routes, shoots.port) == ("shoots", 9443)
    webhook = parser.parse_args(container(rendered, WEBHOOK, "seed-webhook")["args"])
    assert (webhook.routes, webhook.port) == ("seed", 9444)
    # The same server otherwise.
    assert {**vars(shoots), "routes": "seed", "port": 9444, "max_connections": 200} == vars(webhook)
    assert webhook.command == "webhook"
    assert str(webhook.cert_dir) == "/certs"
    assert webhook.controller_username == CONTROLLER_USERNAME
    assert webhook.max_preserve_timeout == dt.timedelta(hours=720)
    # One webhook for every shoot: the controller's seed and shoot identities, MCM per shoot namespace (and its
    # default identity inside the shoots), native preservation decided per shoot namespace.
    settings = webhook_commands.settings_from(webhook, native=False)
    assert settings.controller_usernames == {CONTROLLER_USERNAME, shoot_resources.CONTROLLER_USERNAME}
    assert settings.mcm_service_accounts == {"machine-controller-manager"}
    assert settings.mcm_usernames == {shoot_resources.MCM_USERNAME}
    mcm = "system:serviceaccount:shoot--p--a:machine-controller-manager"
    assert settings.is_mcm(mcm, namespace="shoot--p--a")
    assert not settings.is_mcm(mcm, namespace="shoot--p--b")
    assert webhook.mcm_native_preservation_per_namespace
    assert webhook.mcm_native_preservation == "auto"
    assert webhook.gardener_extension

    certs = certs_commands.settings_from(parser.parse_args(container(rendered, CERTS)["args"]))
    assert (certs.secret_namespace, certs.secret_name) == (NAMESPACE, f"{WEBHOOK}-certs")
    assert certs.serving_secret == (NAMESPACE, f"{WEBHOOK}-tls")
    # The seed webhook configuration: kept entirely from the mounted manifest (the chart creates it).
    assert [str(c) for c in certs.configurations] == [f"validating/{RELEASE}"]
    mount = next(m for m in container(rendered, CERTS)["volumeMounts"] if m["name"] == "seed-webhooks")
    key = "validatingwebhookconfiguration.yaml"
    assert certs.configurations[0].template == Path(mount["mountPath"]) / key
    manifests = next(v for v in pod_spec(rendered, CERTS)["volumes"] if v["name"] == "seed-webhooks")
    assert manifests["configMap"]["name"] == SEED_WEBHOOKS
    assert key in standalone.find(rendered, "ConfigMap", SEED_WEBHOOKS)["data"]
    annotations = standalone.find(rendered, "Deployment", CERTS)["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/seed-webhooks"}, "a changed configuration rolls the certs manager"
    # The certificate names the host every shoot's kube-apiserver calls (the controller's --webhook-url).
    assert f"{WEBHOOK}.{NAMESPACE}.svc" in certs.identity.dns_names
    # What the webhook pods mount is what the certs manager publishes.
    volume = next(v for v in pod_spec(rendered, WEBHOOK)["volumes"] if v["name"] == "certs")
    assert volume["secret"]["secretName"] == certs.serving_secret[1]


def test_webhook_service_pdb_and_network_annotations(rendered: list[dict[str, Any]]) -> None:
    service = standalone.find(rendered, "Service", WEBHOOK)
    assert service["metadata"]["annotations"] == {
        "networking.resources.gardener.cloud/from-all-webhook-targets-allowed-ports": PORT_9443,
        "networking.resources.gardener.cloud/pod-label-selector-namespace-alias": "extensions",
        "networking.resources.gardener.cloud/namespace-selectors": '[{"matchLabels":{"gardener.cloud/role":"shoot"}}]',
        # Only the seed's own kube-apiserver, from outside the seed's pods, reaches the seed's port.
        "networking.resources.gardener.cloud/from-world-to-ports": PORT_9444,
    }
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"},
        {"name": "seed", "port": 8443, "targetPort": "seed", "protocol": "TCP"},
    ]
    shoots, seed = webhook_containers(rendered)
    assert shoots["ports"] == [{"name": "https", "containerPort": 9443, "protocol": "TCP"}]
    assert seed["ports"] == [{"name": "seed", "containerPort": 9444, "protocol": "TCP"}]
    assert seed["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "seed", "scheme": "HTTPS"}
    # Ready once started: a flood on the shoots' port never takes the pod out of the seed webhooks' Service.
    assert "readinessProbe" not in shoots
    assert shoots["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    for server in (shoots, seed):
        assert server["livenessProbe"]["httpGet"]["port"] == server["ports"][0]["name"]
    deployment = standalone.find(rendered, "Deployment", WEBHOOK)
    assert deployment["spec"]["replicas"] >= 2
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pdb = standalone.find(rendered, "PodDisruptionBudget", WEBHOOK)
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_egress_labels_of_every_pod(rendered: list[dict[str, Any]]) -> None:
    seed = {"networking.gardener.cloud/to-dns": "allowed", "networking.gardener.cloud/to-runtime-apiserver": "allowed"}
    shoots = {"networking.resources.gardener.cloud/to-all-shoots-kube-apiserver-tcp-443": "allowed"}
    labels = {
        name: standalone.find(rendered, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        for name in (NAME, WEBHOOK, CERTS)
    }
    assert seed.items() <= labels[NAME].items()
    assert shoots.items() <= labels[NAME].items()
    for name in (WEBHOOK, CERTS):
        assert seed.items() <= labels[name].items()
        assert not shoots.items() <= labels[name].items(), f"{name} never calls a shoot"


def test_every_container_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    for name in (NAME, WEBHOOK, CERTS):
        pod = pod_spec(rendered, name)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["priorityClassName"] == "gardener-system-900"
        for box in pod["containers"]:
            assert box["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }
            assert {"name": "TMPDIR", "value": "/tmp"} in box["env"]
            assert {"name": "tmp", "mountPath": "/tmp"} in box["volumeMounts"]
            assert box["resources"]["requests"]
            assert box["resources"]["limits"]["memory"]


def test_rbac_is_exactly_what_each_component_does(rendered: list[dict[str, Any]]) -> None:
    prefix = f"extensions.gardener.cloud:{RELEASE}"
    ext, mcm = "extensions.gardener.cloud", "machine.sapcloud.io"
    # Exactly what the extension calls, as the seed's audit log shows it (tests/e2e/test_gardener_rbac.py).
    assert rules(rendered, "ClusterRole", f"{prefix}:controller") == (
        expand(ext, "extensions", "get list watch patch", "machine-preservation")
        | expand(ext, "extensions/status", "patch", "machine-preservation")
        | expand(ext, "clusters", "list watch")
        # The standalone chart's controller verbs on MCM's objects.
        | expand(mcm, "machines", "list watch patch delete")
        | expand(mcm, "machinesets machinedeployments", "list watch")
        | expand(mcm, "machines/status machinesets/status machinedeployments/status", "patch")
        # Secrets: get by name (never list or watch); writes limited to our names by the admission policy.
        | expand("", "secrets", "get create delete")
        | expand("", "secrets", "patch", shoot_resources.SHOOT_ACCESS_SECRET)
        | expand(
            "resources.gardener.cloud",
            "managedresources",
            "get list watch patch delete",
            shoot_resources.MANAGED_RESOURCE,
        )
        | expand("resources.gardener.cloud", "managedresources", "create")
        | expand("apps", "deployments", "get", "machine-controller-manager")
        | expand(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "get",
            "machines.machine.sapcloud.io,machinesets.machine.sapcloud.io,clusters.extensions.gardener.cloud",
        )
        | expand("", "events", "create get patch")
    )
    assert rules(rendered, "Role", NAME) == (
        expand("coordination.k8s.io", "leases", "create")
        | expand("coordination.k8s.io", "leases", "get update", "gardener-extension-machine-preservation")
        | expand("coordination.k8s.io", "leases", "patch", "gardener-extension-heartbeat")
        | expand("", "secrets", "list watch", f"{WEBHOOK}-certs")
    )
    assert rules(rendered, "ClusterRole", f"{prefix}:webhook") == (
        # The deletion guard's seed-wide caches (list and watch), never a read per review.
        expand(mcm, "machines machinesets machinedeployments", "list watch")
        | expand("apps", "deployments", "get", "machine-controller-manager")
        | expand(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "get",
            "machines.machine.sapcloud.io,machinesets.machine.sapcloud.io",
        )
        | expand(ext, "clusters", "list watch")
        # Whether the extension is still enabled for the shoot (a disabled one's deletes all pass), and which
        # namespaces hold it (the shoots that get caches of their own).
        | expand(ext, "extensions", "list watch", "machine-preservation")
    )
    assert rules(rendered, "Role", CERTS) == expand("", "secrets", "get patch", f"{WEBHOOK}-certs,{WEBHOOK}-tls")
    # The chart creates the seed webhook configuration: the certs manager may not create any.
    assert rules(rendered, "ClusterRole", f"{prefix}:seed-webhooks") == expand(
        "admissionregistration.k8s.io", "validatingwebhookconfigurations", "get patch", RELEASE
    )
    # Each binding binds its role to its component's ServiceAccount, and only that.
    for kind, name, account in (
        ("ClusterRoleBinding", f"{prefix}:controller", NAME),
        ("RoleBinding", NAME, NAME),
        ("ClusterRoleBinding", f"{prefix}:webhook", WEBHOOK),
        ("RoleBinding", CERTS, CERTS),
        ("ClusterRoleBinding", f"{prefix}:seed-webhooks", CERTS),
    ):
        binding = standalone.find(rendered, kind, name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    # The webhook's identity holds no key material: only the certs manager reads the CA Secret by name, and the
    # controller (which needs the CA for every shoot) watches it by name.
    assert not any(r[1] == "secrets" for r in rules(rendered, "ClusterRole", f"{prefix}:webhook"))


def test_seed_webhooks(rendered: list[dict[str, Any]], toolchain: Toolchain) -> None:
    configuration = seed_webhook_configuration(rendered)
    assert configuration["metadata"]["name"] == RELEASE
    assert registration_problems([configuration]) == []  # as the registry the server serves by says
    assert all("caBundle" not in w["clientConfig"] for w in configuration["webhooks"]), "the certs manager's"
    webhooks = {w["name"]: w for w in configuration["webhooks"]}
    assert set(webhooks) == {
        "preserve-annotation.machines.machine-preservation.sapcloud.io",
        "deletion.machines.machine-preservation.sapcloud.io",
    }
    for webhook in webhooks.values():
        assert webhook["namespaceSelector"] == {"matchLabels": {ENABLED_LABEL: "true"}}
        assert webhook["clientConfig"]["service"]["name"] == WEBHOOK
        assert webhook["clientConfig"]["service"]["namespace"] == NAMESPACE
        assert webhook["clientConfig"]["service"]["port"] == 8443  # the Service's seed port
        assert webhook["failurePolicy"] == "Fail"
        assert webhook["timeoutSeconds"] == 10
        assert webhook["sideEffects"] == "None"
    deletion = webhooks["deletion.machines.machine-preservation.sapcloud.io"]
    assert deletion["rules"][0]["operations"] == ["DELETE"]
    assert deletion["clientConfig"]["service"]["path"] == "/validate-machine-deletion"
    conditions = {c["name"]: c["expression"] for c in deletion["matchConditions"]}
    assert conditions["deleted-by-mcm"] == (
        "request.userInfo.username.startsWith('system:serviceaccount:shoot--') && "
        "request.userInfo.username.endsWith(':machine-controller-manager')"
    )
    preserve = webhooks["preserve-annotation.machines.machine-preservation.sapcloud.io"]
    assert preserve["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert preserve["clientConfig"]["service"]["path"] == "/validate-preserve-annotation"
    preserve_conditions = {c["name"]: c["expression"] for c in preserve["matchConditions"]}
    assert preserve_conditions["not-the-controller"] == f"!(request.userInfo.username in ['{CONTROLLER_USERNAME}'])"
    # A Worker restore (the provider extension re-creating a migrated shoot's Machines) never reaches the webhook.
    assert preserve_conditions["not-a-restore"] == (
        "!(request.operation == 'CREATE' && request.userInfo.username.startsWith('system:serviceaccount:extension-'))"
    )

    # The same CEL as the standalone chart's Machine webhooks (which a test compares with the webhook's builder).
    theirs = standalone.webhooks_by_name(standalone.template(toolchain.helm))
    their_deletion = {c["name"]: c["expression"] for c in theirs[deletion["name"]]["matchConditions"]}
    assert conditions["machine-failed-or-preserved"] == their_deletion["machine-failed-or-preserved"]
    assert conditions["not-force-deletion"] == their_deletion["not-force-deletion"]
    their_preserve = {c["name"]: c["expression"] for c in theirs[preserve["name"]]["matchConditions"]}
    assert preserve_conditions["preserve-annotations-change"] == their_preserve["preserve-annotations-change"]
    for ours in webhooks.values():
        their = theirs[ours["name"]]
        for key in ("sideEffects", "matchPolicy", "admissionReviewVersions", "failurePolicy", "timeoutSeconds"):
            assert ours[key] == their[key], key
        assert [{**r, "scope": "Namespaced"} for r in their["rules"]] == ours["rules"]


# --- a real kube-apiserver -----------------------------------------------------------------------------------


def kubectl(toolchain: Toolchain, kubeconfig: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(toolchain.kubectl), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_object_is_accepted_by_the_api_server(
    toolchain: Toolchain, control_plane: ControlPlane, namespace: str, tmp_path: Path, seed_system: None
) -> None:
    rendered = render(toolchain, tmp_path, namespace=namespace, release=f"mp-{namespace}")
    documents = rendered
    result = kubectl(
        toolchain,
        control_plane.kubeconfig,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(documents),
    )
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(documents), result.stdout


def test_the_api_server_check_has_teeth(
    toolchain: Toolchain, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """The same check rejects a matchCondition that is not valid CEL, and a field the API does not know."""
    documents = render(toolchain, tmp_path, namespace=namespace, release=f"mp-{namespace}")
    configuration = seed_webhook_configuration(documents)
    configuration["webhooks"][1]["matchConditions"][0]["expression"] = "request.userInfo.username.startsWith("
    deployment = standalone.find(documents, "Deployment", NAME)
    deployment["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    for document, complaint in ((configuration, "matchConditions"), (deployment, "argz")):
        result = kubectl(
            toolchain,
            control_plane.kubeconfig,
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            stdin=yaml.safe_dump(document),
        )
        assert result.returncode != 0
        assert complaint in result.stderr


@contextlib.contextmanager
def namespaces(core: client.CoreV1Api, *specs: tuple[str, dict[str, str]]) -> Iterator[None]:
    for name, labels in specs:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    try:
        yield
    finally:
        for name, _ in specs:
            core.delete_namespace(name)


def failed_machine(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    custom.create_namespaced_custom_object(
        *MACHINES,
        namespace,
        "machines",
        {
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name},
            "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
        },
    )
    custom.patch_namespaced_custom_object_status(
        *MACHINES, namespace, "machines", name, {"status": {"currentStatus": {"phase": "Failed"}}}
    )


async def test_the_seed_webhooks_see_only_mcms_deletes_in_enabled_shoot_namespaces(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """The chart's seed configuration as rendered (only the Service reference swapped for the URL of a webhook
    running here): MCM's delete of a Failed Machine in a shoot namespace labelled for the extension reaches the
    deletion guard; the same in an unlabelled shoot namespace, or by anyone else, does not."""
    # Client certificate CNs are at most 64 characters: short namespace names.
    tag = uuid.uuid4().hex[:4]
    enabled, disabled = f"shoot--{tag}--a", f"shoot--{tag}--b"
    release = f"mp-{tag}"
    documents = render(toolchain, tmp_path, namespace=f"extension-mp-{tag}", release=release)
    configuration = seed_webhook_configuration(documents)
    assert configuration["metadata"]["name"] == release
    cert_dir = tmp_path / "certs"
    write_self_signed(cert_dir=cert_dir, names=("127.0.0.1",), now=dt.datetime.now(dt.UTC))
    ca_bundle = base64.b64encode((cert_dir / "ca.crt").read_bytes()).decode()
    port = free_port()
    for webhook in configuration["webhooks"]:
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}

    core = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    registration = client.AdmissionregistrationV1Api(kube_client)

    def as_user(user: str) -> client.CustomObjectsApi:
        api_client: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig_for(user, ("system:masters",)))
        )
        return client.CustomObjectsApi(api_client)

    # The deletion guard's reads as the seed chart's webhook ServiceAccount, under the chart's RBAC.
    identity = await seed_chart_identity(control_plane, tmp_path, deployment=seed_install.WEBHOOK_DEPLOYMENT)
    machine_sets = KubernetesMachineSets(kubeconfig=identity)
    # As the chart's seed-webhook container runs it: the seed's routes only.
    server = WebhookServer(
        host="127.0.0.1",
        port=port,
        routes="seed",
        cert_dir=cert_dir,
        settings=AdmissionSettings(controller_username=CONTROLLER_USERNAME),
        machine_sets=machine_sets,
        cert_poll_interval=0.2,
    )

    def calls() -> float:
        value = server.metrics.registry.get_sample_value(
            "machine_preservation_webhook_requests_total", {"endpoint": "validate-machine-deletion"}
        )
        return value or 0.0

    with namespaces(
        core,
        (enabled, {ENABLED_LABEL: "true", "gardener.cloud/role": "shoot"}),
        (disabled, {"gardener.cloud/role": "shoot"}),
    ):
        registration.create_validating_webhook_configuration(
            client.V1ValidatingWebhookConfiguration.model_validate(configuration)
        )
        try:
            async with server:
                # The API server picks the configuration up through an informer: wait until a delete arrives.
                mcm_enabled = as_user(f"system:serviceaccount:{enabled}:machine-controller-manager")
                mcm_disabled = as_user(f"system:serviceaccount:{disabled}:machine-controller-manager")
                someone = as_user("system:serviceaccount:garden:gardenlet")
                counter = iter(range(1000))

                def mcm_delete_reaches_the_guard() -> bool:
                    name = f"probe-{next(counter)}"
                    failed_machine(custom, enabled, name)
                    before = calls()
                    mcm_enabled.delete_namespaced_custom_object(*MACHINES, enabled, "machines", name)
                    return calls() == before + 1

                await asyncio.to_thread(eventually, mcm_delete_reaches_the_guard)

                for api, namespace, name in (
                    (mcm_disabled, disabled, "m-unlabelled"),
                    (someone, enabled, "m-by-gardenlet"),
                    (custom, enabled, "m-by-admin"),
                ):
                    await asyncio.to_thread(failed_machine, custom, namespace, name)
                    before = calls()
                    await asyncio.to_thread(api.delete_namespaced_custom_object, *MACHINES, namespace, "machines", name)
                    assert calls() == before, f"{name}: the guard was called"
                # And once more, MCM in the enabled namespace: called.
                await asyncio.to_thread(failed_machine, custom, enabled, "m-mcm")
                before = calls()
                await asyncio.to_thread(
                    mcm_enabled.delete_namespaced_custom_object, *MACHINES, enabled, "machines", "m-mcm"
                )
                assert calls() == before + 1
        finally:
            registration.delete_validating_webhook_configuration(release)
            await machine_sets.close()


def test_with_the_seed_webhook_down_gardeners_deletes_still_pass(
    toolchain: Toolchain,
    kube_client: client.ApiClient,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """The chart's seed configuration as rendered, its webhook unreachable (failurePolicy Fail): MCM's delete of a
    kept machine is refused, but not once Gardener labelled the machine `force-deletion=True` (as its Worker
    actuator does on hibernation and on shoot deletion before MCM deletes), and never gardenlet's own delete (force
    deletion, migration). Decided by the API server alone: neither the webhook nor the controller runs here."""
    tag = uuid.uuid4().hex[:4]
    shoot = f"shoot--{tag}--h"
    release = f"mp-{tag}"
    configuration = seed_webhook_configuration(
        render(toolchain, tmp_path, namespace=f"extension-mp-{tag}", release=release)
    )
    port = free_port()  # nothing listens there
    for webhook in configuration["webhooks"]:
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    core = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    registration = client.AdmissionregistrationV1Api(kube_client)

    def as_user(user: str) -> client.CustomObjectsApi:
        api_client: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig_for(user, ("system:masters",)))
        )
        return client.CustomObjectsApi(api_client)

    mcm = as_user(f"system:serviceaccount:{shoot}:machine-controller-manager")
    gardenlet = as_user("system:serviceaccount:garden:gardenlet")
    counter = iter(range(1000))

    def mcm_delete_refused() -> bool:
        name = f"kept-{next(counter)}"
        failed_machine(custom, shoot, name)
        try:
            mcm.delete_namespaced_custom_object(*MACHINES, shoot, "machines", name)
        except client.ApiException as error:
            return "failed calling webhook" in str(error.body)
        return False

    with namespaces(core, (shoot, {ENABLED_LABEL: "true", "gardener.cloud/role": "shoot"})):
        registration.create_validating_webhook_configuration(
            client.V1ValidatingWebhookConfiguration.model_validate(configuration)
        )
        try:
            # The API server picks the configuration up through an informer: until then MCM's deletes pass.
            eventually(mcm_delete_refused)
            failed_machine(custom, shoot, "hibernated")
            custom.patch_namespaced_custom_object(
                *MACHINES, shoot, "machines", "hibernated", {"metadata": {"labels": {"force-deletion": "True"}}}
            )
            mcm.delete_namespaced_custom_object(*MACHINES, shoot, "machines", "hibernated")
            failed_machine(custom, shoot, "force-deleted")
            gardenlet.delete_namespaced_custom_object(*MACHINES, shoot, "machines", "force-deleted")
            left = {
                m["metadata"]["name"]
                for m in custom.list_namespaced_custom_object(*MACHINES, shoot, "machines")["items"]
            }
            assert not left & {"hibernated", "force-deleted"}, left
            assert mcm_delete_refused(), "an unlabelled kept machine still waits for the webhook"
        finally:
            registration.delete_validating_webhook_configuration(release)


# --- example/ ------------------------------------------------------------------------------------------------


def gardener_module() -> Path:
    return go_module_dir(GARDENER_MODULE, GARDENER_VERSION)


@pytest.fixture(scope="module")
def operator_extension_crd(kube_client: client.ApiClient) -> str:
    manifest = yaml.safe_load((gardener_module() / OPERATOR_EXTENSION_CRD).read_text())
    api = client.ApiextensionsV1Api(kube_client)
    apply_crd(api, manifest)

    def established() -> bool:
        crd = api.read_custom_resource_definition(manifest["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in ((crd.status and crd.status.conditions) or [])
        )

    eventually(established)
    name: str = manifest["metadata"]["name"]
    return name


def test_operator_extension_example_is_accepted(
    toolchain: Toolchain, control_plane: ControlPlane, operator_extension_crd: str
) -> None:
    example = (EXAMPLES / "extension.yaml").read_text()
    args = ("create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-")
    result = eventually(
        lambda: kubectl(toolchain, control_plane.kubeconfig, *args, stdin=example).returncode == 0 or None
    )
    assert result
    created = json.loads(kubectl(toolchain, control_plane.kubeconfig, *args, stdin=example).stdout)
    resource = created["spec"]["resources"][0]
    assert (resource["kind"], resource["type"]) == ("Extension", "machine-preservation")
    # Its values are values this chart accepts.
    values = created["spec"]["deployment"]["extension"]["values"]
    assert set(values) <= set(json.loads((CHART / "values.schema.json").read_text())["properties"])


def test_operator_extension_check_has_teeth(
    toolchain: Toolchain, control_plane: ControlPlane, operator_extension_crd: str
) -> None:
    document = yaml.safe_load((EXAMPLES / "extension.yaml").read_text())
    document["spec"]["resources"][0]["reconcileTimeOut"] = "3m"
    result = kubectl(
        toolchain,
        control_plane.kubeconfig,
        "create",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        stdin=yaml.safe_dump(document),
    )
    assert result.returncode != 0
    assert "reconcileTimeOut" in result.stderr


def test_example_values_render_the_chart(toolchain: Toolchain, tmp_path: Path) -> None:
    """The values in both examples, merged with gardenlet's, pass the chart's schema and reach the controller."""
    extension = yaml.safe_load((EXAMPLES / "extension.yaml").read_text())
    registration = list(yaml.safe_load_all((EXAMPLES / "controller-registration.yaml").read_text()))
    deployment = next(d for d in registration if d["kind"] == "ControllerDeployment")
    for values in (extension["spec"]["deployment"]["extension"]["values"], deployment["helm"]["values"]):
        documents = render(toolchain, tmp_path, values)
        assert container(documents, NAME)["image"] == "ghcr.io/gardener/machine-preservation:0.1.0"


# The Gardener API types of ControllerRegistration and ControllerDeployment are served by gardener-apiserver, which
# cannot run here: the example's fields are checked against the JSON names in the Go source of the module instead.
_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.MULTILINE | re.DOTALL)
_FIELD = re.compile(r"^\s*(?:(\w+)\s+)?([\w.*\[\]]+)\s+`[^`]*json:\"([^\"]*)\"", re.MULTILINE)


def go_structs(directory: Path) -> dict[str, dict[str, tuple[str, bool]]]:
    """struct name → JSON field name → (Go type without pointer/slice, whether it is a list)."""
    structs: dict[str, dict[str, tuple[str, bool]]] = {}
    for source in sorted(directory.glob("types*.go")):
        for name, body in _STRUCT.findall(source.read_text()):
            fields: dict[str, tuple[str, bool]] = {}
            for line in body.splitlines():
                if line.strip().startswith("//"):
                    continue
                match = _FIELD.match(line)
                if match is None:
                    continue
                _, go_type, tag = match.groups()
                json_name = tag.split(",")[0]
                is_list = go_type.startswith("[]") and go_type != "[]byte"
                bare = go_type.lstrip("*[]")
                if json_name:
                    fields[json_name] = (bare, is_list)
                elif bare == "metav1.TypeMeta":
                    fields.update({"apiVersion": ("string", False), "kind": ("string", False)})
            structs[name] = fields
    return structs


def unknown_fields(value: Any, type_name: str, structs: dict[str, dict[str, tuple[str, bool]]], path: str) -> list[str]:
    if type_name not in structs:  # a type of another package (ObjectMeta, JSON, Duration, ...) or a string alias
        return []
    assert isinstance(value, dict), f"{path}: expected an object"
    problems = []
    for key, item in value.items():
        if key not in structs[type_name]:
            problems.append(f"{path}.{key}")
            continue
        field_type, is_list = structs[type_name][key]
        for index, element in enumerate(item if is_list else [item]):
            problems += unknown_fields(
                element, field_type, structs, f"{path}.{key}" + (f"[{index}]" if is_list else "")
            )
    return problems


def test_controller_registration_example_uses_only_gardeners_fields() -> None:
    apis = go_module_dir(GARDENER_MODULE + "/pkg/apis", GARDENER_VERSION)
    kinds = {
        ("core.gardener.cloud/v1", "ControllerDeployment"): go_structs(apis / "core" / "v1"),
        ("core.gardener.cloud/v1beta1", "ControllerRegistration"): go_structs(apis / "core" / "v1beta1"),
    }
    documents = list(yaml.safe_load_all((EXAMPLES / "controller-registration.yaml").read_text()))
    assert sorted((d["apiVersion"], d["kind"]) for d in documents) == sorted(kinds)
    for document in documents:
        structs = kinds[(document["apiVersion"], document["kind"])]
        assert unknown_fields(document, document["kind"], structs, document["kind"]) == []
        # The check has teeth: a misspelt field is found.
        assert unknown_fields({**document, "spec2": {}}, document["kind"], structs, "x") == ["x.spec2"]
    registration = next(d for d in documents if d["kind"] == "ControllerRegistration")
    deployment = next(d for d in documents if d["kind"] == "ControllerDeployment")
    assert registration["spec"]["deployment"]["deploymentRefs"] == [{"name": deployment["metadata"]["name"]}]
    # The same registration the operator Extension example generates.
    extension = yaml.safe_load((EXAMPLES / "extension.yaml").read_text())
    assert registration["spec"]["resources"] == extension["spec"]["resources"]
    assert registration["metadata"]["name"] == extension["metadata"]["name"] == RELEASE
    assert deployment["helm"]["values"] == extension["spec"]["deployment"]["extension"]["values"]
    misspelt = {
        **registration,
        "spec": {**registration["spec"], "resources": [{"kind": "Extension", "globallyEnabled": True}]},
    }
    assert unknown_fields(
        misspelt, "ControllerRegistration", kinds[("core.gardener.cloud/v1beta1", "ControllerRegistration")], "r"
    ) == ["r.spec.resources[0].globallyEnabled"]


# --- what a seed's monitoring, VPA and disruption handling take from an extension ---------------------------------


def _exported_metric_names() -> set[str]:
    """Every series name the extension and webhook processes can export (the registries' families, with their
    samples' suffixes)."""
    from machine_preservation.controller.machinery.metrics import Metrics
    from machine_preservation.webhook.metrics import WebhookMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for registry in (Metrics().registry, WebhookMetrics().registry)
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_the_seed_prometheus_scrapes_both_webhook_processes(rendered: list[dict[str, Any]]) -> None:
    """Each container's TLS port, through a metrics Service the seed Prometheus may reach, by a ServiceMonitor that
    verifies the serving certificate the certs manager issues for the webhook Service."""
    webhook = f"{NAME}-webhook"
    pod = standalone.find(rendered, "Deployment", webhook)["spec"]["template"]
    ports = {port["name"]: port["containerPort"] for c in pod["spec"]["containers"] for port in c["ports"]}
    assert set(ports) == {"https", "seed"}
    service = standalone.find(rendered, "Service", f"{webhook}-metrics")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {(p["name"], p["targetPort"], p["port"]) for p in service["spec"]["ports"]} == {
        (name, name, port) for name, port in ports.items()
    }
    annotations = service["metadata"]["annotations"]
    allowed = json.loads(annotations["networking.resources.gardener.cloud/from-all-seed-scrape-targets-allowed-ports"])
    assert sorted(p["port"] for p in allowed) == sorted(ports.values())
    assert json.loads(annotations["networking.resources.gardener.cloud/namespace-selectors"]) == [
        {"matchLabels": {"kubernetes.io/metadata.name": "garden"}}
    ]
    monitor = standalone.find(rendered, "ServiceMonitor", webhook)
    assert monitor["metadata"]["labels"]["prometheus"] == "seed"
    selected = [
        d
        for d in rendered
        if d["kind"] == "Service"
        and monitor["spec"]["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()
    ]
    assert [d["metadata"]["name"] for d in selected] == [f"{webhook}-metrics"], "only the metrics Service"
    assert sorted(e["port"] for e in monitor["spec"]["endpoints"]) == sorted(ports)
    certs_args = pod_spec(rendered, f"{NAME}-certs")["containers"][0]["args"]
    secret = next(a.split("/", 1)[1] for a in certs_args if a.startswith("--secret="))
    service_name = next(a.split("=", 1)[1] for a in certs_args if a.startswith("--service="))
    names = service_dns_names(service=service_name, namespace=NAMESPACE)
    for endpoint in monitor["spec"]["endpoints"]:
        assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": secret, "key": CA_BUNDLE_KEY}
        assert endpoint["tlsConfig"]["serverName"] in names


def test_the_seed_prometheus_scrapes_the_extension(rendered: list[dict[str, Any]]) -> None:
    pod = standalone.find(rendered, "Deployment", NAME)["spec"]["template"]
    port = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "metrics")
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    service = standalone.find(rendered, "Service", f"{NAME}-metrics")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    annotations = service["metadata"]["annotations"]
    allowed = json.loads(annotations["networking.resources.gardener.cloud/from-all-seed-scrape-targets-allowed-ports"])
    assert allowed == [{"port": port, "protocol": "TCP"}]
    assert json.loads(annotations["networking.resources.gardener.cloud/namespace-selectors"]) == [
        {"matchLabels": {"kubernetes.io/metadata.name": "garden"}}
    ]
    assert annotations["networking.resources.gardener.cloud/pod-label-selector-namespace-alias"] == "extensions"


def test_alerts_and_the_dashboard_name_only_metrics_the_extension_exports(rendered: list[dict[str, Any]]) -> None:
    exported = _exported_metric_names()
    rules = next(d for d in rendered if d["kind"] == "PrometheusRule")
    assert rules["metadata"]["labels"]["prometheus"] == "seed"
    alerts = [rule for group in rules["spec"]["groups"] for rule in group["rules"]]
    assert alerts, "alerting rules"
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning", "info")
        named = set(re.findall(r"machine_preservation_[a-z_]+", alert["expr"]))
        assert named, alert["alert"]
        assert named <= exported, (alert["alert"], named - exported)
    dashboard_map = next(d for d in rendered if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"])
    assert dashboard_map["metadata"]["namespace"] == "garden"
    assert dashboard_map["metadata"]["labels"]["dashboard.monitoring.gardener.cloud/seed"] == "true"
    dashboard = json.loads(dashboard_map["data"]["machine-preservation.json"])
    targets = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert any("machine_preservation_preserved_machines" in expr and "namespace" in expr for expr in targets)
    for expr in targets:
        named = set(re.findall(r"machine_preservation_[a-z_]+", expr))
        assert named, expr
        assert named <= exported, (expr, named - exported)


def test_every_deployment_has_a_vpa_and_the_controller_a_pdb(rendered: list[dict[str, Any]]) -> None:
    deployments = {d["metadata"]["name"] for d in rendered if d["kind"] == "Deployment"}
    vpas = {d["spec"]["targetRef"]["name"]: d for d in rendered if d["kind"] == "VerticalPodAutoscaler"}
    assert set(vpas) == deployments
    for vpa in vpas.values():
        assert vpa["spec"]["targetRef"]["kind"] == "Deployment"
        assert vpa["spec"]["resourcePolicy"]["containerPolicies"][0]["controlledValues"] == "RequestsOnly"
    pdb = standalone.find(rendered, "PodDisruptionBudget", NAME)
    pod_labels = standalone.find(rendered, "Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
