"""The chart's controller command and RBAC, for real: `helm install` the controller part, then run the
controller process with exactly the chart's arguments, as the chart's ServiceAccount, and see it pass its
start-up check, take the Lease, sync every cache and preserve a machine (writes to Machines, Nodes, Events),
answering the chart's in-container probes. Rights granted by name cover exactly the named objects."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.cli.main import build_parser
from machine_preservation.core import vocabulary as v
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration import kube
from tests.integration.chart import CHART, find, helm, set_args, template
from tests.polling import eventually

MACHINES = ("machine.sapcloud.io", "v1alpha1")


def _get(port: int, path: str) -> tuple[int, str]:
    """Status and body; (0, "") while nothing listens yet."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return 0, ""
    finally:
        connection.close()


@dataclass(frozen=True)
class Installed:
    fullname: str
    container: dict[str, Any]  # the controller container as the chart renders it
    metrics_port: int


@pytest.fixture
def installed(toolchain: Toolchain, control_plane: ControlPlane, namespace: str) -> Iterator[Installed]:
    """The controller part of the chart installed into `namespace`, its metrics on localhost (a free port)."""
    fullname = f"c{uuid.uuid4().hex[:6]}"
    port = free_port()
    values = {
        "fullnameOverride": json.dumps(fullname),
        "webhook.enabled": "false",
        "webhooks.nodes.register": "false",
        "webhooks.machines.register": "false",
        "controller.metricsLocalhostOnly": "true",
        "controller.metricsPort": str(port),
        # The CRDs installed here carry MCM v0.62's preservation fields: without this the controller would
        # leave the lifecycle to (an absent) MCM and write nothing.
        "mcmNativePreservation": json.dumps("false"),
    }
    flags = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig), *set_args(values)]
    helm(toolchain.helm, "install", namespace, str(CHART), *flags)
    try:
        documents = template(toolchain.helm, values, namespace=namespace, release=namespace)
        container = find(documents, "Deployment", f"{fullname}-controller")["spec"]["template"]["spec"]["containers"][0]
        yield Installed(fullname=fullname, container=container, metrics_port=port)
    finally:
        helm(
            toolchain.helm,
            "uninstall",
            namespace,
            "--namespace",
            namespace,
            "--kubeconfig",
            str(control_plane.kubeconfig),
        )


def _probe(container: dict[str, Any], probe: str) -> int:
    """Run one of the chart's exec probes here, with this interpreter in place of the image's `python`."""
    command = container[probe]["exec"]["command"]
    assert command[0] == "python"
    return subprocess.run([sys.executable, *command[1:]], capture_output=True, timeout=30, check=False).returncode


