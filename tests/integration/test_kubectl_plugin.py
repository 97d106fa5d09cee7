"""`kubectl preservation` against the real kube-apiserver, with the product's node webhook registered (served
in-process) and run as a shoot's users under RBAC of their own: every subcommand, every error, each exit code
and message.

Fixtures are written as an administrator or as the controller's identity (the webhook lets only it write the
controller's fields); the plugin runs as `sre` (reads nodes, patches them, reads the evidence), `viewer` (reads
nodes only), `nobody` (no rights) and `operator` (the seed's Machines of one namespace).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from machine_preservation.certs.authority import generate_ca
from machine_preservation.cli.kubectl.outcomes import ExitCode
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.evidence import build_evidence, evidence_name, pods_of, to_json
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.controller.running import chart_identity
from tests.integration.test_webhook import ServerThread
from tests.polling import eventually
from tests.webhook import configurations as wc

CONTROLLER = "system:serviceaccount:mp-test:controller"
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
P = v.PRESERVE_ANNOTATION
SCOPE = "machine-preservation.test/plugin"
PLUGIN = [sys.executable, "-m", "machine_preservation.cli.kubectl"]


@dataclass
class Env:
    token: str
    namespace: str
    kubeconfigs: dict[str, Path]
    api: client.ApiClient
    kubectl: Path
    configuration: dict[str, Any]
    controller: client.ApiClient  # the controller's identity: the webhook lets only it write its fields

    def plugin(self, user: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*PLUGIN, *args, f"--kubeconfig={self.kubeconfigs[user]}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def node(self, suffix: str) -> str:
        return f"pl-{self.token}-{suffix}"

    def create_node(
        self,
        suffix: str,
        annotations: dict[str, str] | None = None,
        *,
        managed: bool = True,
        ready: str = "True",
    ) -> str:
        """A node in our webhook's scope, created as the controller (which may write its own fields)."""
        name = self.node(suffix)
        labels = {SCOPE: self.token}
        if managed:
            labels[v.MCM_MACHINE_NAME_LABEL] = f"machine-{suffix}"
        core = client.CoreV1Api(self.controller)
        core.create_node(
            client.V1Node.model_validate(
                {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}}
            )
        )
        now = format_timestamp(dt.datetime.now(dt.UTC))
        condition = {"type": "Ready", "status": ready, "lastHeartbeatTime": now, "lastTransitionTime": now}
        core.patch_node_status(name, {"status": {"conditions": [condition]}})
        return name

    def annotations(self, name: str) -> dict[str, str]:
        metadata = client.CoreV1Api(self.api).read_node(name).metadata
        assert metadata is not None
        return dict(metadata.annotations or {})


def _rbac(api: client.ApiClient, token: str, namespace: str) -> None:
    """The users' rights: `sre` as a shoot's SRE, `viewer` who reads nodes only, `operator` in the seed."""
    rbac = client.RbacAuthorizationV1Api(api)
    roles: dict[str, list[dict[str, Any]]] = {
        "sre": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations"],
                "verbs": ["list"],
            },
        ],
        "viewer": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        "operator": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations"],
                "verbs": ["list"],
            },
        ],
    }
    for user, rules in roles.items():
        name = f"plugin-{token}-{user}"
        rbac.create_cluster_role(client.V1ClusterRole.model_validate({"metadata": {"name": name}, "rules": rules}))
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding.model_validate(
                {
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                }
            )
        )
    machines = {
        "apiGroups": [v.MACHINE_API_GROUP],
        "resources": ["machines", "machinesets", "machinedeployments"],
        "verbs": ["get", "list"],
    }
    name = f"plugin-{token}-operator"
    rbac.create_namespaced_role(
        namespace, client.V1Role.model_validate({"metadata": {"name": name}, "rules": [machines]})
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding.model_validate(
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "operator"}],
            }
        ),
    )


def _cleanup_rbac(api: client.ApiClient, token: str) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    for user in ("sre", "viewer", "operator"):
        rbac.delete_cluster_role(f"plugin-{token}-{user}")
        rbac.delete_cluster_role_binding(f"plugin-{token}-{user}")


