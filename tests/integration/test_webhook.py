"""The webhook behind the real kube-apiserver: registered with the package's configuration builders (URL client
config, our own CA, matchConditions), called by the real admission chain, exercised with real kubectl.

The server runs in-process on 127.0.0.1 (a thread with its own event loop) and reads MachineSets from the same
API server with kubernetes.aio. Configurations are cluster-scoped, so they carry a per-module name and are
scoped by an object label (nodes) or the module's namespace (machines, shoots), and are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from machine_preservation.certs.authority import generate_ca
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.gardener.provider_config import API_VERSION as PRESERVATION_API_VERSION
from machine_preservation.core.gardener.provider_config import EXTENSION_TYPE
from machine_preservation.core.gardener.provider_config import KIND as PRESERVATION_KIND
from machine_preservation.core.preservation_record import PreservationRecord, format_timestamp
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.controller.running import chart_identity
from tests.polling import eventually
from tests.webhook import configurations as wc

CONTROLLER = "system:serviceaccount:mp-test:controller"
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
ALICE = "alice"
KUBELET = "system:node:worker-1"
P = v.PRESERVE_ANNOTATION
CA_KEY = v.CA_SCALE_DOWN_DISABLED_ANNOTATION
MARKER = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
GROUP, VERSION = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION


class ServerThread:
    """A WebhookServer on its own event loop in a daemon thread; `stop()` ends it."""

    def __init__(self, make: Callable[[], WebhookServer]) -> None:
        self._make = make
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.server: WebhookServer | None = None
        self.ca_pem = ""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self._make() as server:
            self.server = server
            self._ready.set()
            await self._stop.wait()

    def start(self) -> WebhookServer:
        self._thread.start()
        assert self._ready.wait(30), "webhook server did not start"
        assert self.server is not None
        return self.server

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def sample(self, name: str, **labels: str) -> float:
        """One sample as GET /metrics serves it (over TLS, verified with the CA the API server uses too)."""
        assert self.server is not None
        assert self.ca_pem
        context = ssl.create_default_context(cadata=self.ca_pem)
        url = f"https://127.0.0.1:{self.server.port}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0

    def requests(self, endpoint: str) -> float:
        return self.sample("machine_preservation_webhook_requests_total", endpoint=endpoint)


@dataclass
class Env:
    token: str
    namespace: str
    server: ServerThread
    kubectl: Path
    kubeconfigs: dict[str, Path]
    api: client.ApiClient

    def run(self, user: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfigs[user]}", *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
            check=False,
        )

    def ok(self, user: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = self.run(user, *args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return result

    def ok_once_seen(self, user: str, *args: str) -> None:
        """`ok`, once the guard's caches have seen the write just made (they follow the API server by a watch)."""
        eventually(lambda: self.run(user, *args).returncode == 0)

    def denied(self, user: str, *args: str, stdin: str | None = None) -> str:
        result = self.run(user, *args, stdin=stdin)
        assert result.returncode != 0, f"expected a denial, got: {result.stdout}"
        return result.stderr

    def node_name(self, suffix: str) -> str:
        return f"wh-{self.token}-{suffix}"

    def create_node(self, suffix: str, annotations: dict[str, str] | None = None) -> str:
        """A node in our webhooks' scope (label), created by the controller identity (exempt from the rules)."""
        name = self.node_name(suffix)
        manifest: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"machine-preservation.test/webhook": self.token}},
        }
        if annotations:
            manifest["metadata"]["annotations"] = annotations
        self.ok(CONTROLLER, "create", "-f", "-", stdin=json.dumps(manifest))
        return name

    def node_annotations(self, name: str) -> dict[str, str]:
        metadata = client.CoreV1Api(self.api).read_node(name).metadata
        assert metadata is not None
        return dict(metadata.annotations or {})


