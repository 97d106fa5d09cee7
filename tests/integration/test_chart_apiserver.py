"""The chart against the real API server: server-side dry-run of every value set, then a real `helm install`
whose webhook configurations point at a locally running webhook (the project's WebhookServer, certificates
from the certs manager running as the chart's certs ServiceAccount, the serving Secret's pair in its cert
dir as the kubelet would mount it), so the chart's own matchConditions decide which requests reach the
webhook; then upgrade and uninstall."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config
from kubernetes.aio import config as aio_config
from kubernetes.client.exceptions import ApiException

from machine_preservation.certs import commands as certs_commands
from machine_preservation.certs.manager import CertificateManager
from machine_preservation.cli.main import build_parser
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.integration import kube
from tests.integration.chart import CHART, find, helm, set_args, template
from tests.integration.test_chart_render import VALUE_SETS
from tests.polling import eventually

T = TypeVar("T")
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
MACHINES = ("machine.sapcloud.io", "v1alpha1")

# cert-manager is not installed here: minimal stand-in CRDs (any content accepted) let the API server check
# everything else about the value sets using it (kinds, namespacing, the other objects). The Prometheus Operator's
# ServiceMonitor is its real CRD, as Gardener ships it for seeds.
CERT_MANAGER_STAND_IN_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }
    for group, kind, plural in (
        ("cert-manager.io", "Certificate", "certificates"),
        ("cert-manager.io", "Issuer", "issuers"),
    )
]


@pytest.fixture(scope="module")
def cert_manager_crds(kube_client: client.ApiClient, seed_system: None) -> Iterator[None]:
    """cert-manager's kinds as stand-ins; prometheus-operator's ServiceMonitor is the real CRD (`seed_system`, shared
    by the session: deleting it here would take it from the seed chart's tests)."""
    api = client.ApiextensionsV1Api(kube_client)
    for crd in CERT_MANAGER_STAND_IN_CRDS:
        api.create_custom_resource_definition(crd)

    def established() -> bool:
        return all(
            any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
            for crd in (api.read_custom_resource_definition(d["metadata"]["name"]) for d in CERT_MANAGER_STAND_IN_CRDS)
        )

    eventually(established)
    yield
    for crd in CERT_MANAGER_STAND_IN_CRDS:
        api.delete_custom_resource_definition(crd["metadata"]["name"])


def kubectl(toolchain: Toolchain, kubeconfig: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(toolchain.kubectl), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


DRY_RUN_SETS = [
    "default",
    "all-webhooks",
    "cert-manager",
    "cert-manager-external-issuer",
    "provided",
    "remote-clusters",
    "seed",
    "native",
    "monitoring",
    "registration-only",
    "customised",
]


@pytest.mark.usefixtures("cert_manager_crds")
@pytest.mark.parametrize("name", DRY_RUN_SETS)
def test_rendered_manifests_pass_server_side_dry_run(
    toolchain: Toolchain, control_plane: ControlPlane, namespace: str, name: str
) -> None:
    values = dict(VALUE_SETS[name])
    if "clusters.control.namespace" in values:
        values["clusters.control.namespace"] = json.dumps(namespace)
    documents = template(toolchain.helm, values, namespace=namespace, release=namespace)
    manifest = yaml.safe_dump_all(documents)
    result = kubectl(
        toolchain, control_plane.kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=manifest
    )
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(documents), result.stdout


def test_server_side_dry_run_has_teeth(toolchain: Toolchain, control_plane: ControlPlane, namespace: str) -> None:
    """The same check rejects a node webhook with a timeout the API server does not allow."""
    documents = template(toolchain.helm, {}, namespace=namespace, release=namespace)
    validating = find(documents, "ValidatingWebhookConfiguration")
    validating["webhooks"][0]["timeoutSeconds"] = 31
    result = kubectl(
        toolchain,
        control_plane.kubeconfig,
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump(validating),
    )
    assert result.returncode != 0
    assert "timeoutSeconds" in result.stderr


# --- a real install, exercised through the API server --------------------------------------------------------


async def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Blocking client calls run in a thread: the API server calls back into this event loop's webhook."""
    return await asyncio.to_thread(function, *args, **kwargs)


def _client_for(kubeconfig: Path) -> client.ApiClient:
    api_client: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))
    return api_client


class Calls:
    def __init__(self, server: WebhookServer) -> None:
        self.server = server

    def __call__(self, endpoint: str) -> float:
        value = self.server.metrics.registry.get_sample_value(
            "machine_preservation_webhook_requests_total", {"endpoint": endpoint}
        )
        return value or 0.0