@pytest.fixture(scope="module")
def env(
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    toolchain: Toolchain,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Env]:
    token = uuid.uuid4().hex[:8]
    directory = tmp_path_factory.mktemp("plugin")
    ca = generate_ca(common_name="plugin-test-ca", now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=3))
    install(directory, local_serving_pair(ca))
    namespace = f"shoot--p--{token}"
    core = client.CoreV1Api(kube_client)
    core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": namespace}}))
    identity = chart_identity_sync(control_plane, namespace)
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
    _rbac(kube_client, token, namespace)
    kubeconfigs = {
        user: control_plane.write_kubeconfig(directory / f"{index}.kubeconfig", user=user, groups=groups)
        for index, (user, groups) in enumerate(
            [("sre", ()), ("viewer", ()), ("nobody", ()), ("operator", ()), (CONTROLLER, ("system:masters",))]
        )
    }
    kubeconfigs["admin"] = control_plane.kubeconfig
    client_config = wc.ClientConfig(ca_bundle=ca.cert_pem, url=f"https://127.0.0.1:{server.port}")
    configuration = wc.validating_configuration(
        name=f"mp-plugin-test-{token}",
        webhooks=[
            wc.node_preserve_annotation_webhook(
                client=client_config,
                controller_username=CONTROLLER,
                mcm_usernames=[MCM],
                object_selector={"matchLabels": {SCOPE: token}},
            ),
            wc.machine_deletion_webhook(
                client=client_config,
                mcm_usernames=[MCM],
                namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            ),
        ],
    )
    registration = client.AdmissionregistrationV1Api(kube_client)
    registration.create_validating_webhook_configuration(
        client.V1ValidatingWebhookConfiguration.model_validate(configuration)
    )
    controller = config.new_client_from_config(config_file=str(kubeconfigs[CONTROLLER]))
    environment = Env(token, namespace, kubeconfigs, kube_client, toolchain.kubectl, configuration, controller)
    try:
        _wait_until_registered(environment)
        yield environment
    finally:
        registration.delete_validating_webhook_configuration(configuration["metadata"]["name"])
        for node in core.list_node(label_selector=f"{SCOPE}={token}").items:
            if node.metadata is not None and node.metadata.name:
                core.delete_node(node.metadata.name)
        _cleanup_rbac(kube_client, token)
        core.delete_namespace(namespace)
        controller.close()
        thread.stop()


def chart_identity_sync(control_plane: ControlPlane, namespace: str) -> Path:
    """The chart's webhook identity (the server reads MachineSets as it)."""
    return asyncio.run(chart_identity(control_plane.kubeconfig, namespace, leader_election=False, component="webhook"))


def _wait_until_registered(env: Env) -> None:
    """The API server learns of a configuration through an informer: probe until the webhook judges."""
    probe = env.create_node("probe")
    core = client.CoreV1Api(env.api)

    def judged() -> bool:
        try:
            core.patch_node(probe, {"metadata": {"annotations": {P: "bogus"}}}, dry_run="All")
        except client.exceptions.ApiException:
            return True
        return False

    eventually(judged)


def _controller_fields(
    *, since: dt.datetime, until: dt.datetime, by: str = "user", drain: str | None = None
) -> dict[str, str]:
    fields = {
        v.PRESERVED_SINCE_ANNOTATION: format_timestamp(since),
        v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(until),
        v.PRESERVED_BY_ANNOTATION: by,
        v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true",
    }
    if drain is not None:
        fields[v.PRESERVED_DRAIN_ANNOTATION] = drain
    return fields


def _ours(document: dict[str, Any], env: Env) -> list[dict[str, Any]]:
    return [item for item in document["items"] if item["node"].startswith(f"pl-{env.token}-")]