@pytest.fixture(scope="module")
def env(
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    toolchain: Toolchain,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Env]:
    token = uuid.uuid4().hex[:8]
    directory = tmp_path_factory.mktemp("webhook")
    ca = generate_ca(common_name="webhook-test-ca", now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=3))
    install(directory, local_serving_pair(ca))

    namespace = f"wh-{token}"
    core = client.CoreV1Api(kube_client)
    core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": namespace}}))
    # The deletion guard's reads as the chart's webhook ServiceAccount (a release serving `namespace`).
    identity = asyncio.run(
        chart_identity(control_plane.kubeconfig, namespace, leader_election=False, component="webhook")
    )
    settings = AdmissionSettings(controller_username=CONTROLLER, mcm_usernames=frozenset({MCM}))
    thread = ServerThread(
        lambda: WebhookServer(
            host="127.0.0.1",
            port=0,
            cert_dir=directory,
            settings=settings,
            machine_sets=KubernetesMachineSets(kubeconfig=identity),
            cert_poll_interval=1.0,
        )
    )
    server = thread.start()
    thread.ca_pem = ca.cert_pem.decode()
    # Everyone may do everything (system:masters): what is judged here is admission, not authorization.
    kubeconfigs = {
        user: control_plane.write_kubeconfig(directory / f"{index}.kubeconfig", user=user, groups=groups)
        for index, (user, groups) in enumerate(
            [
                (ALICE, ("system:masters",)),
                (CONTROLLER, ("system:masters",)),
                (MCM, ("system:masters",)),
                (KUBELET, ("system:nodes", "system:masters")),
            ]
        )
    }

    client_config = wc.ClientConfig(ca_bundle=ca.cert_pem, url=f"https://127.0.0.1:{server.port}")
    nodes = {"matchLabels": {"machine-preservation.test/webhook": token}}
    scoped = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    name = f"mp-webhook-test-{token}"
    validating = wc.validating_configuration(
        name=name,
        webhooks=[
            wc.node_preserve_annotation_webhook(
                client=client_config, controller_username=CONTROLLER, mcm_usernames=[MCM], object_selector=nodes
            ),
            wc.machine_preserve_annotation_webhook(
                client=client_config, controller_username=CONTROLLER, namespace_selector=scoped
            ),
            wc.machine_deletion_webhook(client=client_config, mcm_usernames=[MCM], namespace_selector=scoped),
            wc.shoot_webhook(client=client_config, namespace_selector=scoped),
        ],
    )
    mutating = wc.mutating_configuration(
        name=name,
        webhooks=[
            wc.node_ca_annotation_webhook(
                client=client_config, controller_username=CONTROLLER, mcm_usernames=[MCM], object_selector=nodes
            ),
            wc.node_mcm_marker_webhook(client=client_config, mcm_usernames=[MCM], object_selector=nodes),
        ],
    )
    registration = client.AdmissionregistrationV1Api(kube_client)
    registration.create_validating_webhook_configuration(
        client.V1ValidatingWebhookConfiguration.model_validate(validating)
    )
    registration.create_mutating_webhook_configuration(client.V1MutatingWebhookConfiguration.model_validate(mutating))
    environment = Env(token, namespace, thread, toolchain.kubectl, kubeconfigs, kube_client)
    try:
        _wait_until_registered(environment)
        yield environment
    finally:
        registration.delete_validating_webhook_configuration(name)
        registration.delete_mutating_webhook_configuration(name)
        for node in core.list_node(label_selector=f"machine-preservation.test/webhook={token}").items:
            if node.metadata is not None and node.metadata.name:
                core.delete_node(node.metadata.name)
        core.delete_namespace(namespace)
        thread.stop()


def _wait_until_registered(env: Env) -> None:
    """The API server learns about configurations through an informer: probe until both are in force."""
    probe = env.create_node("probe", {CA_KEY: "true", MARKER: "true"})

    def validating_in_force() -> bool:
        result = env.run(ALICE, "annotate", "node", probe, f"{P}=probe", "--dry-run=server")
        return result.returncode != 0 and "denied the request" in result.stderr

    def mutating_in_force() -> bool:
        result = env.run(
            ALICE, "annotate", "node", probe, f"{CA_KEY}=false", "--overwrite", "--dry-run=server", "-o", "json"
        )
        return result.returncode == 0 and json.loads(result.stdout)["metadata"]["annotations"][CA_KEY] == "true"

    eventually(validating_in_force)
    eventually(mutating_in_force)


# --- Nodes: the preserve annotation ------------------------------------------------------------------------


def test_a_bad_value_is_denied_with_object_annotation_value_and_allowed_values(env: Env) -> None:
    node = env.create_node("bad")
    stderr = env.denied(ALICE, "annotate", "node", node, f"{P}=Now")
    assert (
        f'admission webhook "{wc.NODE_PRESERVE_WEBHOOK}" denied the request: Node "{node}": '
        f'metadata.annotations[{P}]: Unsupported value: "Now": supported values: "", "now", "when-failed", "false"'
    ) in stderr
    assert P not in env.node_annotations(node)


