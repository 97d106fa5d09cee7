"""The garden admission chart (charts/gardener-extension-machine-preservation-admission), on real tools: helm v4
renders each part as gardener-operator does (the same values for both, plus what the operator injects into each)
and checks them against the schemas; a real kube-apiserver accepts every object and compiles the webhook's CEL;
and the application part's webhook configuration, as rendered, sends a labelled Shoot to the webhook server
running with the runtime part's arguments and serving certificate, and keeps others away from it.

Shoots are served by gardener-apiserver, which cannot run here: the Shoot stand-in CRD of the test control plane
(localcluster/crds) plays them, and the label gardener-apiserver's ExtensionLabels plugin would set is set by hand.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from machine_preservation.cli.main import build_parser
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook import commands as webhook_commands
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.integration import chart as standalone
from tests.polling import eventually
from tests.webhook import configurations as wc

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gardener-extension-machine-preservation-admission"
RUNTIME = CHART / "charts" / "runtime"
APPLICATION = CHART / "charts" / "application"
NAME = "gardener-extension-machine-preservation-admission"
# As gardener-operator renders them: release = the operator Extension's name; the runtime part into `garden` of
# the runtime cluster, the application part into extension-<name> of the virtual garden.
RELEASE = "machine-preservation"
RUNTIME_NAMESPACE = "garden"
VIRTUAL_NAMESPACE = f"extension-{RELEASE}"
DEFAULT_HOST = f"{NAME}.{RUNTIME_NAMESPACE}"
ENABLED_LABEL = "extensions.extensions.gardener.cloud/machine-preservation"
SHOOTS = ("core.gardener.cloud", "v1beta1", "shoots")
TLS_SECRET = "machine-preservation-admission-tls"  # an existing Secret of the operator's (example/extension.yaml)

# What gardener-operator v1.147 (to v1.150) merges over the admission values (pkg/operator/controller/extension/
# extension/admission/admission.go, v1.150: l. 103-113): into the runtime part ...
OPERATOR_RUNTIME_VALUES: dict[str, Any] = {
    "gardener": {
        "runtimeCluster": {"priorityClassName": "gardener-garden-system-400"},
        "virtualCluster": {"enabled": True, "namespace": VIRTUAL_NAMESPACE},
    }
}
# ... and into the application part (l. 195-205).
OPERATOR_APPLICATION_VALUES: dict[str, Any] = {
    "gardener": {
        "virtualCluster": {
            "enabled": True,
            "serviceAccount": {"name": f"extension-admission-{RELEASE}", "namespace": "kube-system"},
        }
    }
}


class Pki:
    def __init__(self, directory: Path) -> None:
        webhook_commands.write_self_signed(
            cert_dir=directory, names=(DEFAULT_HOST, "127.0.0.1"), now=dt.datetime.now(dt.UTC)
        )
        self.ca = (directory / "ca.crt").read_text()
        self.crt = (directory / "tls.crt").read_text()
        self.key = (directory / "tls.key").read_text()

    def values(self, **more: Any) -> dict[str, Any]:
        """The admission values an operator writes: the CA and the Secret with the serving pair (which the
        operator keeps in the runtime cluster; `secret` gives it), and `more` settings under global."""
        certificate = {"caBundle": self.ca, "secretName": TLS_SECRET}
        return {"global": {"certificate": certificate, **more}}

    def secret(self, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": TLS_SECRET, "namespace": namespace},
            "data": {
                key: base64.b64encode(text.encode()).decode()
                for key, text in (("tls.crt", self.crt), ("tls.key", self.key))
            },
        }


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("admission-pki"))


def merge(base: dict[str, Any], *overlays: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = json.loads(json.dumps(base))
    for overlay in overlays:
        for key, value in overlay.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
    return merged


def helm(
    toolchain: Toolchain, tmp_path: Path, chart: Path, values: dict[str, Any], *, namespace: str, release: str = RELEASE
) -> subprocess.CompletedProcess[str]:
    values_file = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    return standalone.helm(
        toolchain.helm, "template", release, str(chart), "--namespace", namespace, "-f", str(values_file), check=False
    )


def render(
    toolchain: Toolchain,
    tmp_path: Path,
    chart: Path,
    values: dict[str, Any],
    *,
    namespace: str = RUNTIME_NAMESPACE,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    result = helm(toolchain, tmp_path, chart, values, namespace=namespace, release=release)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def render_runtime(toolchain: Toolchain, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The runtime part as gardener-operator renders it."""
    return render(toolchain, tmp_path, RUNTIME, merge(values, OPERATOR_RUNTIME_VALUES))