def _timeless(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The items without the seconds left, which count down between two runs."""
    return [{key: value for key, value in item.items() if key != "secondsLeft"} for item in document["items"]]


# --- list --------------------------------------------------------------------------------------------------


def test_list_shows_marked_and_preserved_nodes_with_every_column(env: Env) -> None:
    now = dt.datetime.now(dt.UTC)
    user = env.create_node("list-user", {P: "now", **_controller_fields(since=now, until=now + dt.timedelta(hours=2))})
    fields = _controller_fields(since=now, until=now + dt.timedelta(minutes=30), by="auto", drain="failed")
    fields |= {v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: "web/pdb", v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "2"}
    auto = env.create_node("list-auto", {P: "auto-preserve", **fields}, ready="False")
    marked = env.create_node("list-marked", {P: "when-failed"})
    env.create_node("list-plain")

    result = env.plugin("sre", "list", "--sort-by=left")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NODE", "VALUE", "SINCE", "UNTIL", "LEFT", "READY", "DRAIN", "SCALE-DOWN", "PROTECTED"]
    ours = [line for line in lines if f"pl-{env.token}-" in line]
    assert [line.split()[0] for line in ours] == [auto, user, marked]  # soonest to end first, no end last
    assert ours[0].split()[1] == "auto"
    assert "waiting on PDB web/pdb, 2 pods left" in ours[0]
    assert ours[0].split()[5] == "False"
    assert ours[1].split()[1:2] == ["now"]
    assert ours[1].split()[4] in ("1h59m", "2h")
    assert ours[1].rstrip().endswith("yes")
    assert ours[2].split()[1:5] == ["when-failed", "-", "-", "-"]

    document = json.loads(env.plugin("sre", "list", "-o", "json").stdout)
    assert document["kind"] == "NodePreservationList"
    assert document["version"] == "v1"
    item = next(i for i in _ours(document, env) if i["node"] == auto)
    assert item == {
        "node": auto,
        "machine": "machine-list-auto",
        "value": "auto",
        "preservedBy": "auto",
        "since": format_timestamp(now),
        "until": format_timestamp(now + dt.timedelta(minutes=30)),
        "secondsLeft": item["secondsLeft"],
        "ready": "False",
        "drain": {"state": "failed", "podsLeft": 2, "blockedBy": ["web/pdb"]},
        "scaleDownProtected": True,
        "evidence": None,
    }
    assert 1700 < item["secondsLeft"] <= 1800
    assert _timeless(yaml.safe_load(env.plugin("sre", "list", "-o", "yaml").stdout)) == _timeless(document)
    wide = env.plugin("sre", "list", "-o", "wide").stdout
    assert "PRESERVED-BY" in wide
    assert "machine-list-auto" in wide


# Starts the rest of its command line with SIGINT, SIGHUP and SIGTERM at their defaults, as from a terminal: `make
# test` runs this suite as a background job (SIGINT ignored) and may itself run under nohup (SIGHUP ignored), and an
# ignored signal stays ignored across exec.
AS_FROM_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys\n"
    "for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):\n"
    "    signal.signal(signum, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])",
]


@pytest.mark.parametrize(
    ("wrapper", "stops", "code"),
    [
        pytest.param([], [signal.SIGTERM], 128 + signal.SIGTERM, id="SIGTERM"),
        pytest.param([], [signal.SIGHUP], 128 + signal.SIGHUP, id="SIGHUP"),
        pytest.param([], [signal.SIGINT], ExitCode.OK, id="Ctrl-C"),
        # nohup: a closed terminal does not end it, a SIGTERM still does.
        pytest.param(["nohup"], [signal.SIGHUP, signal.SIGTERM], 128 + signal.SIGTERM, id="nohup"),
    ],
)
def test_list_watch_prints_a_row_again_when_the_node_changes_and_a_stop_leaves_no_key_behind(
    env: Env, tmp_path: Path, wrapper: list[str], stops: list[signal.Signals], code: int
) -> None:
    *ignored, stop = stops
    node = env.create_node(f"watched-{len(wrapper)}-{stop.value}", {P: "when-failed"})
    temporary = tmp_path / "tmp"  # where the kubernetes client copies the kubeconfig's key and certificates
    temporary.mkdir()
    process = subprocess.Popen(
        [*AS_FROM_A_TERMINAL, *wrapper, *PLUGIN, "list", "--watch", f"--kubeconfig={env.kubeconfigs['sre']}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    try:
        assert process.stdout is not None
        line = ""
        while node not in line:  # the first table
            line = process.stdout.readline()
            assert line, process.stderr.read() if process.stderr else "the watch ended"
        client.CoreV1Api(env.api).patch_node(node, {"metadata": {"annotations": {P: "now"}}})
        line = process.stdout.readline()
        assert line.split("\t")[:2] == [node, "now"]
        for signum in ignored:
            process.send_signal(signum)
        client.CoreV1Api(env.api).delete_node(node)
        line = process.stdout.readline()  # still watching after an ignored signal
        assert line.split("\t")[0] == node
        assert line.split("\t")[5] == "deleted"
        assert list(temporary.iterdir())  # the copies, while it runs
    finally:
        process.send_signal(stop)
        ended = process.wait(30)
    assert ended == code
    assert list(temporary.iterdir()) == []


def test_list_through_kubectl_finds_the_plugin_on_path(env: Env, tmp_path: Path) -> None:
    shim = tmp_path / "kubectl-preservation"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m machine_preservation.cli.kubectl "$@"\n')
    shim.chmod(0o755)
    node = env.create_node("via-kubectl", {P: "now"})
    result = subprocess.run(
        [str(env.kubectl), "preservation", "list", f"--kubeconfig={env.kubeconfigs['sre']}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    assert node in result.stdout


def test_the_kubeconfig_is_read_as_kubectl_reads_it(env: Env, tmp_path: Path) -> None:
    """$KUBECONFIG (several files, merged), its current context, and `--context` for another one."""
    node = env.create_node("contexts", {P: "when-failed"})
    sre = yaml.safe_load(env.kubeconfigs["sre"].read_text())
    nobody = yaml.safe_load(env.kubeconfigs["nobody"].read_text())
    for document, name in ((sre, "sre"), (nobody, "nobody")):
        document["users"][0]["name"] = name
        document["contexts"] = [{"name": name, "context": {"cluster": document["clusters"][0]["name"], "user": name}}]
        document["current-context"] = name
    (tmp_path / "nobody").write_text(yaml.safe_dump(nobody))
    (tmp_path / "sre").write_text(yaml.safe_dump(sre))
    merged = {**os.environ, "KUBECONFIG": os.pathsep.join([str(tmp_path / "nobody"), str(tmp_path / "sre")])}

    def plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PLUGIN, *args], capture_output=True, text=True, env=merged, timeout=60, check=False)

    assert plugin("list").returncode == 4  # the first file's current context: nobody
    chosen = plugin("list", "--context", "sre")
    assert chosen.returncode == 0, chosen.stderr
    assert node in chosen.stdout
    missing = plugin("list", "--context", "absent")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: cannot load the kubeconfig: ")


def test_list_as_a_user_without_rights_exits_4_naming_the_verb_and_resource(env: Env) -> None:
    result = env.plugin("nobody", "list")
    assert result.returncode == 4
    assert result.stderr.startswith('error: you may not list nodes: nodes is forbidden: User "nobody" cannot list')


def test_a_bad_kubeconfig_exits_1_and_bad_usage_exits_2(env: Env, tmp_path: Path) -> None:
    result = subprocess.run(
        [*PLUGIN, "list", f"--kubeconfig={tmp_path / 'absent'}"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot load the kubeconfig:")
    usage = env.plugin("sre", "list", "--namespace", "x")
    assert usage.returncode == 2
    assert "--namespace needs --seed" in usage.stderr
    traversal = env.plugin("sre", "now", "../namespaces/kube-system")
    assert traversal.returncode == 2
    assert "'../namespaces/kube-system' is not a valid node name" in traversal.stderr


def test_an_unknown_identity_exits_4_and_an_unreachable_server_exits_1(env: Env, tmp_path: Path) -> None:
    document = yaml.safe_load(env.kubeconfigs["sre"].read_text())
    document["users"] = [{"name": "stranger", "user": {"token": "not-a-token"}}]
    for context in document["contexts"]:
        context["context"]["user"] = "stranger"
    stranger = tmp_path / "stranger.kubeconfig"
    stranger.write_text(yaml.safe_dump(document))
    result = subprocess.run([*PLUGIN, "list", f"--kubeconfig={stranger}"], capture_output=True, text=True, check=False)
    assert result.returncode == 4
    assert result.stderr == "error: you must be logged in to the server (Unauthorized)\n"
    for cluster in document["clusters"]:
        cluster["cluster"]["server"] = "https://127.0.0.1:9"
    unreachable = tmp_path / "unreachable.kubeconfig"
    unreachable.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [*PLUGIN, "show", "n1", f"--kubeconfig={unreachable}"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: the server could not be reached: ")


# --- now, when-failed, release -----------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "value"), [("now", "now"), ("when-failed", "when-failed"), ("release", "false")])
def test_setting_shows_the_dry_run_verdict_then_writes(env: Env, command: str, value: str) -> None:
    node = env.create_node(f"set-{command}")
    dry = env.plugin("sre", command, node, "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "admission (server-side dry run): allowed",
        f"node/{node} annotated (server dry run): {P}={value}",
    ]
    assert P not in env.annotations(node)
    result = env.plugin("sre", command, node)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "admission (server-side dry run): allowed",
        f"node/{node} annotated: {P}={value}",
    ]
    assert env.annotations(node)[P] == value


def test_a_denial_by_admission_exits_6_with_the_message_verbatim(env: Env) -> None:
    """A policy of the cluster refuses the change: the dry run shows it, nothing is written."""
    node = env.create_node("frozen")
    name = f"plugin-{env.token}-freeze"
    admission = client.AdmissionregistrationV1Api(env.api)
    admission.create_validating_admission_policy(
        client.V1ValidatingAdmissionPolicy.model_validate(
            {
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["UPDATE"],
                                "resources": ["nodes"],
                                "resourceNames": [node],
                            }
                        ]
                    },
                    "validations": [{"expression": "false", "message": "maintenance freeze: no preservation"}],
                },
            }
        )
    )
    admission.create_validating_admission_policy_binding(
        client.V1ValidatingAdmissionPolicyBinding.model_validate(
            {"metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
        )
    )
    try:
        eventually(lambda: env.plugin("sre", "now", node, "--dry-run=server").returncode == 6)
        result = env.plugin("sre", "now", node)
        assert result.returncode == 6
        assert result.stderr.startswith("error: the change was denied: ")
        assert "maintenance freeze: no preservation" in result.stderr
        assert "annotated" not in result.stdout
        assert P not in env.annotations(node)
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_setting_without_the_right_to_patch_exits_4(env: Env) -> None:
    node = env.create_node("no-patch")
    result = env.plugin("viewer", "now", node)
    assert result.returncode == 4
    assert result.stderr == f'error: you may not patch nodes "{node}"\n'
    assert P not in env.annotations(node)


def test_a_missing_node_exits_3(env: Env) -> None:
    for command in ("now", "when-failed", "release", "show"):
        result = env.plugin("sre", command, env.node("absent"))
        assert result.returncode == 3, command
        assert result.stderr == f'error: nodes "{env.node("absent")}" not found\n'


def test_a_node_of_no_mcm_managed_pool_exits_7(env: Env) -> None:
    node = env.create_node("unmanaged", managed=False)
    for command in ("now", "when-failed", "release", "show"):
        result = env.plugin("sre", command, node)
        assert result.returncode == 7, command
        assert result.stderr == (
            f'error: node "{node}" is not a node of an MCM-managed pool (no label {v.MCM_MACHINE_NAME_LABEL}): '
            "machine-preservation does not act on it\n"
        )


# --- show --------------------------------------------------------------------------------------------------


def _evidence_config_map(env: Env, node: str) -> None:
    now = dt.datetime.now(dt.UTC)
    stamp = format_timestamp(now)
    evidence = build_evidence(
        node_name=node,
        captured_at=now,
        node={"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                         "message": "PLEG is not healthy", "lastTransitionTime": stamp}]}},
        events=[{"type": "Warning", "reason": "NodeNotReady", "message": "Node is not ready", "count": 3,
                 "lastTimestamp": stamp, "source": {"component": "node-controller"}}],
        pods=pods_of({"items": [{"metadata": {"namespace": "web", "name": "web-0", "creationTimestamp": stamp,
                            "ownerReferences": [{"kind": "StatefulSet", "name": "web", "controller": True}]},
               "status": {"phase": "Running", "containerStatuses": [
                   {"name": "app", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}]}),
        machine={"metadata": {"name": "machine-shown"}, "status": {"currentStatus": {"phase": "Failed"},
                 "lastOperation": {"type": "HealthCheck", "state": "Failed", "lastUpdateTime": stamp,
                                   "description": "Machine is unhealthy: kubelet stopped posting status"}}},
    )  # fmt: skip
    client.CoreV1Api(env.api).create_namespaced_config_map(
        v.EVIDENCE_NAMESPACE,
        client.V1ConfigMap.model_validate(
            {
                "metadata": {"name": evidence_name(node), "labels": {v.EVIDENCE_LABEL: "true"}},
                "data": {v.EVIDENCE_DATA_KEY: to_json(evidence)},
            }
        ),
    )


def test_show_prints_the_preservation_and_the_evidence(env: Env) -> None:
    now = dt.datetime.now(dt.UTC)
    fields = _controller_fields(since=now, until=now + dt.timedelta(hours=1), drain="drained")
    node = env.create_node("shown", {P: "when-failed", **fields}, ready="False")
    taint = {"key": v.PRESERVED_TAINT_KEY, "effect": v.PRESERVED_TAINT_EFFECT}
    client.CoreV1Api(env.controller).patch_node(node, {"spec": {"taints": [taint]}})
    _evidence_config_map(env, node)
    try:
        result = env.plugin("sre", "show", node)
        assert result.returncode == 0, result.stderr
        text = result.stdout
        for expected in (
            f"Node:                  {node}",
            "Machine:               machine-shown",
            "Value:                 when-failed",
            "Preserved by:          user",
            "Drain:                 drained",
            "Scale-down protected:  yes",
            f"Tainted:               {v.PRESERVED_TAINT_KEY}:NoSchedule",
            f"Evidence:              {v.EVIDENCE_NAMESPACE}/{evidence_name(node)}, captured",
            "PLEG is not healthy",
            "NodeNotReady",
            "web/web-0",
            "StatefulSet/web",
            "app: waiting (CrashLoopBackOff), last OOMKilled (137)",
            "HealthCheck Failed",
            "Machine is unhealthy: kubelet stopped posting status",
        ):
            assert expected in text, expected
        document = json.loads(env.plugin("sre", "show", node, "-o", "json").stdout)
        assert document["kind"] == "NodePreservation"
        assert document["preservation"]["value"] == "when-failed"
        assert document["evidence"]["document"]["pods"][0]["containers"][0]["restartCount"] == 4
        shown = yaml.safe_load(env.plugin("sre", "show", node, "-o", "yaml").stdout)
        assert _timeless({"items": [shown["preservation"]]}) == _timeless({"items": [document["preservation"]]})
        assert shown["evidence"] == document["evidence"]
    finally:
        client.CoreV1Api(env.api).delete_namespaced_config_map(evidence_name(node), v.EVIDENCE_NAMESPACE)


def test_show_says_when_there_is_no_evidence(env: Env) -> None:
    node = env.create_node("no-evidence", {P: "now"})
    result = env.plugin("sre", "show", node)
    assert result.returncode == 0, result.stderr
    assert f"Evidence:              none recorded ({v.EVIDENCE_NAMESPACE}/{evidence_name(node)})" in result.stdout


def test_show_without_the_right_to_read_the_evidence_exits_4_after_the_preservation(env: Env) -> None:
    node = env.create_node("evidence-forbidden", {P: "now"})
    result = env.plugin("viewer", "show", node)
    assert result.returncode == 4
    assert f"Node:                  {node}" in result.stdout
    assert result.stderr.startswith(
        f'error: you may not get configmaps "{evidence_name(node)}" in namespace "{v.EVIDENCE_NAMESPACE}": '
    )


# --- --seed ------------------------------------------------------------------------------------------------


def test_seed_lists_the_machines_records_and_each_machine_sets_budget(env: Env) -> None:
    now = dt.datetime.now(dt.UTC)
    custom = client.CustomObjectsApi(env.api)
    group, version = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION
    machine_set = custom.create_namespaced_custom_object(
        group, version, env.namespace, "machinesets",
        {"apiVersion": f"{group}/{version}", "kind": "MachineSet", "metadata": {"name": "pool-a"},
         "spec": {"replicas": 3, "autoPreserveFailedMachineMax": 2}},
    )  # fmt: skip
    owner = {"apiVersion": f"{group}/{version}", "kind": "MachineSet", "name": "pool-a",
             "uid": machine_set["metadata"]["uid"], "controller": True}  # fmt: skip
    record = {
        v.PRESERVED_SINCE_ANNOTATION: format_timestamp(now),
        v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(now + dt.timedelta(hours=3)),
        v.PRESERVED_BY_ANNOTATION: "auto",
        v.PRESERVED_DRAIN_ANNOTATION: "drained",
    }
    for name, written in (("m-auto", record), ("m-marked", {P: "when-failed"}), ("m-plain", {})):
        custom.create_namespaced_custom_object(
            group, version, env.namespace, "machines",
            {"apiVersion": f"{group}/{version}", "kind": "Machine",
             "metadata": {"name": name, "annotations": written, "labels": {v.NODE_LABEL: f"node-{name}"},
                          "ownerReferences": [owner]}},
        )  # fmt: skip

    result = env.plugin("operator", "list", "--seed", "--namespace", env.namespace)
    assert result.returncode == 0, result.stderr
    machines, budgets = result.stdout.split("\n\n")
    rows = [line.split() for line in machines.splitlines()]
    assert rows[0] == ["MACHINE", "NODE", "PHASE", "VALUE", "BY", "SINCE", "UNTIL", "LEFT", "DRAIN", "MACHINESET"]
    assert [row[0] for row in rows[1:]] == ["m-auto", "m-marked"]
    assert rows[1][1] == "node-m-auto"
    assert rows[1][4] == "auto"
    assert rows[1][8] == "drained"
    assert budgets.splitlines()[1].split()[:4] == ["pool-a", "2", "1", "-"]

    document = json.loads(env.plugin("operator", "list", "--seed", "-n", env.namespace, "-o", "json").stdout)
    assert document["kind"] == "MachinePreservationList"
    assert document["machineSets"] == [
        {
            "machineSet": "pool-a",
            "autoPreserveFailedMachineMax": 2,
            "source": "MachineSet pool-a spec.autoPreserveFailedMachineMax: 2",
            "autoPreserved": 1,
            "mcmAutoPreservedCount": None,
        }
    ]


def test_seed_errors_exit_with_their_codes(env: Env) -> None:
    forbidden = env.plugin("sre", "list", "--seed", "--namespace", env.namespace)
    assert forbidden.returncode == 4
    assert forbidden.stderr.startswith(f'error: you may not get namespaces "{env.namespace}"')
    missing = env.plugin("admin", "list", "--seed", "--namespace", f"shoot--p--absent-{env.token}")
    assert missing.returncode == 3
    assert missing.stderr == f'error: namespaces "shoot--p--absent-{env.token}" not found\n'


# --- Not installed (last: it removes the module's registration for a moment) -----------------------------


def test_without_the_products_webhook_every_subcommand_exits_5(env: Env) -> None:
    node = env.create_node("not-installed")
    registration = client.AdmissionregistrationV1Api(env.api)
    name = env.configuration["metadata"]["name"]
    registration.delete_validating_webhook_configuration(name)
    try:
        others = [
            c.metadata.name
            for c in registration.list_validating_webhook_configuration().items
            if any(w.name == wc.NODE_PRESERVE_WEBHOOK for w in c.webhooks or [])
        ]
        assert not others, f"another test left a configuration registering the node webhook: {others}"
        message = (
            "error: machine-preservation is not installed in this cluster: no ValidatingWebhookConfiguration "
            f"registers {wc.NODE_PRESERVE_WEBHOOK}\n"
        )
        for args in (["list"], ["show", node], ["now", node], ["when-failed", node], ["release", node]):
            result = env.plugin("sre", *args)
            assert result.returncode == 5, args
            assert result.stderr == message
        seed = env.plugin("operator", "list", "--seed", "-n", env.namespace)
        assert seed.returncode == 5
        assert "registers deletion.machines.machine-preservation.sapcloud.io or preserve-annotation.machines" in (
            seed.stderr
        )
        # Who may not list the configurations is not told so: the check is skipped.
        assert env.plugin("viewer", "list").returncode == 0
    finally:
        registration.create_validating_webhook_configuration(
            client.V1ValidatingWebhookConfiguration.model_validate(env.configuration)
        )