def test_controller_runs_with_the_charts_arguments_and_rbac(
    installed: Installed,
    kube_client: client.ApiClient,
    namespace: str,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    fullname, port = installed.fullname, installed.metrics_port
    # In-cluster config does not exist here: the same identity through a kubeconfig.
    identity = kubeconfig_for(f"system:serviceaccount:{namespace}:{fullname}-controller")
    args = [*installed.container["args"], f"--control-kubeconfig={identity}", f"--target-kubeconfig={identity}"]
    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.namespace, parsed.leader_elect) == ("controller", namespace, True)
    assert (parsed.metrics_bind_address, parsed.metrics_port) == ("127.0.0.1", port)
    assert _probe(installed.container, "readinessProbe") != 0, "nothing answers yet"

    core = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    node = f"node-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": node}})
    log = (tmp_path / "controller.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "machine_preservation.cli", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "POD_NAME": "controller-0"},
    )
    try:

        def leading_and_synced() -> bool:
            assert process.poll() is None, (tmp_path / "controller.log").read_text()
            status, metrics = _get(port, "/metrics")
            ready, _ = _get(port, "/readyz")
            return status == 200 and "machine_preservation_leader 1.0" in metrics and ready == 200

        eventually(leading_and_synced)
        # The chart's probes reach the localhost-only endpoints from inside the container.
        assert _probe(installed.container, "livenessProbe") == 0
        assert _probe(installed.container, "readinessProbe") == 0
        lease_holders = [
            lease.spec.holder_identity
            for lease in client.CoordinationV1Api(kube_client).list_namespaced_lease(namespace).items
        ]
        assert any(holder and holder.startswith("controller-0_") for holder in lease_holders), lease_holders

        # A manual preservation exercises the writes: the record in the Machine's annotations, its mirror in the
        # Machine's status, Node annotations, Events.
        custom.create_namespaced_custom_object(
            *MACHINES,
            namespace,
            "machines",
            {
                "apiVersion": "machine.sapcloud.io/v1alpha1",
                "kind": "Machine",
                "metadata": {"name": "m", "labels": {"node": node}, "annotations": {v.PRESERVE_ANNOTATION: "now"}},
                "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
            },
        )
        custom.patch_namespaced_custom_object_status(
            *MACHINES, namespace, "machines", "m", {"status": {"currentStatus": {"phase": "Running"}}}
        )

        def preserved() -> bool:
            machine = custom.get_namespaced_custom_object(*MACHINES, namespace, "machines", "m")
            until = machine["metadata"].get("annotations", {}).get(v.PRESERVED_UNTIL_ANNOTATION)
            annotations = core.read_node(node).metadata.annotations or {}
            return bool(
                until
                and machine.get("status", {}).get("currentStatus", {}).get("preserveExpiryTime") == until
                and annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
            )

        try:
            eventually(preserved)
        except AssertionError as error:
            raise AssertionError((tmp_path / "controller.log").read_text()[-6000:]) from error
        # An Event on the Machine (recorded right after the writes).
        try:
            eventually(lambda: core.list_namespaced_event(namespace).items)
        except AssertionError as error:
            raise AssertionError((tmp_path / "controller.log").read_text()[-6000:]) from error

        # MCM marks the machine Failed while its Node is Ready: the controller reads the Node past its cache before
        # it moves the machine back to Running (a GET of the Node, which the chart must grant).
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}
        core.patch_node_status(node, {"status": {"conditions": [ready]}})
        custom.patch_namespaced_custom_object_status(
            *MACHINES, namespace, "machines", "m", {"status": {"currentStatus": {"phase": "Failed"}}}
        )

        def recovered() -> bool:
            machine = custom.get_namespaced_custom_object(*MACHINES, namespace, "machines", "m")
            return bool(machine.get("status", {}).get("currentStatus", {}).get("phase") == "Running")

        try:
            eventually(recovered, limit=20)
        except AssertionError as error:
            raise AssertionError((tmp_path / "controller.log").read_text()[-6000:]) from error
        output = (tmp_path / "controller.log").read_text()
        # A refused request is logged with its reason ("403 Forbidden", ApiException's "Reason: Forbidden"); a bare
        # "403" also matched a log line's milliseconds ("07:45:37,403").
        assert "forbidden" not in output.lower(), output
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
        core.delete_node(node)


