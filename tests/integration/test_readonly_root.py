"""Each component's real start path (the console script with the args the chart renders for a seed install:
remote kubeconfigs carrying embedded certificates, remote caBundle injection) on a read-only root filesystem
where only the directory standing in for the chart's emptyDir is writable.

The kubernetes client writes a kubeconfig's embedded certificates to temporary files. Without TMPDIR naming
the writable directory every component fails with "No usable temporary directory found" (what the chart's
containers did before they got an emptyDir and TMPDIR); with it each one does its job against the real API
server: the certs manager fills its Secrets and injects every caBundle, the webhook's MachineSet reader
answers MCM's delete, the controller gets ready.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.localcluster.controlplane import free_port
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration import kube
from tests.integration import readonly_root as sandbox
from tests.integration.chart import find, template
from tests.polling import eventually

MACHINES = ("machine.sapcloud.io", "v1alpha1")
RELEASE = "mp"
FULLNAME = "mp-machine-preservation"


@pytest.fixture(scope="module")
def sandbox_works(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The mechanism itself: without TMPDIR Python finds no temporary directory, with it one is found. Fails
    (never skips) where mount namespaces are not available, saying so."""
    directory = tmp_path_factory.mktemp("sandbox-probe")
    writable = directory / "writable"
    probe = ["python3", "-c", "import tempfile; print(tempfile.mkdtemp())"]
    try:
        without = sandbox.run(probe, writable=writable, tmpdir=None, cwd=directory)
    except FileNotFoundError as error:  # no unshare
        pytest.fail(f"the read-only sandbox needs util-linux's unshare: {error}")
    if sandbox.NO_TEMPORARY_DIRECTORY not in without.stderr:
        pytest.fail(
            "the read-only sandbox (a private mount namespace: unshare --mount --map-root-user) does not work "
            f"here, exit {without.returncode}: {without.stderr.strip()[-500:]}"
        )
    with_tmpdir = sandbox.run(probe, writable=writable, tmpdir=writable, cwd=directory)
    assert with_tmpdir.returncode == 0, with_tmpdir.stderr
    assert with_tmpdir.stdout.startswith(str(writable))


@dataclass
class Seed:
    """The chart rendered for a seed install into `namespace`, and what its containers need locally."""

    namespace: str
    documents: list[dict[str, Any]]
    kubeconfigs: dict[str, Path]
    port: int
    mcm: str
    remote_configurations: dict[str, str]  # name -> kind

    def args(self, deployment: str, container: str) -> list[str]:
        pod = find(self.documents, "Deployment", f"{FULLNAME}-{deployment}")["spec"]["template"]["spec"]
        chosen = next(c for c in pod["containers"] if c["name"] == container)
        # The chart's side of the fix, for this very container: TMPDIR names a writable emptyDir it mounts.
        tmpdir = next(e["value"] for e in chosen["env"] if e["name"] == "TMPDIR")
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        assert any(m["mountPath"] == tmpdir and m["name"] in empty_dirs for m in chosen["volumeMounts"])
        args: list[str] = chosen["args"]
        return args