def test_a_node_created_with_a_bad_value_is_denied(env: Env) -> None:
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": env.node_name("born-bad"),
            "labels": {"machine-preservation.test/webhook": env.token},
            "annotations": {P: "auto-preserved"},
        },
    }
    stderr = env.denied(ALICE, "create", "-f", "-", stdin=json.dumps(manifest))
    assert f'denied the request: Node "{env.node_name("born-bad")}": metadata.annotations[{P}]: Forbidden' in stderr
    manifest["metadata"]["annotations"] = {P: "when-failed"}
    env.ok(ALICE, "create", "-f", "-", stdin=json.dumps(manifest))


def test_user_values_pass_and_the_auto_value_is_the_controllers(env: Env) -> None:
    node = env.create_node("values")
    for value in ("now", "when-failed", "false", ""):
        env.ok(ALICE, "annotate", "node", node, f"{P}={value}", "--overwrite")
        assert env.node_annotations(node)[P] == value
    stderr = env.denied(ALICE, "annotate", "node", node, f"{P}=auto-preserve", "--overwrite")
    assert f'the value "auto-preserve" is reserved for the preservation controller ({CONTROLLER})' in stderr
    env.ok(CONTROLLER, "annotate", "node", node, f"{P}=auto-preserve", "--overwrite")
    assert env.node_annotations(node)[P] == "auto-preserve"


def test_controller_markers_are_the_controllers(env: Env) -> None:
    node = env.create_node("markers")
    stderr = env.denied(ALICE, "annotate", "node", node, f"{v.LAST_MACHINE_PRIORITY_ANNOTATION}=5")
    assert f"metadata.annotations[{v.LAST_MACHINE_PRIORITY_ANNOTATION}]: Forbidden" in stderr
    env.ok(CONTROLLER, "annotate", "node", node, f"{v.LAST_MACHINE_PRIORITY_ANNOTATION}=5")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION, "shop/web"),
        (v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION, "0"),
        (v.PRESERVED_DRAIN_ANNOTATION, "drained"),
        (v.PRESERVED_UNTIL_ANNOTATION, "2030-01-01T00:00:00Z"),
        (v.PRESERVED_EVIDENCE_ANNOTATION, "kube-system/elsewhere"),
    ],
)
def test_the_nodes_preservation_fields_are_the_controllers(env: Env, key: str, value: str) -> None:
    # What an SRE reads on the Node must come from the controller: the registration sends these keys to the webhook.
    node = env.create_node(key.rpartition("/")[2])
    stderr = env.denied(ALICE, "annotate", "node", node, f"{key}={value}")
    assert f"metadata.annotations[{key}]: Forbidden: only the preservation controller" in stderr
    env.ok(CONTROLLER, "annotate", "node", node, f"{key}={value}")
    assert env.node_annotations(node)[key] == value
    env.denied(ALICE, "annotate", "node", node, f"{key}-")


def test_kubelets_mcm_and_the_controller_are_not_sent_to_the_webhook(env: Env) -> None:
    node = env.create_node("exempt")
    before = env.server.requests("validate-preserve-annotation")
    for user in (KUBELET, MCM, CONTROLLER):
        env.ok(user, "annotate", "node", node, f"{P}=not-judged-{user.rsplit(':', 1)[-1]}", "--overwrite")
    assert env.server.requests("validate-preserve-annotation") == before
    env.denied(ALICE, "annotate", "node", node, f"{P}=judged", "--overwrite")
    assert env.server.requests("validate-preserve-annotation") == before + 1