async def test_helm_install_upgrade_uninstall_with_the_charts_match_conditions(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    namespace: str,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    release = namespace
    # Short object names: the test's client certificates carry the ServiceAccount user name as their CN (≤ 64).
    fullname = f"mp{namespace[-6:]}"
    port = free_port()
    values = {
        "fullnameOverride": json.dumps(fullname),
        "webhooks.clientConfig.url": json.dumps(f"https://127.0.0.1:{port}"),
        "webhooks.shoots.register": "true",
    }
    install = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig), *set_args(values)]
    await call(helm, toolchain.helm, "install", release, str(CHART), *install)
    registration = client.AdmissionregistrationV1Api(kube_client)
    core = client.CoreV1Api(kube_client)
    uninstalled = False
    try:
        # The certs manager exactly as the chart runs it, as the chart's certs ServiceAccount.
        rendered = template(toolchain.helm, values, namespace=namespace, release=release)
        pod = find(rendered, "Deployment", f"{fullname}-webhook")["spec"]["template"]["spec"]
        certs_pod = find(rendered, "Deployment", f"{fullname}-certs")["spec"]["template"]["spec"]
        server_args = build_parser().parse_args(next(c for c in pod["containers"] if c["name"] == "webhook")["args"])
        settings = certs_commands.settings_from(build_parser().parse_args(certs_pod["containers"][0]["args"]))
        assert settings.cert_dir is None, "the certs manager shares no directory with the webhook"
        assert settings.serving_secret == (namespace, f"{fullname}-webhook-tls")
        cert_dir = tmp_path / "certs"
        certs_kubeconfig = kubeconfig_for(f"system:serviceaccount:{namespace}:{fullname}-certs")
        certs_client = await aio_config.new_client_from_config(config_file=str(certs_kubeconfig))
        sa_kubeconfig = kubeconfig_for(f"system:serviceaccount:{namespace}:{fullname}-webhook")
        async with certs_client:
            manager = CertificateManager(settings=settings, api_client=certs_client, remote_clients={})
            first = await manager.sync_once()
            configuration = next(c for c in rendered if c["kind"] == "ValidatingWebhookConfiguration")
            name = configuration["metadata"]["name"]
            assert set(first.injected) == {f"validating/{name}", f"mutating/{name}"}
            assert first.published
            await call(mount_serving_secret, core, namespace, f"{fullname}-webhook-tls", cert_dir)

            admission = AdmissionSettings(
                controller_username=server_args.controller_username,
                mcm_usernames=frozenset(server_args.mcm_username),
            )
            # The deletion guard's reads, too, as the chart's webhook ServiceAccount.
            machine_sets = KubernetesMachineSets(kubeconfig=sa_kubeconfig)
            server = WebhookServer(
                host="127.0.0.1",
                port=port,
                cert_dir=cert_dir,
                settings=admission,
                machine_sets=machine_sets,
                cert_poll_interval=0.2,
            )
            async with server:
                await exercise(
                    kube_client=kube_client,
                    namespace=namespace,
                    calls=Calls(server),
                    kubeconfig_for=kubeconfig_for,
                    controller_username=server_args.controller_username,
                )

                # Upgrade: Helm never owned the caBundle or the Secrets' data, so all survive.
                secret_before = await call(core.read_namespaced_secret, f"{fullname}-webhook-certs", namespace)
                serving_before = await call(core.read_namespaced_secret, f"{fullname}-webhook-tls", namespace)
                await call(
                    helm, toolchain.helm, "upgrade", release, str(CHART), *install, "--set", "webhook.replicas=3"
                )
                for read in (
                    registration.read_validating_webhook_configuration,
                    registration.read_mutating_webhook_configuration,
                ):
                    configuration = await call(read, f"{fullname}.{namespace}")
                    assert all(w.client_config.ca_bundle for w in configuration.webhooks)
                secret_after = await call(core.read_namespaced_secret, f"{fullname}-webhook-certs", namespace)
                assert secret_after.data == secret_before.data
                serving_after = await call(core.read_namespaced_secret, f"{fullname}-webhook-tls", namespace)
                assert serving_after.data == serving_before.data
                assert (await manager.sync_once()).injected == ()

                uninstall = [
                    "uninstall",
                    release,
                    "--namespace",
                    namespace,
                    "--kubeconfig",
                    str(control_plane.kubeconfig),
                ]
                await call(helm, toolchain.helm, *uninstall)
                uninstalled = True
                await call(
                    assert_nothing_left,
                    kube_client=kube_client,
                    release=release,
                    fullname=fullname,
                    namespace=namespace,
                )

                # With the webhook still running, nothing routes requests to it any more.
                node = f"after-{uuid.uuid4().hex[:6]}"
                await call(core.create_node, {"metadata": {"name": node}})
                before = Calls(server)("validate-preserve-annotation")
                await call(core.patch_node, node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "bogus"}}})
                assert Calls(server)("validate-preserve-annotation") == before
                await call(core.delete_node, node)
            await machine_sets.close()
    finally:
        if not uninstalled:
            await call(
                helm,
                toolchain.helm,
                "uninstall",
                release,
                "--namespace",
                namespace,
                "--kubeconfig",
                str(control_plane.kubeconfig),
                check=False,
            )