def render_application(toolchain: Toolchain, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The application part as gardener-operator renders it."""
    return render(
        toolchain, tmp_path, APPLICATION, merge(values, OPERATOR_APPLICATION_VALUES), namespace=VIRTUAL_NAMESPACE
    )


def identities(documents: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in documents)


def container(documents: list[dict[str, Any]], deployment: str = NAME) -> dict[str, Any]:
    """The one container of the runtime part's Deployment `deployment` (the server's unless named)."""
    containers = standalone.find(documents, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    only: dict[str, Any] = containers[0]
    return only


def the_webhook(documents: list[dict[str, Any]]) -> dict[str, Any]:
    configuration = standalone.find(documents, "ValidatingWebhookConfiguration", NAME)
    assert len(configuration["webhooks"]) == 1
    webhook: dict[str, Any] = configuration["webhooks"][0]
    return webhook


# --- rendering and schema ------------------------------------------------------------------------------------


@pytest.mark.parametrize("chart", [CHART, RUNTIME, APPLICATION], ids=["umbrella", "runtime", "application"])
def test_lint(toolchain: Toolchain, tmp_path: Path, pki: Pki, chart: Path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(pki.values()))
    result = standalone.helm(toolchain.helm, "lint", "--strict", str(chart), "-f", str(values_file))
    assert "0 chart(s) failed" in result.stdout


def test_the_umbrella_renders_the_parts_it_is_told_to(toolchain: Toolchain, tmp_path: Path, pki: Pki) -> None:
    runtime = [
        ("Deployment", NAME, RUNTIME_NAMESPACE),
        ("PodDisruptionBudget", NAME, RUNTIME_NAMESPACE),
        ("Service", NAME, RUNTIME_NAMESPACE),
        ("ServiceAccount", NAME, RUNTIME_NAMESPACE),
    ]
    application = [("ValidatingWebhookConfiguration", NAME, "")]
    assert identities(render(toolchain, tmp_path, CHART, pki.values())) == sorted(runtime + application)
    only_runtime = merge(pki.values(), {"application": {"enabled": False}})
    assert identities(render(toolchain, tmp_path, CHART, only_runtime)) == runtime
    only_application = merge(pki.values(), {"runtime": {"enabled": False}})
    assert identities(render(toolchain, tmp_path, CHART, only_application)) == application


def test_the_parts_accept_the_same_values(toolchain: Toolchain, tmp_path: Path, pki: Pki) -> None:
    """gardener-operator hands both parts one set of values: each part's schema and defaults are the same file, and
    so is the webhook configuration (the application part renders it, the runtime part's certificate loop keeps it)."""
    for name in ("values.schema.json", "values.yaml", "templates/_shoot-webhook-configuration.tpl"):
        assert (RUNTIME / name).read_text() == (APPLICATION / name).read_text(), name
    values = pki.values(server={"replicas": 3}, webhook={"timeoutSeconds": 5})
    runtime = render_runtime(toolchain, tmp_path, values)
    application = render_application(toolchain, tmp_path, values)
    assert standalone.find(runtime, "Deployment", NAME)["spec"]["replicas"] == 3
    assert the_webhook(application)["timeoutSeconds"] == 5
    # The operator's priority class for the garden runtime cluster wins over the value.
    pod = standalone.find(runtime, "Deployment", NAME)["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gardener-garden-system-400"
    plain = render(toolchain, tmp_path, RUNTIME, pki.values(priorityClassName="garden-high"))
    assert standalone.find(plain, "Deployment", NAME)["spec"]["template"]["spec"]["priorityClassName"] == "garden-high"


@pytest.mark.parametrize(
    ("chart", "values", "message"),
    [
        (APPLICATION, {"global": {"replicas": 2}}, "at '/global': additional properties 'replicas' not allowed"),
        (
            RUNTIME,
            {"global": {"server": {"resources": {"limits": {"memroy": "1Gi"}}}}},
            "at '/global/server/resources/limits': additional properties 'memroy' not allowed",
        ),
        (RUNTIME, {"global": {"server": {"replicas": 1}}}, "/global/server/replicas"),
        (APPLICATION, {"global": {"webhook": {"timeoutSeconds": 11}}}, "/global/webhook/timeoutSeconds"),
        (APPLICATION, {"global": {"webhook": {"url": "http://admission.garden"}}}, "/global/webhook/url"),
        (APPLICATION, {"global": {"webhook": {"url": "https://a.garden/x?y=1"}}}, "/global/webhook/url"),
        (APPLICATION, {"global": {"certificate": {"caBundle": "Zm9v"}}}, "/global/certificate/caBundle"),
        (RUNTIME, {"global": {"maxPreserveTimeout": "30d"}}, "/global/maxPreserveTimeout"),
        (RUNTIME, {"gardener": {"virtualCluster": {"enabled": "yes"}}}, "/gardener/virtualCluster/enabled"),
        (CHART, {"runtime": {"replicas": 2}}, "at '/runtime': additional properties 'replicas' not allowed"),
        (CHART, {"global": {"server": {"port": 80}}}, "/global/server/port"),
    ],
    ids=[
        "global",
        "global-nested",
        "replicas",
        "timeout",
        "plain-http",
        "url-query",
        "ca-not-pem",
        "duration",
        "gardener-type",
        "umbrella",
        "umbrella-global",
    ],
)
def test_schema_rejects(
    toolchain: Toolchain, tmp_path: Path, pki: Pki, chart: Path, values: dict[str, Any], message: str
) -> None:
    result = helm(toolchain, tmp_path, chart, merge(pki.values(), values), namespace=RUNTIME_NAMESPACE)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("chart", [RUNTIME, APPLICATION], ids=["runtime", "application"])
def test_the_parts_render_with_keys_a_later_operator_adds(
    toolchain: Toolchain, tmp_path: Path, pki: Pki, chart: Path
) -> None:
    """gardener-operator merges its own keys over the values, and Helm checks the schema when the operator renders a
    part: keys a later operator adds (under `gardener` at any depth, and at the top level) must not fail it, as
    gardenlet v1.150's did the seed chart; a typo under our `global` still does (test_schema_rejects)."""
    operator = OPERATOR_RUNTIME_VALUES if chart == RUNTIME else OPERATOR_APPLICATION_VALUES
    later = {
        "gardener": {
            "version": "v1.160.0",
            "runtimeCluster": {"enabled": "true", "zones": ["a"]},
            "virtualCluster": {"kubeconfig": "x", "serviceAccount": {"uid": "1"}},
        },
        "usablePorts": [39001],
    }
    namespace = RUNTIME_NAMESPACE if chart == RUNTIME else VIRTUAL_NAMESPACE
    assert render(toolchain, tmp_path, chart, merge(pki.values(), operator, later), namespace=namespace)


def test_an_existing_secret_needs_its_ca_bundle(toolchain: Toolchain, tmp_path: Path) -> None:
    """The existing-Secret mode; without a Secret the certificates are generated (test_gardener_admission_certs)."""
    existing = {"global": {"certificate": {"secretName": TLS_SECRET}}}
    for chart, namespace in ((RUNTIME, RUNTIME_NAMESPACE), (APPLICATION, VIRTUAL_NAMESPACE)):
        result = helm(toolchain, tmp_path, chart, existing, namespace=namespace)
        assert result.returncode != 0
        assert "at '/global/certificate/caBundle': minLength: got 0, want 1" in result.stderr, result.stderr


@pytest.mark.parametrize("chart", [RUNTIME, APPLICATION], ids=["runtime", "application"])
def test_the_serving_key_is_never_a_value(toolchain: Toolchain, tmp_path: Path, pki: Pki, chart: Path) -> None:
    """A key in values would sit in the operator Extension, Helm's history and the ManagedResource's Secret, and
    nothing would renew it: the pair comes from the operator's Secret only, and no part renders a Secret."""
    pair = {"global": {"certificate": {"tls": {"crt": pki.crt, "key": pki.key}}}}
    result = helm(toolchain, tmp_path, chart, merge(pki.values(), pair), namespace=RUNTIME_NAMESPACE)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    documents = render(toolchain, tmp_path, chart, pki.values(), namespace=RUNTIME_NAMESPACE)
    assert not [d for d in documents if d["kind"] == "Secret"]


# --- the runtime part ----------------------------------------------------------------------------------------


def test_the_server_is_the_webhook_command_with_the_pair_it_is_given(
    toolchain: Toolchain, tmp_path: Path, pki: Pki
) -> None:
    documents = render_runtime(toolchain, tmp_path, pki.values(maxPreserveTimeout="168h"))
    args = build_parser().parse_args(container(documents)["args"])
    assert args.command == "webhook"
    assert (args.port, str(args.cert_dir)) == (9443, "/certs")
    assert args.max_preserve_timeout == dt.timedelta(hours=168)
    # Nothing read at start: MCM's generation is not looked for in the garden.
    assert args.mcm_native_preservation == "false"
    assert args.kubeconfig is None
    assert not args.mcm_native_preservation_per_namespace

    pod = standalone.find(documents, "Deployment", NAME)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "certs")
    assert volume["secret"] == {
        "secretName": TLS_SECRET,
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    assert {"name": "certs", "mountPath": "/certs", "readOnly": True} in container(documents)["volumeMounts"]


def test_replicas_pdb_service_and_identity(toolchain: Toolchain, tmp_path: Path, pki: Pki) -> None:
    documents = render_runtime(toolchain, tmp_path, pki.values())
    deployment = standalone.find(documents, "Deployment", NAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["labels"]["high-availability-config.resources.gardener.cloud/type"] == "server"
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = standalone.find(documents, "PodDisruptionBudget", NAME)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": selector},
    }
    service = standalone.find(documents, "Service", NAME)
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    assert service["metadata"]["annotations"] == {
        "networking.resources.gardener.cloud/from-all-webhook-targets-allowed-ports": '[{"port":9443,"protocol":"TCP"}]'
    }
    box = container(documents)
    assert box["ports"] == [{"name": "https", "containerPort": 9443, "protocol": "TCP"}]
    assert box["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert box["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # It reads nothing: no token, no RBAC, no egress labels.
    pod = deployment["spec"]["template"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert standalone.find(documents, "ServiceAccount", NAME)["automountServiceAccountToken"] is False
    assert not [d for d in documents if d["kind"].endswith(("Role", "RoleBinding"))]
    assert not [key for key in pod["metadata"]["labels"] if key.startswith("networking.")]


# --- the application part ------------------------------------------------------------------------------------


def test_the_webhook_is_the_cores_shoot_webhook_by_url_for_enabled_shoots(
    toolchain: Toolchain, tmp_path: Path, pki: Pki
) -> None:
    documents = render_application(toolchain, tmp_path, pki.values())
    # No RBAC in the virtual garden: the server reads nothing there.
    assert identities(documents) == [("ValidatingWebhookConfiguration", NAME, "")]
    url = f"https://{DEFAULT_HOST}"
    expected = {
        **wc.shoot_webhook(client=wc.ClientConfig(ca_bundle=pki.ca.encode(), url=url), failure_policy="Fail"),
        "objectSelector": {"matchLabels": {ENABLED_LABEL: "true"}},
    }
    assert the_webhook(documents) == expected
    assert wc.registration_problems(documents) == []  # as the registry the server serves by says
    assert expected["clientConfig"]["url"] == f"{url}/validate-shoot"
    assert expected["timeoutSeconds"] <= 10
    assert expected["rules"] == [
        {
            "apiGroups": ["core.gardener.cloud"],
            "apiVersions": ["v1beta1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["shoots"],
            "scope": "*",
        }
    ]

    # The same matchConditions as the standalone chart's Shoot webhook.
    theirs = standalone.webhooks_by_name(standalone.template(toolchain.helm, {"webhooks.shoots.register": "true"}))
    assert the_webhook(documents)["matchConditions"] == theirs[wc.SHOOT_WEBHOOK]["matchConditions"]

    # A URL of its own (a trailing slash is not doubled) and a shorter timeout.
    other = render_application(
        toolchain, tmp_path, pki.values(webhook={"url": "https://admission.example.com:8443/", "timeoutSeconds": 3})
    )
    assert the_webhook(other)["clientConfig"]["url"] == "https://admission.example.com:8443/validate-shoot"
    assert the_webhook(other)["timeoutSeconds"] == 3
    assert wc.registration_problems(other, chosen={wc.SHOOT_WEBHOOK: {"timeoutSeconds": 3}}) == []


def test_the_default_url_names_the_runtime_service(toolchain: Toolchain, tmp_path: Path, pki: Pki) -> None:
    """Where gardener-operator puts the runtime part (namespace garden, beside the virtual garden's kube-apiserver)."""
    service = standalone.find(render_runtime(toolchain, tmp_path, pki.values()), "Service", NAME)
    webhook = the_webhook(render_application(toolchain, tmp_path, pki.values()))
    assert webhook["clientConfig"]["url"] == (
        f"https://{service['metadata']['name']}.{service['metadata']['namespace']}/validate-shoot"
    )


# --- a real kube-apiserver -----------------------------------------------------------------------------------


def dry_run(
    toolchain: Toolchain, kubeconfig: Path, documents: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(toolchain.kubectl),
            f"--kubeconfig={kubeconfig}",
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
        ],
        input=yaml.safe_dump_all(documents),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_object_is_accepted_by_the_api_server(
    toolchain: Toolchain, control_plane: ControlPlane, namespace: str, tmp_path: Path, pki: Pki
) -> None:
    values = pki.values()
    runtime = render(toolchain, tmp_path, RUNTIME, merge(values, OPERATOR_RUNTIME_VALUES), namespace=namespace)
    application = render_application(toolchain, tmp_path, values)
    documents = runtime + application
    result = dry_run(toolchain, control_plane.kubeconfig, documents)
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(documents), result.stdout

    # The same check rejects a matchCondition that is not CEL.
    broken = standalone.find(application, "ValidatingWebhookConfiguration", NAME)
    broken["webhooks"][0]["matchConditions"][0]["expression"] = "request.operation != "
    result = dry_run(toolchain, control_plane.kubeconfig, [broken])
    assert result.returncode != 0
    assert "matchConditions" in result.stderr


def shoot(name: str, *, enabled: bool, maximum: int, auto_max: int) -> dict[str, Any]:
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": {"name": name, "labels": {ENABLED_LABEL: "true"} if enabled else {}},
        "spec": {
            "provider": {
                "type": "aws",
                "workers": [
                    {
                        "name": "b",
                        "minimum": 1,
                        "maximum": maximum,
                        "machineControllerManager": {"autoPreserveFailedMachineMax": auto_max},
                    }
                ],
            }
        },
    }


async def test_the_registered_webhook_judges_enabled_shoots_only(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    pki: Pki,
) -> None:
    """The application part's configuration as rendered (URL: a server here), the server with the runtime part's
    arguments and the serving pair from its Secret: a labelled Shoot with a bad pool is denied, an unlabelled one
    never reaches the server, nor does a change of a labelled one that leaves its workers and extensions alone."""
    port = free_port()
    application = render_application(toolchain, tmp_path, pki.values(webhook={"url": f"https://127.0.0.1:{port}"}))
    configuration = standalone.find(application, "ValidatingWebhookConfiguration", NAME)
    configuration["metadata"]["name"] = f"{NAME}-{namespace}"
    runtime = render_runtime(toolchain, tmp_path, pki.values())
    # The kubelet's view of the operator's Secret the runtime part mounts.
    secret = pki.secret(RUNTIME_NAMESPACE)
    assert container(runtime)["volumeMounts"][0]["name"] == "certs"
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    for key in ("tls.crt", "tls.key"):
        (cert_dir / key).write_bytes(base64.b64decode(secret["data"][key]))
    args = build_parser().parse_args(container(runtime)["args"])
    # The runtime part's pod has no token: the server holds no credentials, and the Shoot rule reads nothing.
    assert (
        standalone.find(runtime, "Deployment", NAME)["spec"]["template"]["spec"]["automountServiceAccountToken"]
        is False
    )
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    kubeconfig["users"] = [{"name": "none", "user": {}}]
    for context in kubeconfig["contexts"]:
        context["context"]["user"] = "none"
    no_credentials = tmp_path / "no-credentials.kubeconfig"
    no_credentials.write_text(yaml.safe_dump(kubeconfig))
    machine_sets = KubernetesMachineSets(kubeconfig=no_credentials)
    server = WebhookServer(
        host="127.0.0.1",
        port=port,
        cert_dir=cert_dir,
        settings=webhook_commands.settings_from(args, native=False),
        machine_sets=machine_sets,
        cert_poll_interval=0.2,
    )
    custom = client.CustomObjectsApi(kube_client)
    registration = client.AdmissionregistrationV1Api(kube_client)

    def calls() -> float:
        value = server.metrics.registry.get_sample_value(
            "machine_preservation_webhook_requests_total", {"endpoint": "validate-shoot"}
        )
        return value or 0.0

    def create(document: dict[str, Any]) -> None:
        custom.create_namespaced_custom_object(*SHOOTS[:2], namespace, SHOOTS[2], document)

    registration.create_validating_webhook_configuration(
        client.V1ValidatingWebhookConfiguration.model_validate(configuration)
    )
    try:
        async with server:
            # The API server picks the configuration up through an informer: wait until a bad Shoot is denied.
            counter = iter(range(1000))

            def denied() -> str | None:
                name = f"probe-{next(counter)}"
                try:
                    create(shoot(name, enabled=True, maximum=4, auto_max=5))
                except ApiException as error:
                    return str(error.body)
                custom.delete_namespaced_custom_object(*SHOOTS[:2], namespace, SHOOTS[2], name)
                return None

            message = await asyncio.to_thread(eventually, denied)
            assert message is not None
            assert f'admission webhook \\"{wc.SHOOT_WEBHOOK}\\" denied the request' in message
            assert "autoPreserveFailedMachineMax" in message

            before = calls()
            await asyncio.to_thread(create, shoot("unlabelled", enabled=False, maximum=4, auto_max=5))
            assert calls() == before, "a Shoot without the extension reached the webhook"

            await asyncio.to_thread(create, shoot("labelled", enabled=True, maximum=4, auto_max=2))
            assert calls() == before + 1
            patch = {"metadata": {"labels": {"team": "sre"}}}
            await asyncio.to_thread(
                custom.patch_namespaced_custom_object, *SHOOTS[:2], namespace, SHOOTS[2], "labelled", patch
            )
            assert calls() == before + 1, "a change outside workers and extensions reached the webhook"

            # Maintenance of a pool (its image) and another extension's entry never reach the webhook, so its
            # outage cannot block them; a change of a preservation setting or of its bound does.
            def patch_workers(change: dict[str, Any]) -> None:
                document = shoot("labelled", enabled=True, maximum=4, auto_max=2)
                document["spec"]["provider"]["workers"][0].update(change)
                document["spec"]["extensions"] = [{"type": "shoot-dns-service", "providerConfig": change}]
                body = {"spec": document["spec"]}
                custom.patch_namespaced_custom_object(*SHOOTS[:2], namespace, SHOOTS[2], "labelled", body)

            image = {"machine": {"type": "m5.large", "image": {"name": "gardenlinux", "version": "1592.1"}}}
            await asyncio.to_thread(patch_workers, image)
            assert calls() == before + 1, "an image update reached the webhook"
            image["machine"]["image"]["version"] = "1592.2"
            await asyncio.to_thread(patch_workers, image)
            assert calls() == before + 1, "an image update reached the webhook"
            await asyncio.to_thread(patch_workers, {**image, "maximum": 5})
            assert calls() == before + 2, "a change of the max's bound did not reach the webhook"
            timeout = {
                **image,
                "maximum": 5,
                "machineControllerManager": {"autoPreserveFailedMachineMax": 2, "machinePreserveTimeout": "1h"},
            }
            await asyncio.to_thread(patch_workers, timeout)
            assert calls() == before + 3, "a changed timeout did not reach the webhook"
    finally:
        registration.delete_validating_webhook_configuration(configuration["metadata"]["name"])
        await machine_sets.close()


def test_the_example_operator_extension_deploys_the_admission(toolchain: Toolchain, tmp_path: Path) -> None:
    """example/extension.yaml's admission, as gardener-operator deploys it: each part from its own chart with the
    Extension's values and the operator's `gardener.*` merged over them. Its certificates are generated."""
    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "example" / "extension.yaml").read_text())
    admission = example["spec"]["deployment"]["admission"]
    assert admission["runtimeCluster"]["helm"]["ociRepository"]["ref"].split("/")[-1].startswith(f"{NAME}-runtime:")
    assert admission["virtualCluster"]["helm"]["ociRepository"]["ref"].split("/")[-1].startswith(f"{NAME}-application:")
    values = admission["values"]
    assert "certificate" not in values["global"]
    runtime = render_runtime(toolchain, tmp_path, values)
    for name in (NAME, f"{NAME}-certs"):
        deployment = standalone.find(runtime, "Deployment", name)
        assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "gardener-garden-system-400"
    application = render_application(toolchain, tmp_path, values)
    assert identities(application) == [
        ("ClusterRole", f"{NAME}:ca-bundle", ""),
        ("ClusterRoleBinding", f"{NAME}:ca-bundle", ""),
        ("ValidatingWebhookConfiguration", NAME, ""),
    ]