def test_unrelated_updates_and_status_writes_do_not_call_the_webhook(env: Env) -> None:
    node = env.create_node("quiet", {CA_KEY: "true", MARKER: "true"})
    endpoints = ("validate-preserve-annotation", "mutate-node-ca-annotation")
    before = [env.server.requests(e) for e in endpoints]
    heartbeat = format_timestamp(dt.datetime.now(dt.UTC))
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": heartbeat,
                }
            ]
        }
    }
    env.ok(ALICE, "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    env.ok(ALICE, "label", "node", node, "team=sre")
    env.ok(ALICE, "annotate", "node", node, "unrelated=1")
    assert [env.server.requests(e) for e in endpoints] == before
    # The same path with a relevant change does reach the webhook (status writes can carry metadata).
    relevant = {"metadata": {"annotations": {P: "bogus"}}}
    env.denied(ALICE, "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(relevant))
    assert env.server.requests("validate-preserve-annotation") == before[0] + 1


# --- Nodes: the CA annotation guard ------------------------------------------------------------------------


def test_flipping_the_ca_annotation_on_a_preserved_node_is_undone_with_a_warning(env: Env) -> None:
    node = env.create_node("ca", {CA_KEY: "true", MARKER: "true"})
    result = env.ok(ALICE, "annotate", "node", node, f"{CA_KEY}=false", "--overwrite")
    assert f'Warning: {CA_KEY} restored to "true": the node is preserved by machine-preservation' in result.stderr
    assert env.node_annotations(node)[CA_KEY] == "true"
    result = env.ok(ALICE, "annotate", "node", node, f"{CA_KEY}-")
    assert "restored to" in result.stderr
    assert env.node_annotations(node)[CA_KEY] == "true"
    assert env.server.sample("machine_preservation_webhook_patches_total", endpoint="mutate-node-ca-annotation") >= 2


def test_the_guard_also_covers_the_status_subresource(env: Env) -> None:
    node = env.create_node("ca-status", {CA_KEY: "true", MARKER: "true"})
    change = {"metadata": {"annotations": {CA_KEY: "false"}}}
    result = env.ok(ALICE, "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(change))
    assert "restored to" in result.stderr
    assert env.node_annotations(node)[CA_KEY] == "true"


def test_a_preserved_condition_protects_the_annotation_too(env: Env) -> None:
    node = env.create_node("condition", {CA_KEY: "true"})
    now = format_timestamp(dt.datetime.now(dt.UTC))
    condition = {"type": "Preserved", "status": "True", "reason": "Preserved by user.", "lastTransitionTime": now}
    env.ok(
        CONTROLLER,
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [condition]}}),
    )
    env.ok(ALICE, "annotate", "node", node, f"{CA_KEY}=maybe", "--overwrite")
    assert env.node_annotations(node)[CA_KEY] == "true"


def test_on_unpreserved_nodes_and_for_the_controller_the_annotation_is_free(env: Env) -> None:
    plain = env.create_node("plain", {CA_KEY: "true"})
    env.ok(ALICE, "annotate", "node", plain, f"{CA_KEY}=false", "--overwrite")
    assert env.node_annotations(plain)[CA_KEY] == "false"
    preserved = env.create_node("released", {CA_KEY: "true", MARKER: "true"})
    env.ok(CONTROLLER, "annotate", "node", preserved, f"{CA_KEY}-", f"{MARKER}-")
    assert CA_KEY not in env.node_annotations(preserved)


def test_mcm_cannot_mark_a_node_the_controller_preserves(env: Env) -> None:
    """MCM v0.61's rollout marks every node; on ours its marker is taken out of the request, so its clean-up
    after the rollout passes the node by. On other nodes MCM marks as it likes."""
    mcm_marker = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    ours = env.create_node("mcm-rollout", {CA_KEY: "true", MARKER: "true"})
    result = env.ok(MCM, "annotate", "node", ours, f"{CA_KEY}=true", f"{mcm_marker}=true", "--overwrite")
    assert f"Warning: {mcm_marker} not added" in result.stderr
    assert env.node_annotations(ours) == {CA_KEY: "true", MARKER: "true"}
    assert env.server.sample("machine_preservation_webhook_patches_total", endpoint="mutate-node-mcm-marker") >= 1
    plain = env.create_node("mcm-rollout-plain", {})
    env.ok(MCM, "annotate", "node", plain, f"{CA_KEY}=true", f"{mcm_marker}=true")
    assert env.node_annotations(plain) == {CA_KEY: "true", mcm_marker: "true"}


# --- Machines -------------------------------------------------------------------------------------------------


