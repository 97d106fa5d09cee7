"""The garden admission's generated certificates (charts/gardener-extension-machine-preservation-admission with no
global.certificate.secretName), rendered as gardener-operator renders the two parts and run on real components.

Two real API servers: the session's control plane plays the garden runtime cluster, a second kube-apiserver (on
the same etcd) the virtual garden. The real gardener-resource-manager (GRM) runs between them as the runtime
cluster's GRM does for the virtual garden: it applies the application part from a ManagedResource (as
gardener-operator delivers it) and issues the token of the admission's ServiceAccount into the token-requestor
Secret gardener-operator creates for the admission. The certificate loop runs with the arguments of the runtime
part's Deployment, as the runtime part's ServiceAccount under the part's Role, and in the virtual garden as the
admission's ServiceAccount under the application part's RBAC, with the kubeconfig gardener-operator mounts (its
generic token kubeconfig and that token; the kubelet's projected volume is a directory here, and the token file
path in the kubeconfig points into it). The administrator only installs, plays the kubelet, and checks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from kubernetes import client as sync_client
from kubernetes import config as sync_config
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs.commands import settings_from
from machine_preservation.certs.manager import CertificateManager
from machine_preservation.certs.pairs import fingerprint, issued_by, load_certificates
from machine_preservation.cli.main import build_parser
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.grm import GrmRunner, GrmSettings
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook import commands as webhook_commands
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.integration import chart as standalone
from tests.integration.test_gardener_admission_chart import (
    APPLICATION,
    NAME,
    OPERATOR_APPLICATION_VALUES,
    OPERATOR_RUNTIME_VALUES,
    RELEASE,
    RUNTIME,
    container,
    dry_run,
    merge,
    render,
)
from tests.integration.test_gardener_admission_chart import CHART as UMBRELLA
from tests.polling import eventually_async

CERTS = f"{NAME}-certs"  # the loop's Deployment, ServiceAccount, Role and state Secret
SERVING = f"{NAME}-tls"  # the serving pair the server mounts
# What gardener-operator creates for every admission (admission.go, v1.150: getVirtualClusterAccessSecret, from
# gardenerutils.NewShootAccessSecret): a token-requestor Secret in `garden` of the runtime cluster for the
# ServiceAccount extension-admission-<name> in kube-system of the virtual garden, the one it names to the
# application part as gardener.virtualCluster.serviceAccount.
ACCESS_SECRET = f"shoot-access-extension-admission-{RELEASE}"
ADMISSION_ACCOUNT = OPERATOR_APPLICATION_VALUES["gardener"]["virtualCluster"]["serviceAccount"]
# Where gardener-operator mounts the virtual garden kubeconfig (gardenerutils.VolumeMountPathGenericKubeconfig) and
# the variable naming it (InjectGenericGardenKubeconfig).
GARDEN_KUBECONFIG = "$(GARDEN_KUBECONFIG)"
# Where the loop finds the manifest of the configuration it keeps (the runtime part's ConfigMap).
MANIFEST_DIR = Path("/etc/machine-preservation/shoot-webhook")
MANIFEST_KEY = "validatingwebhookconfiguration.yaml"
GRM_SYNC = "15s"  # the least GRM accepts


def documents_of(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


# --- rendering ---------------------------------------------------------------------------------------------------


def test_without_a_secret_the_runtime_part_runs_the_certificate_loop(toolchain: Toolchain, tmp_path: Path) -> None:
    documents = render(toolchain, tmp_path, RUNTIME, OPERATOR_RUNTIME_VALUES)
    args = build_parser().parse_args(container(documents, CERTS)["args"])
    assert (args.command, args.action) == ("certs", "run")
    assert args.secret == ("garden", CERTS)
    assert args.serving_secret == ("garden", SERVING)
    assert args.cert_dir is None
    assert args.kubeconfig is None  # its own identity in the runtime cluster: the pod's token
    # The configuration in the virtual garden, through the kubeconfig gardener-operator mounts, kept as the
    # mounted manifest says: the very configuration the application part renders.
    assert not args.webhook_configuration
    [ref] = args.own_webhook_configuration
    assert (ref.kind.value, ref.name, str(ref.kubeconfig)) == ("validating", NAME, GARDEN_KUBECONFIG)
    assert ref.template == MANIFEST_DIR / MANIFEST_KEY
    pod = standalone.find(documents, "Deployment", CERTS)["spec"]["template"]["spec"]
    assert {"name": "shoot-webhook", "mountPath": str(MANIFEST_DIR), "readOnly": True} in container(documents, CERTS)[
        "volumeMounts"
    ]
    volume = next(v for v in pod["volumes"] if v["name"] == "shoot-webhook")
    manifest = yaml.safe_load(
        standalone.find(documents, "ConfigMap", volume["configMap"]["name"])["data"][MANIFEST_KEY]
    )
    application = render(
        toolchain, tmp_path, APPLICATION, OPERATOR_APPLICATION_VALUES, namespace=f"extension-{RELEASE}"
    )
    rendered = standalone.find(application, "ValidatingWebhookConfiguration", NAME)
    assert rendered["metadata"].pop("annotations") == {"resources.gardener.cloud/ignore": "true"}
    assert manifest == rendered
    assert args.shoot_managed_resource is None
    # The certificate names the host the virtual garden calls and the Service's names.
    settings = settings_from(args)
    assert f"{NAME}.garden" in settings.identity.dns_names
    assert f"{NAME}.garden.svc" in settings.identity.dns_names
    assert (settings.policy.ca_validity, settings.policy.ca_overlap) == (dt.timedelta(days=365), dt.timedelta(days=1))

    # The server mounts only the published pair.
    pod = standalone.find(documents, "Deployment", NAME)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "certs")
    assert volume["secret"]["secretName"] == SERVING
    # Both Secrets rendered empty (no key in values, none in the rendered part), created once by GRM.
    secrets = {d["metadata"]["name"]: d for d in documents_of(documents, "Secret")}
    assert set(secrets) == {CERTS, SERVING}
    for secret in secrets.values():
        assert not {"data", "stringData"} & secret.keys()
        assert secret["metadata"]["annotations"] == {"resources.gardener.cloud/ignore": "true"}

    # The loop's pods are not the server's: the Service and the PodDisruptionBudget never select them.
    loop_labels = standalone.find(documents, "Deployment", CERTS)["spec"]["template"]["metadata"]["labels"]
    selector = standalone.find(documents, "Service", NAME)["spec"]["selector"]
    assert not selector.items() <= loop_labels.items()
    assert loop_labels["networking.resources.gardener.cloud/to-virtual-garden-kube-apiserver-tcp-443"] == "allowed"
    pod = standalone.find(documents, "Deployment", CERTS)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == CERTS
    assert pod["priorityClassName"] == "gardener-garden-system-400"

    # Its rights in the runtime cluster: its two Secrets, by name, get and patch; nothing else.
    [role] = documents_of(documents, "Role")
    assert role["metadata"]["name"] == CERTS
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [CERTS, SERVING], "verbs": ["get", "patch"]}
    ]
    [binding] = documents_of(documents, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CERTS, "namespace": "garden"}]
    assert not [d for d in documents if d["kind"].startswith("Cluster")]


def test_the_server_opts_out_of_the_virtual_garden_kubeconfig(toolchain: Toolchain, tmp_path: Path) -> None:
    """gardener-operator injects the virtual garden kubeconfig into every container that does not name
    GARDEN_KUBECONFIG yet (gardenerutils.InjectGenericGardenKubeconfig): the server names it, empty, so only the
    certificate loop holds the token that may patch the webhook configuration."""
    generated = render(toolchain, tmp_path, RUNTIME, OPERATOR_RUNTIME_VALUES)
    assert {"name": "GARDEN_KUBECONFIG", "value": ""} in container(generated)["env"]
    assert "GARDEN_KUBECONFIG" not in {e["name"] for e in container(generated, CERTS)["env"]}
    existing = {"global": {"certificate": {"secretName": "tls", "caBundle": "-----BEGIN CERTIFICATE-----"}}}
    documents = render(toolchain, tmp_path, RUNTIME, merge(existing, OPERATOR_RUNTIME_VALUES))
    assert {"name": "GARDEN_KUBECONFIG", "value": ""} in container(documents)["env"]


def test_without_gardener_operator_the_loop_keeps_the_configuration_of_its_own_cluster(
    toolchain: Toolchain, tmp_path: Path
) -> None:
    """Plain Helm puts both parts in one cluster: the loop's own identity gets the configuration's rights."""
    documents = render(toolchain, tmp_path, UMBRELLA, {}, namespace="garden")
    args = build_parser().parse_args(container(documents, CERTS)["args"])
    [ref] = args.own_webhook_configuration
    assert (ref.name, ref.kubeconfig) == (NAME, None)
    [binding] = documents_of(documents, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CERTS, "namespace": "garden"}]
    labels = standalone.find(documents, "Deployment", CERTS)["spec"]["template"]["metadata"]["labels"]
    assert "networking.resources.gardener.cloud/to-virtual-garden-kube-apiserver-tcp-443" not in labels


def test_without_a_secret_the_application_part_lets_the_admission_identity_keep_the_bundle(
    toolchain: Toolchain, tmp_path: Path
) -> None:
    documents = render(toolchain, tmp_path, APPLICATION, OPERATOR_APPLICATION_VALUES, namespace=f"extension-{RELEASE}")
    configuration = standalone.find(documents, "ValidatingWebhookConfiguration", NAME)
    # No bundle rendered (the loop writes it), and GRM creates the configuration once instead of putting the
    # rendered webhooks, without the bundle, back on every sync.
    assert configuration["metadata"]["annotations"] == {"resources.gardener.cloud/ignore": "true"}
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    [role] = documents_of(documents, "ClusterRole")
    assert role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [NAME],
            "verbs": ["get", "patch"],
        }
    ]
    [binding] = documents_of(documents, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", **ADMISSION_ACCOUNT}]
    assert len(documents) == 3


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"secretName": "tls"}, "at '/global/certificate/caBundle': minLength: got 0, want 1"),
        ({"secretName": "tls", "caBundle": ""}, "at '/global/certificate/caBundle': minLength: got 0, want 1"),
        ({"caBundle": "-----BEGIN CERTIFICATE-----"}, "at '/global/certificate/caBundle': maxLength: got 27, want 0"),
        ({"caOverlap": "1d"}, "/global/certificate/caOverlap"),
        ({"servingRenewFraction": 1}, "/global/certificate/servingRenewFraction"),
        ({"tls": {"key": "x"}}, "additional properties 'tls' not allowed"),
    ],
    ids=["secret-without-ca", "secret-empty-ca", "ca-without-secret", "duration", "fraction", "key-in-values"],
)
@pytest.mark.parametrize("chart", [RUNTIME, APPLICATION], ids=["runtime", "application"])
def test_the_schema_tells_the_modes_apart(
    toolchain: Toolchain, tmp_path: Path, chart: Path, values: dict[str, Any], message: str
) -> None:
    result = standalone_render_failure(toolchain, tmp_path, chart, {"global": {"certificate": values}})
    assert "values don't meet the specifications of the schema" in result
    assert message in result, result


def standalone_render_failure(toolchain: Toolchain, tmp_path: Path, chart: Path, values: dict[str, Any]) -> str:
    values_file = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = standalone.helm(
        toolchain.helm, "template", RELEASE, str(chart), "--namespace", "garden", "-f", str(values_file), check=False
    )
    assert result.returncode != 0
    return result.stderr


@pytest.mark.parametrize("chart", [UMBRELLA, RUNTIME, APPLICATION], ids=["umbrella", "runtime", "application"])
def test_lint_without_certificate_values(toolchain: Toolchain, chart: Path) -> None:
    result = standalone.helm(toolchain.helm, "lint", "--strict", str(chart))
    assert "0 chart(s) failed" in result.stdout


def test_every_generated_mode_object_is_accepted_by_the_api_server(
    toolchain: Toolchain, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    runtime = render(toolchain, tmp_path, RUNTIME, OPERATOR_RUNTIME_VALUES, namespace=namespace)
    application = render(
        toolchain, tmp_path, APPLICATION, OPERATOR_APPLICATION_VALUES, namespace=f"extension-{RELEASE}"
    )
    documents = runtime + application
    result = dry_run(toolchain, control_plane.kubeconfig, documents)
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(documents), result.stdout


# --- on real API servers, with the real token requestor -----------------------------------------------------------


@dataclass
class Garden:
    namespace: str  # in the runtime cluster, where gardener-operator puts the runtime part (`garden` in a garden)
    virtual: ControlPlane
    grm: GrmRunner


@pytest.fixture
def garden(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Garden]:
    """A virtual garden (its own kube-apiserver) and the runtime cluster's GRM for it, watching `namespace`."""
    gardener.install_seed_crds(control_plane.kubeconfig)
    virtual = gardener.start_shoot_control_plane(
        control_plane, tmp_path / "virtual", name=f"virtual-{namespace}", namespaces=[]
    )
    grm = GrmRunner(
        seed=control_plane,
        shoot=virtual,
        namespace=namespace,
        directory=tmp_path / "grm",
        settings=GrmSettings(sync_period=GRM_SYNC),
    )
    try:
        grm.start()
        yield Garden(namespace=namespace, virtual=virtual, grm=grm)
    finally:
        grm.stop()
        virtual.stop()