async def exercise(
    *,
    kube_client: client.ApiClient,
    namespace: str,
    calls: Calls,
    kubeconfig_for: Callable[..., Path],
    controller_username: str,
) -> None:
    """Requests by an SRE, a kubelet, MCM and the controller; only those the chart's rules select arrive."""
    with contextlib.ExitStack() as identities:
        await _exercise(
            kube_client=kube_client,
            namespace=namespace,
            calls=calls,
            kubeconfig_for=kubeconfig_for,
            controller_username=controller_username,
            identities=identities,
        )


async def _exercise(
    *,
    kube_client: client.ApiClient,
    namespace: str,
    calls: Calls,
    kubeconfig_for: Callable[..., Path],
    controller_username: str,
    identities: contextlib.ExitStack,
) -> None:
    core = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    kubelet_node = f"n-{uuid.uuid4().hex[:6]}"
    kubelet = client.CoreV1Api(
        identities.enter_context(_client_for(kubeconfig_for(f"system:node:{kubelet_node}", ("system:nodes",))))
    )
    mcm = client.CoreV1Api(identities.enter_context(_client_for(kubeconfig_for(MCM, ("system:masters",)))))
    mcm_custom = client.CustomObjectsApi(mcm.api_client)
    controller = client.CoreV1Api(
        identities.enter_context(_client_for(kubeconfig_for(controller_username, ("system:masters",))))
    )
    preserve = "validate-preserve-annotation"

    # The API server picks the configurations (and the injected caBundle) up through an informer.
    def bogus_node_denied() -> str | None:
        return kube.denial(
            lambda: core.create_node(
                {"metadata": {"name": kubelet_node, "annotations": {v.PRESERVE_ANNOTATION: "bogus"}}}, dry_run="All"
            )
        )

    message = await asyncio.to_thread(eventually, bogus_node_denied)
    assert "preserve-annotation.nodes.machine-preservation.sapcloud.io" in message
    assert "bogus" in message

    await call(core.create_node, {"metadata": {"name": kubelet_node}})
    try:
        # An unrelated change never reaches the webhook.
        count = calls(preserve)
        await call(core.patch_node, kubelet_node, {"metadata": {"labels": {"unrelated": "yes"}}})
        assert calls(preserve) == count
        # A relevant change by an SRE does, through the main resource and through nodes/status.
        denial = await call(
            kube.denial,
            lambda: core.patch_node(kubelet_node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "Now"}}}),
        )
        assert "Now" in denial
        denial = await call(
            kube.denial,
            lambda: core.patch_node_status(
                kubelet_node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "forever"}}}
            ),
        )
        assert "forever" in denial
        assert calls(preserve) == count + 2
        await call(core.patch_node, kubelet_node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "now"}}})
        assert calls(preserve) == count + 3
        # Kubelets, MCM and the controller are excluded by the chart's matchConditions.
        for identity, value in ((kubelet, "kubelet-value"), (mcm, "mcm-value"), (controller, "controller-value")):
            await call(identity.patch_node, kubelet_node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}})
        assert calls(preserve) == count + 3

        # The mutating CA guard: a preserved node's CA annotation is put back.
        ca_calls = calls("mutate-node-ca-annotation")
        await call(
            controller.patch_node,
            kubelet_node,
            {
                "metadata": {
                    "annotations": {
                        v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true",
                        v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION: "true",
                    }
                }
            },
        )
        assert calls("mutate-node-ca-annotation") == ca_calls
        patched = await call(
            core.patch_node, kubelet_node, {"metadata": {"annotations": {v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "false"}}}
        )
        assert patched.metadata.annotations[v.CA_SCALE_DOWN_DISABLED_ANNOTATION] == "true"
        assert calls("mutate-node-ca-annotation") == ca_calls + 1
    finally:
        await call(core.delete_node, kubelet_node)

    # Machines: bad values denied (fail closed), the deletion guard only sees MCM's deletes of Failed machines.
    def machine(name: str, value: str) -> dict[str, Any]:
        return {
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "annotations": {v.PRESERVE_ANNOTATION: value}},
            "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
        }

    denial = await call(
        kube.denial,
        lambda: custom.create_namespaced_custom_object(
            *MACHINES, namespace, "machines", machine("bad", "auto-preserve")
        ),
    )
    assert "preserve-annotation.machines.machine-preservation.sapcloud.io" in denial
    for name in ("m-user", "m-mcm"):
        await call(custom.create_namespaced_custom_object, *MACHINES, namespace, "machines", machine(name, "now"))
    deletions = calls("validate-machine-deletion")
    await call(custom.delete_namespaced_custom_object, *MACHINES, namespace, "machines", "m-user")
    assert calls("validate-machine-deletion") == deletions
    await call(mcm_custom.delete_namespaced_custom_object, *MACHINES, namespace, "machines", "m-mcm")
    assert calls("validate-machine-deletion") == deletions, "not Failed: MCM's delete does not wait for the guard"

    # A Failed machine whose MachineSet has auto-preservation room: MCM's delete is denied, which needs the
    # guard to list MachineSets and machines with the chart's RBAC (without it the answer is "cannot decide").
    machine_set = await call(
        custom.create_namespaced_custom_object,
        *MACHINES,
        namespace,
        "machinesets",
        {
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineSet",
            "metadata": {"name": "ms"},
            "spec": {"replicas": 1, "autoPreserveFailedMachineMax": 1},
        },
    )
    owner = {
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineSet",
        "name": "ms",
        "uid": machine_set["metadata"]["uid"],
        "controller": True,
    }
    failed = {
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": "m-failed", "ownerReferences": [owner]},
        "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
    }
    await call(custom.create_namespaced_custom_object, *MACHINES, namespace, "machines", failed)
    await call(
        custom.patch_namespaced_custom_object_status,
        *MACHINES,
        namespace,
        "machines",
        "m-failed",
        {"status": {"currentStatus": {"phase": "Failed"}}},
    )
    denial = await call(
        kube.denial,
        lambda: mcm_custom.delete_namespaced_custom_object(*MACHINES, namespace, "machines", "m-failed"),
    )
    assert "deletion.machines.machine-preservation.sapcloud.io" in denial
    assert "cannot decide" not in denial
    assert "m-failed" in denial
    assert calls("validate-machine-deletion") == deletions + 1

    # Shoots: called on create, and on update only when the workers (or spec.extensions) change.
    shoot = {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": {"name": "s"},
        "spec": {"provider": {"type": "aws", "workers": [{"name": "w", "minimum": 1, "maximum": 3}]}},
    }
    shoots = ("core.gardener.cloud", "v1beta1", namespace, "shoots")
    before = calls("validate-shoot")
    await call(custom.create_namespaced_custom_object, *shoots, shoot)
    await call(custom.patch_namespaced_custom_object, *shoots, "s", {"metadata": {"labels": {"x": "y"}}})
    assert calls("validate-shoot") == before + 1
    denial = await call(
        kube.denial,
        lambda: custom.patch_namespaced_custom_object(
            *shoots,
            "s",
            {
                "spec": {
                    "provider": {
                        "workers": [
                            {
                                "name": "w",
                                "minimum": 1,
                                "maximum": 3,
                                "machineControllerManager": {"autoPreserveFailedMachineMax": 5},
                            }
                        ]
                    }
                }
            },
        ),
    )
    assert "autoPreserveFailedMachineMax" in denial
    # Reached the webhook (its denial); the API server may call it again for the same request when a connection
    # breaks under it (seen once in CI on a loaded machine), so at least once.
    assert calls("validate-shoot") >= before + 2


