"""The chart's controller command and RBAC, for real: `helm install` the controller part, then run the
controller process with exactly the chart's arguments, as the chart's ServiceAccount, and see it pass its
start-up check, take the Lease, sync every cache and preserve a machine (writes to Machines, Nodes, Events)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from machine_preservation.cli import build_parser
from machine_preservation.cluster.controlplane import ControlPlane, free_port
from machine_preservation.cluster.toolchain import Toolchain
from machine_preservation.core import vocabulary as v
from tests.integration.chart import CHART, find, helm, set_args, template
from tests.integration.test_control_plane import eventually

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


@pytest.fixture
def installed(toolchain: Toolchain, control_plane: ControlPlane, namespace: str) -> Iterator[tuple[str, list[str]]]:
    """The controller part of the chart installed into `namespace`; yields its fullname and container args."""
    fullname = f"c{uuid.uuid4().hex[:6]}"
    values = {
        "fullnameOverride": json.dumps(fullname),
        "webhook.enabled": "false",
        "webhooks.nodes.register": "false",
        "webhooks.machines.register": "false",
    }
    flags = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig), *set_args(values)]
    helm(toolchain.helm, "install", namespace, str(CHART), *flags)
    try:
        documents = template(toolchain.helm, values, namespace=namespace, release=namespace)
        args = find(documents, "Deployment", f"{fullname}-controller")["spec"]["template"]["spec"]["containers"][0]
        yield fullname, args["args"]
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


def test_controller_runs_with_the_charts_arguments_and_rbac(
    installed: tuple[str, list[str]],
    kube_client: client.ApiClient,
    namespace: str,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    fullname, chart_args = installed
    # In-cluster config does not exist here: the same identity through a kubeconfig, on a free local port.
    identity = kubeconfig_for(f"system:serviceaccount:{namespace}:{fullname}-controller")
    port = free_port()
    args = [
        *(a for a in chart_args if not a.startswith(("--metrics-port=", "--metrics-bind-address="))),
        f"--control-kubeconfig={identity}",
        f"--target-kubeconfig={identity}",
        f"--metrics-port={port}",
        "--metrics-bind-address=127.0.0.1",
    ]
    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.namespace, parsed.leader_elect) == ("controller", namespace, True)

    core = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    node = f"node-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": node}})
    log = (tmp_path / "controller.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "machine_preservation", *args],
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
        lease_holders = [
            lease.spec.holder_identity
            for lease in client.CoordinationV1Api(kube_client).list_namespaced_lease(namespace).items
        ]
        assert any(holder and holder.startswith("controller-0_") for holder in lease_holders), lease_holders

        # A manual preservation exercises the writes: Machine status, Node annotations, Events.
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
            annotations = core.read_node(node).metadata.annotations or {}
            return bool(
                machine.get("status", {}).get("currentStatus", {}).get("preserveExpiryTime")
                and annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
            )

        eventually(preserved)
        reasons = {event.reason for event in core.list_namespaced_event(namespace).items}
        assert reasons, "an Event on the Machine"
        output = (tmp_path / "controller.log").read_text()
        assert "403" not in output, output
        assert "forbidden" not in output.lower(), output
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
        core.delete_node(node)