def _sync_client(kubeconfig: Path) -> sync_client.ApiClient:
    return sync_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def _managed_resource(namespace: str, name: str, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The application part as gardener-operator hands it to GRM: a ManagedResource (no class) and its Secret."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"managedresource-{name}", "namespace": namespace},
        "data": {"objects.yaml": base64.b64encode(yaml.safe_dump_all(documents).encode()).decode()},
    }
    resource = {
        "apiVersion": f"{gardener.RESOURCES_GROUP}/{gardener.RESOURCES_VERSION}",
        "kind": "ManagedResource",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"secretRefs": [{"name": secret["metadata"]["name"]}], "keepObjects": False},
    }
    return [secret, resource]


def _access_secret(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": ACCESS_SECRET,
            "namespace": namespace,
            "labels": {
                "resources.gardener.cloud/purpose": "token-requestor",
                "resources.gardener.cloud/class": "shoot",
            },
            "annotations": {
                "serviceaccount.resources.gardener.cloud/name": ADMISSION_ACCOUNT["name"],
                "serviceaccount.resources.gardener.cloud/namespace": ADMISSION_ACCOUNT["namespace"],
            },
        },
    }


def _own_token_kubeconfig(control_plane: ControlPlane, core: sync_client.CoreV1Api, namespace: str, path: Path) -> Path:
    """What the kubelet gives the loop's pod in the runtime cluster: a token of its ServiceAccount."""
    answer = core.create_namespaced_service_account_token(
        CERTS, namespace, {"spec": {"audiences": [control_plane.issuer], "expirationSeconds": 3600}}
    )
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": answer.status.token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