def _machine(
    name: str, *, owner: tuple[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Machine, optionally owned by the MachineSet (name, uid). The owner must exist: the garbage
    collector deletes dependents of a missing owner."""
    metadata: dict[str, Any] = {"name": name, "labels": {"node": f"node-{name}"}, "annotations": annotations or {}}
    if owner is not None:
        owner_name, owner_uid = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MachineSet",
                "name": owner_name,
                "uid": owner_uid,
                "controller": True,
            }
        ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Machine",
        "metadata": metadata,
        "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
    }


def _set_status(env: Env, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(env.api).patch_namespaced_custom_object_status(
        GROUP, VERSION, env.namespace, "machines", name, {"status": {"currentStatus": status}}
    )


def test_machine_annotations_are_judged_too(env: Env) -> None:
    env.ok(CONTROLLER, "-n", env.namespace, "create", "-f", "-", stdin=json.dumps(_machine("annotated")))
    stderr = env.denied(
        ALICE, "-n", env.namespace, "annotate", "machines.machine.sapcloud.io", "annotated", f"{P}=always"
    )
    assert f'admission webhook "{wc.MACHINE_PRESERVE_WEBHOOK}" denied the request: Machine "annotated"' in stderr
    env.ok(ALICE, "-n", env.namespace, "annotate", "machines.machine.sapcloud.io", "annotated", f"{P}=when-failed")
    created = env.denied(
        ALICE,
        "-n",
        env.namespace,
        "create",
        "-f",
        "-",
        stdin=json.dumps(_machine("born-bad", annotations={P: "auto-preserved"})),
    )
    assert "reserved for the preservation controller" in created


def _record(hours: float = 1.0) -> tuple[dict[str, str], str]:
    """Our preservation record (the annotations only the controller may write) and its expiry as written."""
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=1)
    until = since + dt.timedelta(hours=hours)
    record = PreservationRecord(since=since, until=until, by=v.PreservedBy.USER)
    return record.annotations(), format_timestamp(until)


def _machine_set(env: Env, name: str, *, replicas: int, max_: int = 0) -> tuple[str, str]:
    """A MachineSet (created by the controller identity), as (name, uid) for its machines' owner references."""
    manifest = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MachineSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "autoPreserveFailedMachineMax": max_,
            "template": {"spec": {"class": {"kind": "AWSMachineClass", "name": "c"}}},
        },
    }
    env.ok(CONTROLLER, "-n", env.namespace, "create", "-f", "-", stdin=json.dumps(manifest))
    created = client.CustomObjectsApi(env.api).get_namespaced_custom_object(
        GROUP, VERSION, env.namespace, "machinesets", name
    )
    return name, created["metadata"]["uid"]


def _failed_machine(
    env: Env, name: str, owner: tuple[str, str], annotations: dict[str, str] | None = None, phase: str = "Failed"
) -> None:
    manifest = _machine(name, owner=owner, annotations=annotations)
    env.ok(CONTROLLER, "-n", env.namespace, "create", "-f", "-", stdin=json.dumps(manifest))
    _set_status(env, name, {"phase": phase})


def test_mcm_cannot_delete_a_preserved_or_pending_failed_machine_but_users_can(env: Env) -> None:
    ns, kind = env.namespace, "machines.machine.sapcloud.io"
    owner = _machine_set(env, "ms", replicas=3, max_=1)
    record, expiry = _record()
    _failed_machine(env, "preserved", owner, record)
    _failed_machine(env, "pending", owner)
    _failed_machine(env, "healthy", owner, phase="Running")
    # A forged status expiry is not a preservation: only the record counts. (Its own set, without a budget: in
    # "ms" the newest failure would take the budget's one slot.)
    _failed_machine(env, "forged", _machine_set(env, "forged", replicas=1))
    _set_status(env, "forged", {"phase": "Failed", "preserveExpiryTime": "9999-12-31T23:59:59Z"})

    stderr = env.denied(MCM, "-n", ns, "delete", kind, "preserved")
    denial = f'machine "preserved" is Failed and preserved until {expiry}; its MachineSet "ms" wants 3 machine(s)'
    assert f'admission webhook "{wc.MACHINE_DELETION_WEBHOOK}" denied the request: {denial}' in stderr
    # "pending": the webhook reads the MachineSet and its machines from the API server to see the free slot.
    stderr = env.denied(MCM, "-n", ns, "delete", kind, "pending")
    assert 'machine "pending" is Failed and about to be auto-preserved (MachineSet "ms" has room' in stderr
    env.ok(MCM, "-n", ns, "delete", kind, "healthy", "forged")
    env.ok(ALICE, "-n", ns, "delete", kind, "preserved", "pending")