@pytest.fixture
def seed(
    toolchain: Toolchain,
    kube_client: client.ApiClient,
    namespace: str,
    kubeconfig_for: Callable[..., Path],
) -> Iterator[Seed]:
    port = free_port()
    mcm = f"system:serviceaccount:{namespace}:machine-controller-manager"
    remote = {
        f"{namespace}-target": "validating",
        f"{namespace}-target-m": "mutating",
        f"{namespace}-garden": "validating",
    }
    values = {
        "clusters.control.kubeconfigSecret": '"seed-kubeconfig"',
        "clusters.control.namespace": json.dumps(namespace),
        "clusters.target.kubeconfigSecret": '"shoot-kubeconfig"',
        "clusters.garden.kubeconfigSecret": '"garden-kubeconfig"',
        "webhooks.nodes.register": "false",
        "webhooks.machines.register": "true",
        "webhooks.clientConfig.url": json.dumps(f"https://127.0.0.1:{port}"),
        "webhook.mcmUsernames": json.dumps([mcm]),
        # This cluster's Machine CRD has the fields of MCM's own preservation; the guard is what is tested here.
        "mcmNativePreservation": "false",
        "certificates.selfManaged.remoteConfigurations": json.dumps(
            [
                {"cluster": "target", "kind": "validating", "name": f"{namespace}-target"},
                {"cluster": "target", "kind": "mutating", "name": f"{namespace}-target-m"},
                {"cluster": "garden", "kind": "validating", "name": f"{namespace}-garden"},
            ]
        ),
    }
    documents = template(toolchain.helm, values, namespace=namespace, release=RELEASE)
    # One kubeconfig per cluster, each with embedded client certificate, key and CA (all reach this API server).
    kubeconfigs = {
        cluster: kubeconfig_for(f"{cluster}-admin", ("system:masters",)) for cluster in ("control", "target", "garden")
    }
    kubeconfigs["local"] = kubeconfig_for("seed-local-admin", ("system:masters",))
    registration = client.AdmissionregistrationV1Api(kube_client)
    core = client.CoreV1Api(kube_client)
    # What `helm install` creates and the components expect: the empty Secrets, the webhook configurations.
    for document in documents:
        if document["kind"] == "Secret":
            core.create_namespaced_secret(namespace, document)
        elif document["kind"] == "ValidatingWebhookConfiguration":
            registration.create_validating_webhook_configuration(document)
    for name, kind in remote.items():
        body = {"metadata": {"name": name}, "webhooks": [kube.unused_webhook(f"{kind}.{namespace}.mp.test")]}
        if kind == "validating":
            registration.create_validating_webhook_configuration(body)
        else:
            registration.create_mutating_webhook_configuration(body)
    try:
        yield Seed(
            namespace=namespace,
            documents=documents,
            kubeconfigs=kubeconfigs,
            port=port,
            mcm=mcm,
            remote_configurations=remote,
        )
    finally:
        for document in documents:
            if document["kind"] == "ValidatingWebhookConfiguration":
                registration.delete_validating_webhook_configuration(document["metadata"]["name"])
        for name, kind in remote.items():
            if kind == "validating":
                registration.delete_validating_webhook_configuration(name)
            else:
                registration.delete_mutating_webhook_configuration(name)


def _certs_command(seed: Seed) -> list[str]:
    # In the pod the certs manager reaches its own cluster in-cluster; here through one more kubeconfig.
    args = sandbox.localise(seed.args("certs", "certs"), kubeconfigs=seed.kubeconfigs, flags={})
    return [str(sandbox.CONSOLE_SCRIPT), *args, f"--kubeconfig={seed.kubeconfigs['local']}", "--once"]


def _secret(kube_client: client.ApiClient, namespace: str, name: str) -> dict[str, bytes]:
    secret = client.CoreV1Api(kube_client).read_namespaced_secret(name, namespace)
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


def _ca_bundles(kube_client: client.ApiClient, seed: Seed) -> dict[str, set[bytes]]:
    registration = client.AdmissionregistrationV1Api(kube_client)
    names = {
        **seed.remote_configurations,
        **{
            d["metadata"]["name"]: "validating" for d in seed.documents if d["kind"] == "ValidatingWebhookConfiguration"
        },
    }
    bundles = {}
    for name, kind in names.items():
        read = (
            registration.read_validating_webhook_configuration
            if kind == "validating"
            else registration.read_mutating_webhook_configuration
        )
        bundles[name] = {base64.b64decode(w.client_config.ca_bundle or "") for w in read(name).webhooks}
    return bundles