async def _secret_data(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, bytes]:
    secret = await core.read_namespaced_secret(name, namespace)
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


async def _bundle(registration: client.AdmissionregistrationV1Api) -> list[x509.Certificate]:
    configuration = await registration.read_validating_webhook_configuration(NAME)
    ca_bundle = configuration.webhooks[0].client_config.ca_bundle if configuration.webhooks else None
    return load_certificates(base64.b64decode(ca_bundle)) if ca_bundle else []


def _served(port: int, bundle: list[x509.Certificate], hostname: str) -> x509.Certificate:
    """The certificate the server presents, verified against `bundle` for `hostname` (raises if it does not)."""
    context = ssl.create_default_context(cadata="".join(c.public_bytes(Encoding.PEM).decode() for c in bundle))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


@contextlib.asynccontextmanager
async def kubelet(core: client.CoreV1Api, namespace: str, cert_dir: Path) -> AsyncIterator[None]:
    """The kubelet's refresh of the server's mounted Secret (the published pair), every 0.2 s."""

    async def refresh() -> None:
        while True:
            with contextlib.suppress(ApiException):
                data = await _secret_data(core, namespace, SERVING)
                if {"tls.crt", "tls.key"} <= data.keys():
                    for key in ("tls.key", "tls.crt"):
                        if not (cert_dir / key).exists() or (cert_dir / key).read_bytes() != data[key]:
                            (cert_dir / key).write_bytes(data[key])
            await asyncio.sleep(0.2)

    task = asyncio.create_task(refresh())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_loop_publishes_injects_and_rotates_in_the_virtual_garden(
    toolchain: Toolchain, control_plane: ControlPlane, garden: Garden, api: client.ApiClient, tmp_path: Path
) -> None:
    """(1) the Secrets are filled, (2) the virtual garden's configuration gets the CA bundle (and GRM's syncs leave
    it there), (3) the server serves a certificate that verifies with that bundle, (4) a CA rotation keeps the old and
    the new CA in the bundle through the overlap, and the server moves to the new CA meanwhile, (5) a changed webhook
    in a later release of the chart reaches the configuration."""
    ns = garden.namespace
    port = free_port()
    # Seconds-long lifetimes, so the rotation happens during the test: the CA is replaced 20 s after issuance (the
    # server must be up by then, on a busy machine too) and the old one trusted 30 s longer.
    values = {
        "global": {
            "webhook": {"url": f"https://127.0.0.1:{port}"},
            "certificate": {
                "caValidity": "80s",
                "caRotateBefore": "60s",
                "caOverlap": "30s",
                "propagationDelay": "2s",
                "servingValidity": "80s",
                "resync": 1,
            },
        }
    }
    runtime = render(toolchain, tmp_path, RUNTIME, merge(values, OPERATOR_RUNTIME_VALUES), namespace=ns)
    application = render(
        toolchain, tmp_path, APPLICATION, merge(values, OPERATOR_APPLICATION_VALUES), namespace=f"extension-{RELEASE}"
    )

    # gardener-operator's part: the application part through GRM into the virtual garden, the token-requestor
    # Secret and the generic token kubeconfig in the runtime cluster, the runtime part's objects.
    loop_objects = [
        d
        for d in runtime
        if d["kind"] in ("Secret", "ServiceAccount", "Role", "RoleBinding")
        and d["metadata"]["name"] in (CERTS, SERVING)
    ]
    assert len(loop_objects) == 5
    generic = gardener.generic_token_kubeconfig_secret(
        ns, server=garden.virtual.server, ca_pem=garden.virtual.ca.cert_pem
    )
    standalone.kubectl(
        toolchain.kubectl,
        control_plane.kubeconfig,
        "create",
        documents=[
            *loop_objects,
            _access_secret(ns),
            generic,
            *_managed_resource(ns, "admission-virtual", application),
        ],
    )
    admin = client.CoreV1Api(api)
    virtual_admin = await new_api_client(kubeconfig=garden.virtual.kubeconfig)
    registration = client.AdmissionregistrationV1Api(virtual_admin)
    try:
        # GRM's first sync of the ManagedResource (a 404 until then; a minute or more on a busy machine).
        await eventually_async(lambda: registration.read_validating_webhook_configuration(NAME), limit=120)
        assert await _bundle(registration) == []  # created by GRM as rendered: no bundle yet

        # The kubelet's projected volume of gardener-operator's injection: the generic kubeconfig and the token GRM
        # issued, in one directory (the kubeconfig's token file pointed there).
        token = await eventually_async(lambda: _token(admin, ns), limit=120)
        mount = tmp_path / "generic-kubeconfig"
        mount.mkdir()
        (mount / "token").write_text(token)
        kubeconfig = yaml.safe_load(base64.b64decode(generic["data"]["kubeconfig"]))
        assert kubeconfig["users"][0]["user"] == {"tokenFile": gardener.GENERIC_KUBECONFIG_TOKEN_FILE}
        kubeconfig["users"][0]["user"] = {"tokenFile": str(mount / "token")}
        (mount / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))

        # The loop's container as the kubelet starts it: $(GARDEN_KUBECONFIG) expanded, its own token in-cluster.
        # The manifest: the kubelet's view of the part's ConfigMap, in a directory of the test.
        manifest_dir = tmp_path / "shoot-webhook"
        manifest_dir.mkdir()
        (manifest_dir / MANIFEST_KEY).write_text(_manifest(runtime))
        arguments = [
            a.replace(GARDEN_KUBECONFIG, str(mount / "kubeconfig")).replace(str(MANIFEST_DIR), str(manifest_dir))
            for a in container(runtime, CERTS)["args"]
        ]
        args = build_parser().parse_args(arguments)
        settings = settings_from(args)
        with _sync_client(control_plane.kubeconfig) as sync_admin:
            own = _own_token_kubeconfig(
                control_plane, sync_client.CoreV1Api(sync_admin), ns, tmp_path / "own.kubeconfig"
            )
        local = await new_api_client(kubeconfig=own)
        remote = await new_api_client(kubeconfig=mount / "kubeconfig")
        manager = CertificateManager(settings=settings, api_client=local, remote_clients={mount / "kubeconfig": remote})

        cert_dir = tmp_path / "server-certs"
        cert_dir.mkdir()
        server_args = build_parser().parse_args(container(runtime)["args"])
        no_credentials = tmp_path / "no-credentials.kubeconfig"
        no_credentials.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "users": []}))
        machine_sets = KubernetesMachineSets(kubeconfig=no_credentials)
        stop = asyncio.Event()
        loop = asyncio.create_task(manager.run(stop=stop))
        try:
            # (1) the state and the published pair.
            state = await eventually_async(lambda: _filled(admin, ns, CERTS, "ca-bundle.crt"), limit=30)
            first_ca = load_certificates(state["ca.crt"])[0]
            await eventually_async(lambda: _filled(admin, ns, SERVING, "tls.crt"), limit=30)
            assert set((await _secret_data(admin, ns, SERVING)).keys()) == {"tls.crt", "tls.key"}

            # (2) the bundle in the virtual garden, written as the admission's ServiceAccount.
            bundle = await eventually_async(lambda: _bundle(registration), limit=30)
            assert fingerprint(first_ca) in {fingerprint(c) for c in bundle}
            managers = {
                entry.manager
                for entry in (await registration.read_validating_webhook_configuration(NAME)).metadata.managed_fields
                or []
            }
            assert "machine-preservation-certs" in managers

            async with kubelet(admin, ns, cert_dir):
                await eventually_async(lambda: (cert_dir / "tls.crt").exists(), limit=10)
                server = WebhookServer(
                    host="127.0.0.1",
                    port=port,
                    cert_dir=cert_dir,
                    settings=webhook_commands.settings_from(server_args, native=False),
                    machine_sets=machine_sets,
                    cert_poll_interval=0.2,
                )
                async with server:
                    # (3) what the server presents verifies with the bundle, for the URL's host and the Service's.
                    served = await asyncio.to_thread(_served, port, bundle, "127.0.0.1")
                    assert issued_by(served, first_ca)
                    await asyncio.to_thread(_served, port, bundle, f"{NAME}.{ns}.svc")

                    # (4) a new CA joins the virtual garden's bundle, the old one stays: what the server presents
                    # verifies with it, whichever CA signed it.
                    async def both() -> list[x509.Certificate] | None:
                        current = await _bundle(registration)
                        return current if len(current) == 2 else None

                    overlap = await eventually_async(both, limit=90)
                    assert fingerprint(overlap[1]) == fingerprint(first_ca), "the old CA left the bundle at once"
                    new_ca = overlap[0]
                    await asyncio.to_thread(_served, port, overlap, "127.0.0.1")

                    # The server moves to the new CA while the old one is still trusted ...
                    async def moved() -> list[x509.Certificate] | None:
                        current = await _bundle(registration)
                        served = await asyncio.to_thread(_served, port, current, "127.0.0.1")
                        return current if issued_by(served, new_ca) else None

                    at_move = await eventually_async(moved, limit=90)
                    assert {fingerprint(c) for c in at_move} == {fingerprint(new_ca), fingerprint(first_ca)}

                    # ... and only after the overlap does the old CA leave.
                    async def retired() -> bool:
                        return fingerprint(first_ca) not in {fingerprint(c) for c in await _bundle(registration)}

                    await eventually_async(retired, limit=90)
                    served = await asyncio.to_thread(_served, port, await _bundle(registration), "127.0.0.1")
                    assert not issued_by(served, first_ca)

            # GRM's syncs leave the bundle alone (`ignore`): hand-edit another object of the part, wait until GRM
            # has put it back (a sync after the bundle was written), and the bundle is still there.
            rbac = client.RbacAuthorizationV1Api(virtual_admin)
            role = f"{NAME}:ca-bundle"
            rendered = standalone.find(application, "ClusterRole", role)["rules"]
            widened = [{**rendered[0], "verbs": ["get", "patch", "list"]}]
            await rbac.patch_cluster_role(role, {"rules": widened})

            async def reverted() -> bool:
                rules = (await rbac.read_cluster_role(role)).rules or []
                return [r.model_dump(by_alias=True, exclude_none=True) for r in rules] == rendered

            await eventually_async(reverted, limit=30)
            assert await _bundle(registration)

            # (5) a chart release that changes the webhook reaches the virtual garden through the loop (GRM only
            # created the configuration), and the bundle stays.
            upgraded = merge(values, {"global": {"webhook": {"timeoutSeconds": 4}}}, OPERATOR_RUNTIME_VALUES)
            (manifest_dir / MANIFEST_KEY).write_text(
                _manifest(render(toolchain, tmp_path, RUNTIME, upgraded, namespace=ns))
            )

            async def timeout() -> int | None:
                configuration = await registration.read_validating_webhook_configuration(NAME)
                return configuration.webhooks[0].timeout_seconds if configuration.webhooks else None

            await eventually_async(lambda: _equals(timeout(), 4), limit=30)
            assert await _bundle(registration)
        finally:
            stop.set()
            await loop
            await machine_sets.close()
            await local.close()
            await remote.close()
    finally:
        await virtual_admin.close()


async def _token(core: client.CoreV1Api, namespace: str) -> str | None:
    data = await _secret_data(core, namespace, ACCESS_SECRET)
    return data["token"].decode() if "token" in data else None


async def _filled(core: client.CoreV1Api, namespace: str, name: str, key: str) -> dict[str, bytes] | None:
    data = await _secret_data(core, namespace, name)
    return data if key in data else None


def _manifest(runtime: list[dict[str, Any]]) -> str:
    text: str = standalone.find(runtime, "ConfigMap", f"{NAME}-webhook")["data"][MANIFEST_KEY]
    return text


async def _equals(value: Any, expected: object) -> bool:
    return bool(await value == expected)