# Gardener's Cluster kind, for the rights granted on it by name (any content accepted).
CLUSTER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusters.extensions.gardener.cloud"},
    "spec": {
        "group": "extensions.gardener.cloud",
        "scope": "Cluster",
        "names": {"kind": "Cluster", "plural": "clusters", "singular": "cluster", "listKind": "ClusterList"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}
CLUSTERS = ("extensions.gardener.cloud", "v1alpha1", "clusters")


@pytest.fixture
def gardener_clusters(kube_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """The Cluster kind (unless installed already), a Cluster named after `namespace` and another one."""
    extensions = client.ApiextensionsV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    created = False
    try:
        extensions.read_custom_resource_definition(CLUSTER_CRD["metadata"]["name"])  # type: ignore[index]
    except ApiException as error:
        if error.status != 404:
            raise
        extensions.create_custom_resource_definition(CLUSTER_CRD)
        created = True
    other = f"other-{uuid.uuid4().hex[:6]}"
    for name in (namespace, other):
        # The spec Gardener's own CRD requires (another test may have installed that CRD and left it).
        body = {
            "apiVersion": "extensions.gardener.cloud/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"cloudProfile": {}, "shoot": {}},
        }
        eventually(lambda body=body: custom.create_cluster_custom_object(*CLUSTERS, body))  # type: ignore[misc]
    try:
        yield other
    finally:
        for name in (namespace, other):
            custom.delete_cluster_custom_object(*CLUSTERS, name)
        if created:
            extensions.delete_custom_resource_definition(CLUSTER_CRD["metadata"]["name"])  # type: ignore[index]


def _granted(api_client: client.ApiClient, *, namespace: str, other_cluster: str) -> set[str]:
    """What this identity may do among the rights granted by name; asserts everything else is forbidden."""
    custom = client.CustomObjectsApi(api_client)
    by_name, by_other_name = f"metadata.name={namespace}", f"metadata.name={other_cluster}"

    def watch(selector: str | None) -> None:
        response = custom.list_cluster_custom_object(
            *CLUSTERS, field_selector=selector, watch=True, timeout_seconds=1, _preload_content=False
        )
        response.release_conn()

    calls: dict[str, Callable[[], object]] = {
        "get cluster": lambda: custom.get_cluster_custom_object(*CLUSTERS, namespace),
        "list cluster": lambda: custom.list_cluster_custom_object(*CLUSTERS, field_selector=by_name),
        "watch cluster": lambda: watch(by_name),
        "get mcm deployment": lambda: client.AppsV1Api(api_client).read_namespaced_deployment(
            "machine-controller-manager", namespace
        ),
        # Not there yet: 404 when allowed.
        "get own lease": lambda: client.CoordinationV1Api(api_client).read_namespaced_lease(
            "machine-preservation-controller", namespace
        ),
    }
    statuses = {name: kube.status_of(call) for name, call in calls.items()}
    assert set(statuses.values()) <= {200, 403, 404}, statuses
    # Any other Cluster, a list or watch without the name, another Deployment, another Lease: forbidden.
    forbidden: dict[str, Callable[[], object]] = {
        "get other cluster": lambda: custom.get_cluster_custom_object(*CLUSTERS, other_cluster),
        "list clusters": lambda: custom.list_cluster_custom_object(*CLUSTERS),
        "list other cluster": lambda: custom.list_cluster_custom_object(*CLUSTERS, field_selector=by_other_name),
        "watch clusters": lambda: watch(None),
        "get other deployment": lambda: client.AppsV1Api(api_client).read_namespaced_deployment(
            "something-else", namespace
        ),
        "get other lease": lambda: client.CoordinationV1Api(api_client).read_namespaced_lease(
            "another-lease", namespace
        ),
    }
    assert {name: kube.status_of(call) for name, call in forbidden.items()} == dict.fromkeys(forbidden, 403)
    return {name for name, status in statuses.items() if status != 403}


def test_rights_granted_by_name_cover_exactly_the_named_objects(
    toolchain: Toolchain,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    namespace: str,
    gardener_clusters: str,
    kubeconfig_for: Callable[..., Path],
) -> None:
    """Gardener's Cluster of the control namespace (get; list and watch only with a metadata.name field
    selector), MCM's Deployment, the controller's own Lease: by name, for the controller and the webhook (whose
    deletion guard only caches the Cluster)."""
    fullname = f"n{uuid.uuid4().hex[:6]}"
    values = {
        "fullnameOverride": json.dumps(fullname),
        "webhooks.nodes.register": "false",
        "webhooks.machines.register": "false",
    }
    flags = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    helm(toolchain.helm, "install", namespace, str(CHART), *flags, *set_args(values))
    apps = client.AppsV1Api(kube_client)
    for name in ("machine-controller-manager", "something-else"):
        apps.create_namespaced_deployment(
            namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "replicas": 0,
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": name, "image": "example.invalid/mcm:v0.61.3"}]},
                    },
                },
            },
        )
    try:
        granted = {}
        for component in ("controller", "webhook"):
            user = f"system:serviceaccount:{namespace}:{fullname}-{component}"
            with config.new_client_from_config(config_file=str(kubeconfig_for(user))) as api_client:
                granted[component] = _granted(api_client, namespace=namespace, other_cluster=gardener_clusters)
        assert granted == {
            "controller": {"get cluster", "list cluster", "watch cluster", "get mcm deployment", "get own lease"},
            "webhook": {"list cluster", "watch cluster", "get mcm deployment"},
        }
    finally:
        for name in ("machine-controller-manager", "something-else"):
            apps.delete_namespaced_deployment(name, namespace)
        helm(toolchain.helm, "uninstall", namespace, *flags)