def _fill_certificates(seed: Seed, kube_client: client.ApiClient, tmp_path: Path) -> None:
    """The certs manager's first pass, as the chart runs it (with its temporary directory)."""
    writable = tmp_path / "certs-tmp"
    result = sandbox.run(_certs_command(seed), writable=writable, tmpdir=writable, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.usefixtures("sandbox_works")
def test_certs_manager_needs_and_uses_only_the_writable_temporary_directory(
    seed: Seed, kube_client: client.ApiClient, tmp_path: Path
) -> None:
    writable = tmp_path / "tmp"
    command = _certs_command(seed)
    failed = sandbox.run(command, writable=writable, tmpdir=None, cwd=tmp_path)
    assert failed.returncode not in (0, sandbox.SANDBOX_BROKEN), failed.stderr
    assert sandbox.NO_TEMPORARY_DIRECTORY in failed.stderr
    assert _secret(kube_client, seed.namespace, f"{FULLNAME}-webhook-certs") == {}

    done = sandbox.run(command, writable=writable, tmpdir=writable, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    state = _secret(kube_client, seed.namespace, f"{FULLNAME}-webhook-certs")
    assert set(_secret(kube_client, seed.namespace, f"{FULLNAME}-webhook-tls")) == {"tls.crt", "tls.key"}
    bundles = _ca_bundles(kube_client, seed)
    assert len(bundles) == 4, "three remote configurations and the seed's own"
    assert all(found == {state["ca-bundle.crt"]} for found in bundles.values()), bundles


def _kubelet_mounts_serving_secret(kube_client: client.ApiClient, namespace: str, cert_dir: Path) -> None:
    """What the kubelet does for the webhook pod's `certs` volume: the serving Secret's two keys as files."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    for key, content in _secret(kube_client, namespace, f"{FULLNAME}-webhook-tls").items():
        (cert_dir / key).write_bytes(content)


def _ready(port: int, cafile: Path, path: str = "/readyz") -> bool:
    context = ssl.create_default_context(cafile=str(cafile))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _mcm_delete_answer(kubeconfig: Path, namespace: str, name: str) -> str:
    """The API server's answer to MCM deleting the machine; "" while the API server cannot call the webhook yet
    (it picks the configuration and its caBundle up through an informer)."""
    with config.new_client_from_config(config_file=str(kubeconfig)) as mcm:
        try:
            client.CustomObjectsApi(mcm).delete_namespaced_custom_object(*MACHINES, namespace, "machines", name)
        except ApiException as error:
            answer = str(error.body)
            return "" if "x509" in answer or "connection refused" in answer else answer
    return "<the delete went through>"


def _failed_machine(kube_client: client.ApiClient, namespace: str, machine_set_uid: str, name: str) -> None:
    custom = client.CustomObjectsApi(kube_client)
    owner = {
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineSet",
        "name": "ms",
        "uid": machine_set_uid,
        "controller": True,
    }
    custom.create_namespaced_custom_object(
        *MACHINES,
        namespace,
        "machines",
        {
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
        },
    )
    custom.patch_namespaced_custom_object_status(
        *MACHINES, namespace, "machines", name, {"status": {"currentStatus": {"phase": "Failed"}}}
    )


@pytest.mark.usefixtures("sandbox_works")
def test_webhook_machine_set_reader_needs_and_uses_only_the_writable_temporary_directory(
    seed: Seed, kube_client: client.ApiClient, kubeconfig_for: Callable[..., Path], tmp_path: Path
) -> None:
    _fill_certificates(seed, kube_client, tmp_path)
    cert_dir = tmp_path / "certs"
    _kubelet_mounts_serving_secret(kube_client, seed.namespace, cert_dir)
    cafile = tmp_path / "ca.crt"
    cafile.write_bytes(_secret(kube_client, seed.namespace, f"{FULLNAME}-webhook-certs")["ca-bundle.crt"])
    args = sandbox.localise(
        seed.args("webhook", "webhook"),
        kubeconfigs=seed.kubeconfigs,
        flags={"--host": "127.0.0.1", "--port": str(seed.port), "--cert-dir": str(cert_dir)},
    )
    assert any(a.startswith("--kubeconfig=") for a in args), "the MachineSet reader's remote kubeconfig"
    machine_set = client.CustomObjectsApi(kube_client).create_namespaced_custom_object(
        *MACHINES,
        seed.namespace,
        "machinesets",
        {
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineSet",
            "metadata": {"name": "ms"},
            "spec": {"replicas": 1, "autoPreserveFailedMachineMax": 1},
        },
    )
    mcm_kubeconfig = kubeconfig_for(seed.mcm, ("system:masters",))

    def webhook(machine: str, tmpdir: Path | None) -> tuple[subprocess.Popen[bytes], Path]:
        _failed_machine(kube_client, seed.namespace, machine_set["metadata"]["uid"], machine)
        log = tmp_path / f"webhook-{machine}.log"
        process = sandbox.start(
            [str(sandbox.CONSOLE_SCRIPT), *args], writable=tmp_path / "tmp", tmpdir=tmpdir, cwd=tmp_path, log=log
        )
        return process, log

    # Without a temporary directory the guard's client cannot load its kubeconfig (the library writes the
    # certificates it holds to files): the server runs, says why in its log, and never reports ready, so MCM's
    # deletes are refused (failurePolicy Fail) rather than judged without the MachineSet.
    process, log = webhook("m-failed-1", None)
    try:
        eventually(lambda: process.poll() is not None or _ready(seed.port, cafile, "/healthz"))
        assert process.poll() is None, log.read_text()
        eventually(lambda: sandbox.NO_TEMPORARY_DIRECTORY in log.read_text())
        assert not _ready(seed.port, cafile)
    finally:
        sandbox.stop(process)

    # With it: ready once its caches synced, and MCM's delete of the Failed machine is judged with its MachineSet.
    process, log = webhook("m-failed-2", tmp_path / "tmp")
    try:
        eventually(lambda: process.poll() is not None or _ready(seed.port, cafile))
        assert process.poll() is None, log.read_text()
        answer = eventually(lambda: _mcm_delete_answer(mcm_kubeconfig, seed.namespace, "m-failed-2"))
    finally:
        sandbox.stop(process)
    assert "deletion.machines.machine-preservation.sapcloud.io" in answer, answer
    assert "m-failed-2" in answer
    assert "cannot decide" not in answer, "the reader got the MachineSet and its machines"
    assert sandbox.NO_TEMPORARY_DIRECTORY not in answer + log.read_text()


def _controller_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@pytest.mark.usefixtures("sandbox_works")
def test_controller_needs_and_uses_only_the_writable_temporary_directory(seed: Seed, tmp_path: Path) -> None:
    port = free_port()
    args = sandbox.localise(
        seed.args("controller", "controller"),
        kubeconfigs=seed.kubeconfigs,
        flags={"--metrics-port": str(port), "--metrics-bind-address": "127.0.0.1"},
    )
    assert {a.split("=")[0] for a in args} >= {"--control-kubeconfig", "--target-kubeconfig"}
    command = [str(sandbox.CONSOLE_SCRIPT), *args]
    writable = tmp_path / "tmp"

    failing = sandbox.start(command, writable=writable, tmpdir=None, cwd=tmp_path, log=tmp_path / "failing.log")
    try:
        code = failing.wait(timeout=120)
    finally:
        sandbox.stop(failing)
    failure = (tmp_path / "failing.log").read_text()
    assert code not in (0, sandbox.SANDBOX_BROKEN), failure
    assert sandbox.NO_TEMPORARY_DIRECTORY in failure

    log = tmp_path / "controller.log"
    process = sandbox.start(command, writable=writable, tmpdir=writable, cwd=tmp_path, log=log)
    try:
        eventually(lambda: process.poll() is not None or _controller_ready(port), limit=120)
        assert process.poll() is None, log.read_text()
    finally:
        sandbox.stop(process)
    assert sandbox.NO_TEMPORARY_DIRECTORY not in log.read_text()


def test_sandbox_helpers_localise_the_charts_paths() -> None:
    kubeconfigs = {"target": Path("/k/t"), "garden": Path("/k/g")}
    args = sandbox.localise(
        [
            "--target-kubeconfig=/etc/machine-preservation/target/kubeconfig",
            "--webhook-configuration=validating/x@/etc/machine-preservation/garden/kubeconfig",
            "--port=10250",
            "--cert-dir=/certs",
        ],
        kubeconfigs=kubeconfigs,
        flags={"--port": "1234"},
    )
    assert args == [
        "--target-kubeconfig=/k/t",
        "--webhook-configuration=validating/x@/k/g",
        "--port=1234",
        "--cert-dir=/certs",
    ]