def mount_serving_secret(core: client.CoreV1Api, namespace: str, name: str, cert_dir: Path) -> None:
    """What the kubelet does for the webhook pod's `certs` volume: the Secret's tls.crt and tls.key as files."""
    data = core.read_namespaced_secret(name, namespace).data or {}
    cert_dir.mkdir(parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key"):
        (cert_dir / key).write_bytes(base64.b64decode(data[key]))


def assert_nothing_left(*, kube_client: client.ApiClient, release: str, fullname: str, namespace: str) -> None:
    selector = f"app.kubernetes.io/instance={release}"
    registration = client.AdmissionregistrationV1Api(kube_client)
    rbac = client.RbacAuthorizationV1Api(kube_client)
    core = client.CoreV1Api(kube_client)
    apps = client.AppsV1Api(kube_client)
    listings = {
        "validating": registration.list_validating_webhook_configuration(label_selector=selector).items,
        "mutating": registration.list_mutating_webhook_configuration(label_selector=selector).items,
        "clusterroles": rbac.list_cluster_role(label_selector=selector).items,
        "clusterrolebindings": rbac.list_cluster_role_binding(label_selector=selector).items,
        "roles": rbac.list_namespaced_role(namespace, label_selector=selector).items,
        "secrets": core.list_namespaced_secret(namespace, label_selector=selector).items,
        "networkpolicies": client.NetworkingV1Api(kube_client)
        .list_namespaced_network_policy(namespace, label_selector=selector)
        .items,
        "deployments": apps.list_namespaced_deployment(namespace, label_selector=selector).items,
    }
    assert {kind: [o.metadata.name for o in items] for kind, items in listings.items() if items} == {}
    with pytest.raises(ApiException) as gone:
        registration.read_validating_webhook_configuration(f"{fullname}.{namespace}")
    assert gone.value.status == 404
