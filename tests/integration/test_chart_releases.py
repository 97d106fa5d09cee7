"""The chart in a seed-like cluster, with real helm against the real API server: several releases side by side
(each judging only its own namespace), and the deletion guard's reach when the webhook is unreachable.

The releases' configurations point by URL at webhook servers running here (or at a port nobody listens on),
with a CA generated here (certificates.mode=provided); the chart's own names, selectors and matchConditions
decide which requests reach which server."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from machine_preservation.certs.authority import KeyPair, generate_ca
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.integration import kube
from tests.integration.chart import CHART, helm, set_args
from tests.integration.test_webhook import ServerThread
from tests.polling import eventually
from tests.webhook import configurations as wc

MACHINES = ("machine.sapcloud.io", "v1alpha1")
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
PRESERVE = "validate-preserve-annotation"
DELETION = "validate-machine-deletion"


@pytest.fixture(scope="module")
def ca() -> KeyPair:
    return generate_ca(common_name="chart-releases-ca", now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=3))


def _values(*, url: str, ca: KeyPair) -> dict[str, str]:
    return {
        # The same release and object names in every namespace: the harshest case for cluster-scoped names.
        "fullnameOverride": json.dumps("mp"),
        "webhooks.clientConfig.url": json.dumps(url),
        "certificates.mode": json.dumps("provided"),
        "certificates.provided.secretName": json.dumps("mp-tls"),
        "certificates.provided.caBundle": json.dumps(base64.b64encode(ca.cert_pem).decode()),
    }


@contextlib.contextmanager
def _installed(
    toolchain: Toolchain, control_plane: ControlPlane, namespace: str, values: dict[str, str]
) -> Iterator[None]:
    flags = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    helm(toolchain.helm, "install", "mp", str(CHART), *flags, *set_args(values))
    try:
        yield
    finally:
        helm(toolchain.helm, "uninstall", "mp", *flags, check=False)


@contextlib.contextmanager
def _namespace(kube_client: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


def _machine(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
    }


def _requests(thread: ServerThread, endpoint: str) -> float:
    assert thread.server is not None
    value = thread.server.metrics.registry.get_sample_value(
        "machine_preservation_webhook_requests_total", {"endpoint": endpoint}
    )
    return value or 0.0


def test_two_releases_in_one_cluster_each_judge_only_their_own_namespace(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    kubeconfig_for: Callable[..., Path],
    ca: KeyPair,
    tmp_path: Path,
) -> None:
    install(tmp_path, local_serving_pair(ca))
    custom = client.CustomObjectsApi(kube_client)
    registration = client.AdmissionregistrationV1Api(kube_client)
    with contextlib.ExitStack() as stack:
        namespaces = [stack.enter_context(_namespace(kube_client)) for _ in range(2)]
        servers: dict[str, ServerThread] = {}
        for namespace in namespaces:
            # The deletion guard reads as this release's webhook ServiceAccount (its RBAC comes with the install
            # below).
            identity = kubeconfig_for(f"system:serviceaccount:{namespace}:mp-webhook")
            thread = ServerThread(
                lambda namespace=namespace, identity=identity: WebhookServer(  # type: ignore[misc]
                    host="127.0.0.1",
                    port=0,
                    cert_dir=tmp_path,
                    settings=AdmissionSettings(
                        controller_username=f"system:serviceaccount:{namespace}:mp-controller",
                        mcm_usernames=frozenset({MCM}),
                    ),
                    machine_sets=KubernetesMachineSets(kubeconfig=identity),
                    cert_poll_interval=1.0,
                )
            )
            server = thread.start()
            stack.callback(thread.stop)
            servers[namespace] = thread
            # The second install would fail on any cluster-scoped name the first one already owns.
            values = _values(url=f"https://127.0.0.1:{server.port}", ca=ca)
            stack.enter_context(_installed(toolchain, control_plane, namespace, values))

        names = {c.metadata.name for c in registration.list_validating_webhook_configuration().items}
        assert {f"mp.{namespace}" for namespace in namespaces} <= names

        for namespace in namespaces:
            other = next(n for n in namespaces if n != namespace)

            def bad_value_denied(namespace: str = namespace) -> str | None:
                return kube.denial(
                    lambda: custom.create_namespaced_custom_object(
                        *MACHINES,
                        namespace,
                        "machines",
                        _machine("probe", {v.PRESERVE_ANNOTATION: "bogus"}),
                        dry_run="All",
                    )
                )

            eventually(bad_value_denied)  # the API server learns about configurations through an informer
            own, others = _requests(servers[namespace], PRESERVE), _requests(servers[other], PRESERVE)
            denial = bad_value_denied()
            assert wc.MACHINE_PRESERVE_WEBHOOK in denial
            assert "bogus" in denial
            custom.create_namespaced_custom_object(
                *MACHINES, namespace, "machines", _machine("good", {v.PRESERVE_ANNOTATION: "now"})
            )
            # Exactly one webhook judged each request: this namespace's release; the other never saw them.
            assert _requests(servers[namespace], PRESERVE) == own + 2
            assert _requests(servers[other], PRESERVE) == others


def test_with_the_webhook_unreachable_mcm_still_deletes_healthy_machines(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    namespace: str,
    kubeconfig_for: Callable[..., Path],
    ca: KeyPair,
) -> None:
    """failurePolicy Fail and nothing listening: only MCM's deletes of Failed machines call the guard, so those
    fail and every other delete goes through."""
    custom = client.CustomObjectsApi(kube_client)
    values = {
        **_values(url=f"https://127.0.0.1:{free_port()}", ca=ca),
        "webhooks.nodes.register": "false",
        "webhooks.machines.failurePolicy": json.dumps("Fail"),
    }
    mcm_client: client.ApiClient = config.new_client_from_config(
        config_file=str(kubeconfig_for(MCM, ("system:masters",)))
    )
    with _installed(toolchain, control_plane, namespace, values), mcm_client:
        mcm = client.CustomObjectsApi(mcm_client)
        for name, phase in (("running", "Running"), ("failed", "Failed"), ("failed-too", "Failed"), ("new", "")):
            custom.create_namespaced_custom_object(*MACHINES, namespace, "machines", _machine(name))
            if phase:
                custom.patch_namespaced_custom_object_status(
                    *MACHINES, namespace, "machines", name, {"status": {"currentStatus": {"phase": phase}}}
                )

        def guard_in_force() -> str | None:
            return kube.denial(
                lambda: mcm.delete_namespaced_custom_object(*MACHINES, namespace, "machines", "failed", dry_run="All")
            )

        message = eventually(guard_in_force)
        assert wc.MACHINE_DELETION_WEBHOOK in message
        assert "failed calling webhook" in message

        # MCM's deletes of healthy (or not yet reported) machines never reach the webhook.
        for name in ("running", "new"):
            mcm.delete_namespaced_custom_object(*MACHINES, namespace, "machines", name)
        # The Failed one stays until the webhook can judge it; anybody else's delete never waits for it.
        assert "failed calling webhook" in guard_in_force()
        custom.delete_namespaced_custom_object(*MACHINES, namespace, "machines", "failed-too")
        remaining = {
            m["metadata"]["name"]
            for m in custom.list_namespaced_custom_object(*MACHINES, namespace, "machines")["items"]
        }
        assert remaining == {"failed"}