def test_scale_to_zero_lets_mcm_delete_the_preserved_machine(env: Env) -> None:
    ns, kind = env.namespace, "machines.machine.sapcloud.io"
    owner = _machine_set(env, "scaled", replicas=2)
    record, _ = _record()
    _failed_machine(env, "scaled-kept", owner, record)
    _failed_machine(env, "scaled-other", owner, phase="Running")
    # The set still wants both machines: deleting the kept one would only replace it.
    stderr = env.denied(MCM, "-n", ns, "delete", kind, "scaled-kept")
    assert 'its MachineSet "scaled" wants 2 machine(s) and keeps it among them' in stderr
    # Down to one: the machine we do not keep is enough; MCM must take that one.
    env.ok(ALICE, "-n", ns, "scale", "machinesets.machine.sapcloud.io", "scaled", "--replicas=1")
    env.denied(MCM, "-n", ns, "delete", kind, "scaled-kept")
    env.ok(ALICE, "-n", ns, "scale", "machinesets.machine.sapcloud.io", "scaled", "--replicas=0")
    env.ok(MCM, "-n", ns, "delete", kind, "scaled-kept", "scaled-other")


CLUSTER_CRD = "clusters.extensions.gardener.cloud"


@pytest.fixture(scope="module")
def gardener_cluster_crd(kube_client: client.ApiClient) -> Iterator[None]:
    """Gardener's Cluster kind: the test control plane may not have it; then a minimal CRD of ours (cluster
    scope, `spec.shoot` kept as raw JSON, as Gardener's is), removed again after the module."""
    api = client.ApiextensionsV1Api(kube_client)
    try:
        api.read_custom_resource_definition(CLUSTER_CRD)
        created = False
    except client.ApiException as error:
        if error.status != 404:
            raise
        raw = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        manifest = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": CLUSTER_CRD},
            "spec": {
                "group": "extensions.gardener.cloud",
                "scope": "Cluster",
                "names": {"kind": "Cluster", "listKind": "ClusterList", "plural": "clusters", "singular": "cluster"},
                "versions": [
                    {
                        "name": "v1alpha1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {"cloudProfile": raw, "seed": raw, "shoot": raw},
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        }
        api.create_custom_resource_definition(client.V1CustomResourceDefinition.model_validate(manifest))
        created = True

    def established() -> bool:
        status = api.read_custom_resource_definition(CLUSTER_CRD).status
        conditions = (status.conditions if status is not None else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    def served() -> bool:
        # Established comes a moment before the API server routes the new resource.
        try:
            client.CustomObjectsApi(kube_client).list_cluster_custom_object(
                "extensions.gardener.cloud", "v1alpha1", "clusters"
            )
        except client.ApiException as error:
            if error.status != 404:
                raise
            return False
        return True

    eventually(established)
    eventually(served)
    try:
        yield
    finally:
        if created:
            api.delete_custom_resource_definition(CLUSTER_CRD)


@pytest.mark.usefixtures("gardener_cluster_crd")
def test_hibernation_lets_mcm_delete_the_preserved_machine(env: Env) -> None:
    ns, kind = env.namespace, "machines.machine.sapcloud.io"
    owner = _machine_set(env, "sleepy", replicas=1)
    record, _ = _record()
    _failed_machine(env, "sleepy-kept", owner, record)
    custom = client.CustomObjectsApi(env.api)

    def shoot(hibernated: bool) -> dict[str, Any]:
        return {
            "apiVersion": "extensions.gardener.cloud/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": ns},  # Gardener names it after the Shoot's control namespace
            "spec": {
                "cloudProfile": {},
                "shoot": {
                    "apiVersion": "core.gardener.cloud/v1beta1",
                    "kind": "Shoot",
                    "metadata": {"name": "sleepy", "namespace": "garden-p"},
                    "spec": {"hibernation": {"enabled": hibernated}},
                },
            },
        }

    custom.create_cluster_custom_object("extensions.gardener.cloud", "v1alpha1", "clusters", shoot(False))
    try:
        stderr = env.denied(MCM, "-n", ns, "delete", kind, "sleepy-kept")
        assert 'machine "sleepy-kept" is Failed and preserved until' in stderr
        # Gardener hibernates: its worker pools go to zero; whatever order MCM sees that in, it may delete.
        custom.patch_cluster_custom_object(
            "extensions.gardener.cloud", "v1alpha1", "clusters", ns, {"spec": {"shoot": shoot(True)["spec"]["shoot"]}}
        )
        env.ok_once_seen(MCM, "-n", ns, "delete", kind, "sleepy-kept")
    finally:
        custom.delete_cluster_custom_object("extensions.gardener.cloud", "v1alpha1", "clusters", ns)


@pytest.mark.usefixtures("gardener_cluster_crd")
def test_where_mcms_objects_lack_the_max_the_budget_comes_from_the_shoot(env: Env) -> None:
    ns, kind = env.namespace, "machines.machine.sapcloud.io"
    custom = client.CustomObjectsApi(env.api)
    deployment = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MachineDeployment",
        "metadata": {"name": "pooled", "labels": {"worker.gardener.cloud/pool": "p"}},
        "spec": {"replicas": 2, "template": {"spec": {"class": {"kind": "AWSMachineClass", "name": "c"}}}},
    }
    env.ok(CONTROLLER, "-n", ns, "create", "-f", "-", stdin=json.dumps(deployment))
    md_uid = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "machinedeployments", "pooled")["metadata"]["uid"]
    # As MCM v0.61 leaves it: no autoPreserveFailedMachineMax on the MachineSet or the MachineDeployment.
    machine_set = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MachineSet",
        "metadata": {
            "name": "pooled-a",
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "MachineDeployment",
                    "name": "pooled",
                    "uid": md_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"replicas": 2, "template": {"spec": {"class": {"kind": "AWSMachineClass", "name": "c"}}}},
    }
    env.ok(CONTROLLER, "-n", ns, "create", "-f", "-", stdin=json.dumps(machine_set))
    ms_uid = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "machinesets", "pooled-a")["metadata"]["uid"]
    _failed_machine(env, "pooled-failed", ("pooled-a", ms_uid))
    _failed_machine(env, "pooled-healthy", ("pooled-a", ms_uid), phase="Running")
    # No Cluster: no budget, MCM replaces the machine (a dry run, so the machine stays for what follows).
    env.ok(MCM, "-n", ns, "delete", kind, "pooled-failed", "--dry-run=server")
    cluster = {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": ns},
        "spec": {
            "cloudProfile": {},
            "shoot": {
                "apiVersion": "core.gardener.cloud/v1beta1",
                "kind": "Shoot",
                "metadata": {"name": "pooled", "namespace": "garden-p"},
                "spec": {
                    "provider": {
                        "workers": [{"name": "p", "machineControllerManager": {"autoPreserveFailedMachineMax": 1}}]
                    }
                },
            },
        },
    }
    custom.create_cluster_custom_object("extensions.gardener.cloud", "v1alpha1", "clusters", cluster)
    try:
        stderr = env.denied(MCM, "-n", ns, "delete", kind, "pooled-failed")
        assert 'machine "pooled-failed" is Failed and about to be auto-preserved (MachineSet "pooled-a" has room' in (
            stderr
        )
    finally:
        custom.delete_cluster_custom_object("extensions.gardener.cloud", "v1alpha1", "clusters", ns)


