"""The standalone chart's certs manager identity, for the tests that run the certs manager against a real API
server: its ServiceAccount, Role, ClusterRole and bindings and the two Secrets the chart creates empty, rendered
from the chart (release `mp` in the test's namespace) and created as an administrator would install them; then a
kubeconfig with a token of that ServiceAccount. The certs manager under test gets exactly what a release grants it,
never an administrator's rights."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration.chart import kubectl, template

FULLNAME = "mp"
CA_SECRET = f"{FULLNAME}-webhook-certs"  # the CA with its key, the trust bundle, the serving pair
SERVING_SECRET = f"{FULLNAME}-webhook-tls"  # the serving pair only
KINDS = ("ServiceAccount", "Secret", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@dataclass(frozen=True)
class CertsIdentity:
    namespace: str
    kubeconfig: Path  # a token of the certs manager's ServiceAccount

    @property
    def configuration(self) -> str:
        """The name of the release's webhook configurations (validating and mutating), which it may patch."""
        return f"{FULLNAME}.{self.namespace}"


@contextmanager
def certs_identity(
    toolchain: Toolchain, control_plane: ControlPlane, kube_client: client.ApiClient, namespace: str, directory: Path
) -> Iterator[CertsIdentity]:
    """The certs manager's identity of a release in `namespace` (which exists), removed afterwards."""
    rendered = template(
        toolchain.helm,
        {"fullnameOverride": f'"{FULLNAME}"'},
        namespace=namespace,
    )
    account = f"{FULLNAME}-certs"
    documents = [
        d
        for d in rendered
        if d["kind"] in KINDS
        and (
            d["metadata"]["name"] in (account, CA_SECRET, SERVING_SECRET)
            or any(s.get("name") == account for s in d.get("subjects") or [])
            or (d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith(f"{account}-"))
        )
    ]
    assert {d["kind"] for d in documents} == set(KINDS), "the chart's certs manager identity changed"
    kubectl(toolchain.kubectl, control_plane.kubeconfig, "create", documents=documents)
    try:
        answer = client.CoreV1Api(kube_client).create_namespaced_service_account_token(
            account,
            namespace,
            {"spec": {"audiences": [control_plane.issuer], "expirationSeconds": 3600}},
        )
        config = yaml.safe_load(control_plane.kubeconfig.read_text())
        for user in config["users"]:
            user["user"] = {"token": answer.status.token}
        kubeconfig = directory / f"{account}.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        kubeconfig.chmod(0o600)
        yield CertsIdentity(namespace=namespace, kubeconfig=kubeconfig)
    finally:
        cluster_scoped = [d for d in documents if d["kind"].startswith("Cluster")]
        kubectl(toolchain.kubectl, control_plane.kubeconfig, "delete", documents=cluster_scoped)


@pytest.fixture
def certs(
    toolchain: Toolchain, control_plane: ControlPlane, kube_client: client.ApiClient, namespace: str, tmp_path: Path
) -> Iterator[CertsIdentity]:
    """The certs manager's identity of a release in the test's namespace."""
    with certs_identity(toolchain, control_plane, kube_client, namespace, tmp_path) as identity:
        yield identity
