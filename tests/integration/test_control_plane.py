"""Proof that the local control plane is the real thing (issue 2): version, loopback only, CRD status
subresource, the admission chain calling a webhook over TLS, and eviction against a PDB whose status
the real disruption controller computes."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from tests.certificates import install, local_serving_pair
from tests.polling import eventually


def test_version_is_the_pinned_release(kube_client: client.ApiClient) -> None:
    info = client.VersionApi(kube_client).get_code()
    assert (info.major, info.minor) == ("1", "36")
    assert info.git_version.startswith("v1.36.")


def _listening_sockets_of(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state that the given processes own."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                host_hex = local.split(":")[0]
                if family == 4:
                    addresses.append(".".join(str(int(host_hex[i : i + 2], 16)) for i in (6, 4, 2, 0)))
                else:
                    addresses.append(host_hex)
    return addresses


def test_every_listener_is_on_loopback(control_plane: ControlPlane) -> None:
    state = json.loads((control_plane.directory / "state.json").read_text())
    pids = {int(entry["pid"]) for entry in state["processes"].values()}
    addresses = _listening_sockets_of(pids)
    assert addresses, "the control plane should be listening somewhere"
    assert all(address == "127.0.0.1" for address in addresses), addresses


def test_machine_status_round_trips_through_the_status_subresource(
    kube_client: client.ApiClient, namespace: str
) -> None:
    api = client.CustomObjectsApi(kube_client)
    group, version, plural = "machine.sapcloud.io", "v1alpha1", "machines"
    machine = {
        "apiVersion": f"{group}/{version}",
        "kind": "Machine",
        "metadata": {"name": "m1", "labels": {"node": "n1"}},
        "spec": {"machinePreserveTimeout": "1h", "class": {"kind": "AWSMachineClass", "name": "c"}},
        "status": {"currentStatus": {"phase": "Running"}},
    }
    created = api.create_namespaced_custom_object(group, version, namespace, plural, machine)
    assert "status" not in created or not created["status"], "status must be ignored on create"

    expiry = "2026-11-24T10:00:00Z"
    api.patch_namespaced_custom_object_status(
        group,
        version,
        namespace,
        plural,
        "m1",
        {"status": {"currentStatus": {"phase": "Failed", "preserveExpiryTime": expiry, "unknownField": 1}}},
    )
    # A main-resource update must not be able to change status.
    api.patch_namespaced_custom_object(
        group, version, namespace, plural, "m1", {"status": {"currentStatus": {"phase": "Running"}}}
    )
    read = api.get_namespaced_custom_object(group, version, namespace, plural, "m1")
    assert read["status"]["currentStatus"] == {"phase": "Failed", "preserveExpiryTime": expiry}
    assert read["spec"]["class"] == {"kind": "AWSMachineClass", "name": "c"}, "unknown spec fields are kept"


async def test_apiserver_calls_a_validating_webhook_and_the_denial_reaches_the_client(
    control_plane: ControlPlane, kube_client: client.ApiClient, namespace: str
) -> None:
    calls: list[dict[str, Any]] = []

    async def review(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append(body)
        annotations = body["request"]["object"]["metadata"].get("annotations") or {}
        allowed = annotations.get("probe") != "deny"
        response: dict[str, Any] = {"uid": body["request"]["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": "probe says no"}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    cert_dir = control_plane.directory / f"webhook-{uuid.uuid4().hex[:6]}"
    cert_dir.mkdir()
    install(cert_dir, local_serving_pair(control_plane.ca, valid_for=dt.timedelta(hours=1)))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")

    app = web.Application()
    app.router.add_post("/validate", review)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()

    name = f"probe-{namespace}"
    registration = client.AdmissionregistrationV1Api(kube_client)
    config = {
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "probe.machine-preservation.test",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate",
                    "caBundle": base64.b64encode(control_plane.ca.cert_pem).decode(),
                },
                "rules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }
    await asyncio.to_thread(registration.create_validating_webhook_configuration, config)
    core = client.CoreV1Api(kube_client)
    try:
        # The apiserver picks configurations up through an informer: probe with dry-run creates.
        def denied_probe() -> str:
            try:
                core.create_namespaced_config_map(
                    namespace, {"metadata": {"generateName": "p-", "annotations": {"probe": "deny"}}}, dry_run="All"
                )
            except ApiException as error:
                return str(error.body) if error.status == 403 else ""
            return ""

        body = await asyncio.to_thread(eventually, denied_probe)
        assert 'admission webhook \\"probe.machine-preservation.test\\" denied the request: probe says no' in body

        allowed = await asyncio.to_thread(
            core.create_namespaced_config_map, namespace, {"metadata": {"name": "ok", "annotations": {"probe": "yes"}}}
        )
        assert allowed.metadata.name == "ok"
        assert any(call["request"]["object"]["metadata"].get("name") == "ok" for call in calls)
        assert all(call["request"]["operation"] == "CREATE" for call in calls)
    finally:
        await asyncio.to_thread(registration.delete_validating_webhook_configuration, name)
        await runner.cleanup()


def _ready_pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": {"app": "guarded"}},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
        },
    )
    # No kubelet here: write the status a kubelet would, so the pod counts as healthy.
    now = dt.datetime.now(dt.UTC).isoformat()
    core.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            }
        },
    )


def test_eviction_honours_a_pdb_computed_by_the_real_disruption_controller(
    kube_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_client)
    policy = client.PolicyV1Api(kube_client)
    _ready_pod(core, namespace, "a")
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        {"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}},
    )

    def pdb_status(expected_allowed: int) -> bool:
        pdb = policy.read_namespaced_pod_disruption_budget("guard", namespace)
        status = pdb.status
        return bool(
            status
            and status.observed_generation == pdb.metadata.generation
            and status.current_healthy == status.expected_pods
            and status.disruptions_allowed == expected_allowed
        )

    eventually(lambda: pdb_status(0))
    eviction = {"metadata": {"name": "a", "namespace": namespace}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction("a", namespace, eviction)
    assert refused.value.status == 429
    assert "disruption budget" in str(refused.value.body)

    _ready_pod(core, namespace, "b")  # a second healthy pod lets the budget allow one disruption
    eventually(lambda: pdb_status(1))
    core.create_namespaced_pod_eviction("a", namespace, eviction)
    eventually(lambda: not any(p.metadata.name == "a" for p in core.list_namespaced_pod(namespace).items))