# --- Shoots ------------------------------------------------------------------------------------------------


def _shoot(name: str, *workers: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "core.gardener.cloud/v1beta1",
            "kind": "Shoot",
            "metadata": {"name": name},
            "spec": {"provider": {"type": "aws", "workers": list(workers)}},
        }
    )


def test_shoot_workers_are_validated_with_field_paths_and_zone_warnings(env: Env) -> None:
    ns = env.namespace
    good = {
        "name": "a",
        "minimum": 1,
        "maximum": 10,
        "zones": ["z1", "z2", "z3"],
        "machineControllerManager": {"autoPreserveFailedMachineMax": 2},
    }
    bad = {
        "name": "b",
        "minimum": 1,
        "maximum": 4,
        "systemComponents": {"allow": False},
        "machineControllerManager": {"autoPreserveFailedMachineMax": 5},
    }
    stderr = env.denied(ALICE, "-n", ns, "create", "-f", "-", stdin=_shoot("s1", good, bad))
    assert (
        f'admission webhook "{wc.SHOOT_WEBHOOK}" denied the request: spec.provider.workers[1].machineControllerManager.'
        "autoPreserveFailedMachineMax: Invalid value: 5: must be less than or equal to maximum (4)"
    ) in stderr
    result = env.ok(ALICE, "-n", ns, "create", "-f", "-", stdin=_shoot("s2", good))
    assert (
        "Warning: spec.provider.workers[0].machineControllerManager.autoPreserveFailedMachineMax: "
        "2 cannot be spread evenly over 3 zones; per zone: z1=1, z2=1, z3=0"
    ) in result.stderr
    # Only changes to the workers are sent to the webhook at all.
    before = env.server.requests("validate-shoot")
    env.ok(ALICE, "-n", ns, "label", "shoots.core.gardener.cloud", "s2", "team=sre")
    assert env.server.requests("validate-shoot") == before


def _shoot_with_provider_config(name: str, workers: list[dict[str, Any]], settings: list[dict[str, Any]]) -> str:
    config = {"apiVersion": PRESERVATION_API_VERSION, "kind": PRESERVATION_KIND, "workers": settings}
    document = yaml.safe_load(_shoot(name, *workers))
    document["spec"]["extensions"] = [{"type": EXTENSION_TYPE, "providerConfig": config}]
    return yaml.safe_dump(document)


def test_the_extension_provider_config_is_validated_like_the_worker_fields(env: Env) -> None:
    ns = env.namespace
    pool = {"name": "a", "minimum": 1, "maximum": 4, "systemComponents": {"allow": False}}
    denied = f'admission webhook "{wc.SHOOT_WEBHOOK}" denied the request: '
    settings = [{"name": "a", "autoPreserveFailedMachineMax": 1}, {"name": "a", "machinePreserveTimeout": "3d"}]
    stderr = env.denied(ALICE, "-n", ns, "create", "-f", "-", stdin=_shoot_with_provider_config("p1", [pool], settings))
    assert f'{denied}spec.extensions[0].providerConfig.workers[1].name: Duplicate value: "a"' in stderr
    settings = [{"name": "a", "autoPreserveFailedMachineMax": 1, "machinePreserveTimeout": "3d"}]
    stderr = env.denied(ALICE, "-n", ns, "create", "-f", "-", stdin=_shoot_with_provider_config("p1", [pool], settings))
    assert (
        f'{denied}spec.extensions[0].providerConfig.workers[0].machinePreserveTimeout: Invalid value: "3d": '
        'must be a duration such as "72h" (time: unknown unit "d" in duration "3d")'
    ) in stderr
    # Set in both places, differently.
    both = {**pool, "machineControllerManager": {"autoPreserveFailedMachineMax": 1}}
    settings = [{"name": "a", "autoPreserveFailedMachineMax": 2}]
    stderr = env.denied(ALICE, "-n", ns, "create", "-f", "-", stdin=_shoot_with_provider_config("p1", [both], settings))
    assert (
        f"{denied}spec.extensions[0].providerConfig.workers[0].autoPreserveFailedMachineMax: Invalid value: 2: "
        "differs from spec.provider.workers[0].machineControllerManager.autoPreserveFailedMachineMax (1): set the "
        "pool's autoPreserveFailedMachineMax in one place only"
    ) in stderr
    settings = [{"name": "a", "autoPreserveFailedMachineMax": 3, "machinePreserveTimeout": "48h"}]
    env.ok(ALICE, "-n", ns, "create", "-f", "-", stdin=_shoot_with_provider_config("p1", [pool], settings))
    # A change of the extensions alone is sent to the webhook (and judged against the pool's maximum).
    before = env.server.requests("validate-shoot")
    too_many = {
        "apiVersion": PRESERVATION_API_VERSION,
        "kind": PRESERVATION_KIND,
        "workers": [{"name": "a", "autoPreserveFailedMachineMax": 5}],
    }
    patch: dict[str, Any] = {"spec": {"extensions": [{"type": EXTENSION_TYPE, "providerConfig": too_many}]}}
    stderr = env.denied(
        ALICE, "-n", ns, "patch", "shoots.core.gardener.cloud", "p1", "--type=merge", "-p", json.dumps(patch)
    )
    assert (
        f"{denied}spec.extensions[0].providerConfig.workers[0].autoPreserveFailedMachineMax: Invalid value: 5: "
        "must be less than or equal to maximum (4)"
    ) in stderr
    assert env.server.requests("validate-shoot") == before + 1
    # Disabling the extension is a change too, and its providerConfig no longer counts.
    patch["spec"]["extensions"][0]["disabled"] = True
    env.ok(ALICE, "-n", ns, "patch", "shoots.core.gardener.cloud", "p1", "--type=merge", "-p", json.dumps(patch))
    assert env.server.requests("validate-shoot") == before + 2
