"""The chart's ValidatingAdmissionPolicy on Nodes against the real API server, installed with helm: the auto value
and the CA ownership marker, for every identity, with no webhook running at all; and what the node webhook's
exclusion of kubelets, MCM and the controller no longer sees, the policy catches.

The release registers its webhooks by URL at a port where nothing listens (no webhook pods: `webhook.enabled`
and `controller.enabled` are off), with a CA generated here (certificates.mode=provided), so that one test can
start the project's webhook server on that port and show both at work."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from machine_preservation.certs.authority import KeyPair, generate_ca
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.annotations import annotation_errors
from machine_preservation.core.admission.field_errors import ErrorType
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.certificates import install, local_serving_pair
from tests.controller.running import chart_identity
from tests.integration import kube
from tests.integration.chart import CHART, helm, set_args
from tests.integration.test_webhook import ServerThread
from tests.polling import eventually
from tests.webhook import configurations as wc

P = v.PRESERVE_ANNOTATION
MARKER = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
SEED_MCM = "system:serviceaccount:shoot--p--s:machine-controller-manager"
USER = "sre@example.com"
# Nodes that carried both before the chart was installed (written while no policy was there): with the policy,
# nobody can make the auto value appear on a Node any more.
LEGACY = {P: "auto-preserve", MARKER: "true"}
LEGACY_NODES = 24
# Every Node this module creates starts with this, so the module removes exactly its own.
PREFIX = f"pol{uuid.uuid4().hex[:4]}-"

KUBELET, SRE, CONTROLLER, MCM_ROLE = "kubelet", "user", "controller", "mcm"
ROLES = (KUBELET, SRE, CONTROLLER, MCM_ROLE)
NOBODY: frozenset[str] = frozenset()
EVERYBODY = frozenset(ROLES)
MARKER_WRITERS = frozenset({CONTROLLER, MCM_ROLE})
OWN_MARKER = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
ONLY_THE_CONTROLLER = frozenset({CONTROLLER})


@dataclass(frozen=True)
class Release:
    namespace: str
    policy: str
    controller: str
    port: int
    ca: KeyPair
    legacy: list[str] = field(default_factory=list)

    def legacy_node(self) -> str:
        return self.legacy.pop()


def _node(name: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": dict(annotations)}}


def _auto_value_probe(core: client.CoreV1Api) -> str | None:
    """A dry-run create by the admin that only the policy refuses."""
    return kube.denial(lambda: core.create_node(_node(f"{PREFIX}probe", {P: "auto-preserve"}), dry_run="All"))


@pytest.fixture(scope="module")
def release(toolchain: Toolchain, control_plane: ControlPlane, kube_client: client.ApiClient) -> Iterator[Release]:
    core = client.CoreV1Api(kube_client)
    rbac = client.RbacAuthorizationV1Api(kube_client)
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": namespace}})
    legacy = [f"{PREFIX}legacy-{uuid.uuid4().hex[:8]}" for _ in range(LEGACY_NODES)]
    # An earlier test's release may have just gone: wait until the API server has dropped its policy too.
    eventually(lambda: _auto_value_probe(core) is None)
    for name in legacy:
        core.create_node(_node(name, LEGACY))
    # A plain user who may create and patch Nodes (as an SRE might), nothing more.
    role = f"node-editor-{namespace}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": role},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "create", "patch"]},
                {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        }
    )
    ca = generate_ca(common_name="node-policy-ca", now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=3))
    port = free_port()
    values = {
        "fullnameOverride": json.dumps("mp"),
        "webhook.enabled": "false",
        "controller.enabled": "false",
        "webhooks.machines.register": "false",
        "webhooks.clientConfig.url": json.dumps(f"https://127.0.0.1:{port}"),
        "certificates.mode": json.dumps("provided"),
        "certificates.provided.secretName": json.dumps("mp-tls"),
        "certificates.provided.caBundle": json.dumps(base64.b64encode(ca.cert_pem).decode()),
        # The controller keeps the chart's default (its ServiceAccount in the release namespace).
        "webhook.mcmUsernames": json.dumps([MCM, SEED_MCM]),
    }
    flags = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    helm(toolchain.helm, "install", "mp", str(CHART), *flags, *set_args(values))
    try:
        # The API server learns about policies and bindings through an informer.
        eventually(lambda: _auto_value_probe(core))
        yield Release(
            namespace=namespace,
            policy=f"mp-node-annotations.{namespace}",
            controller=f"system:serviceaccount:{namespace}:mp-controller",
            port=port,
            ca=ca,
            legacy=legacy,
        )
    finally:
        helm(toolchain.helm, "uninstall", "mp", *flags, check=False)
        # Later tests write the auto value on Nodes: wait until the API server has dropped the policy.
        eventually(lambda: _auto_value_probe(core) is None)
        for node in core.list_node().items:
            if node.metadata.name.startswith(PREFIX):
                core.delete_node(node.metadata.name)
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        core.delete_namespace(namespace)


class Identities:
    """API clients for the four kinds of writers; a kubelet is `system:node:<its node>`."""

    def __init__(self, control_plane: ControlPlane, directory: Path, release: Release) -> None:
        self._plane, self._directory, self._release = control_plane, directory, release
        self._clients: dict[tuple[str, tuple[str, ...]], client.ApiClient] = {}

    def _client(self, user: str, groups: tuple[str, ...]) -> client.CoreV1Api:
        key = (user, groups)
        if key not in self._clients:
            path = self._directory / f"{user.replace(':', '_').replace('@', '_')}.kubeconfig"
            kubeconfig = self._plane.write_kubeconfig(path, user=user, groups=groups)
            self._clients[key] = config.new_client_from_config(config_file=str(kubeconfig))
        return client.CoreV1Api(self._clients[key])

    def username(self, role: str, node: str, *, mcm: str = MCM) -> str:
        return {
            KUBELET: f"system:node:{node}",
            SRE: USER,
            CONTROLLER: self._release.controller,
            MCM_ROLE: mcm,
        }[role]

    def api(self, role: str, node: str, *, mcm: str = MCM) -> client.CoreV1Api:
        user = self.username(role, node, mcm=mcm)
        groups = {KUBELET: ("system:nodes",), SRE: ()}.get(role, ("system:masters",))
        return self._client(user, groups)

    def close(self) -> None:
        for api_client in self._clients.values():
            api_client.close()


@pytest.fixture
def identities(control_plane: ControlPlane, tmp_path: Path, release: Release) -> Iterator[Identities]:
    made = Identities(control_plane, tmp_path, release)
    yield made
    made.close()


@dataclass(frozen=True)
class Change:
    """One request on a Node: its annotations before, and the annotations the request sets (None removes)."""

    name: str
    before: Mapping[str, str]
    annotations: Mapping[str, str | None]
    allowed_for: frozenset[str]
    status: bool = False  # through nodes/status
    create: bool = False  # a CREATE of a Node carrying `annotations`


def _ready_condition() -> dict[str, str]:
    now = format_timestamp(dt.datetime.now(dt.UTC))
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


CHANGES = [
    # The auto value: nobody sets it on a Node, however it arrives.
    Change("set auto-preserve", {}, {P: "auto-preserve"}, NOBODY),
    Change("set upstream's auto-preserved", {}, {P: "auto-preserved"}, NOBODY),
    Change("change a user value to auto", {P: "now"}, {P: "auto-preserve"}, NOBODY),
    Change("change one auto spelling to the other", LEGACY, {P: "auto-preserved"}, NOBODY),
    Change("set auto through nodes/status", {}, {P: "auto-preserve"}, NOBODY, status=True),
    Change("create a node with the auto value", {}, {P: "auto-preserve"}, NOBODY, create=True),
    # Removing it, or replacing it with a user value, stays allowed.
    Change("remove the auto value", LEGACY, {P: None}, EVERYBODY),
    Change("replace the auto value with now", LEGACY, {P: "now"}, EVERYBODY),
    Change("set a user value", {}, {P: "when-failed"}, EVERYBODY),
    # The marker: the controller and MCM only.
    Change("add the marker", {}, {MARKER: "true"}, MARKER_WRITERS),
    Change("change the marker", {MARKER: "true"}, {MARKER: "false"}, MARKER_WRITERS),
    Change("remove the marker", {MARKER: "true"}, {MARKER: None}, MARKER_WRITERS),
    Change("add the marker through nodes/status", {}, {MARKER: "true"}, MARKER_WRITERS, status=True),
    Change("create a node with the marker", {}, {MARKER: "true"}, MARKER_WRITERS, create=True),
    # Our own marker: the controller only (MCM v0.61 would otherwise be able to take the annotation back).
    Change("add our marker", {}, {OWN_MARKER: "true"}, ONLY_THE_CONTROLLER),
    Change("remove our marker", {OWN_MARKER: "true"}, {OWN_MARKER: None}, ONLY_THE_CONTROLLER),
    Change("add our marker through nodes/status", {}, {OWN_MARKER: "true"}, ONLY_THE_CONTROLLER, status=True),
    # Everything else passes, also on a node already carrying both.
    Change("an unrelated annotation", LEGACY, {"example.com/owner": "team-a"}, EVERYBODY),
    Change("the CA annotation itself", {}, {v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true"}, EVERYBODY),
    Change("a status update", LEGACY, {}, EVERYBODY, status=True),
    Change("create a plain node", {}, {}, EVERYBODY, create=True),
]


@dataclass(frozen=True)
class Outcome:
    denial: str | None
    node: str
    before: dict[str, str]


def _change(name: str) -> Change:
    return next(change for change in CHANGES if change.name == name)


def _apply(change: Change, role: str, *, release: Release, identities: Identities, mcm: str = MCM) -> Outcome:
    """Prepare a node as the change needs it, then make the request as `role`."""
    if change.before == LEGACY:
        node = release.legacy_node()
    else:
        node = f"{PREFIX}{uuid.uuid4().hex[:8]}"
        if not change.create:
            # The controller may create a node carrying the marker (the admin may not).
            identities.api(CONTROLLER, node).create_node(_node(node, change.before))
    before = dict(change.before)
    api = identities.api(role, node, mcm=mcm)
    if change.create:
        created = {key: value for key, value in change.annotations.items() if value is not None}
        return Outcome(kube.denial(lambda: api.create_node(_node(node, created))), node, before)
    body: dict[str, Any] = {"metadata": {"annotations": dict(change.annotations)}} if change.annotations else {}
    if change.status:
        body["status"] = {"conditions": [_ready_condition()]}
        return Outcome(kube.denial(lambda: api.patch_node_status(node, body)), node, before)
    return Outcome(kube.denial(lambda: api.patch_node(node, body)), node, before)


def _expected_annotations(before: Mapping[str, str], change: Change) -> dict[str, str]:
    after = dict(before)
    for key, value in change.annotations.items():
        if value is None:
            after.pop(key, None)
        else:
            after[key] = value
    return after


@pytest.mark.parametrize("role", ROLES)
def test_the_policy_alone_guards_the_auto_value_and_the_marker(
    release: Release, identities: Identities, kube_client: client.ApiClient, role: str
) -> None:
    """No webhook runs anywhere (the configurations point at a closed port and fail open): each identity gets
    exactly its table's verdict, denials name the policy and the field, and what passes really lands."""
    admin = client.CoreV1Api(kube_client)
    # Nothing judges what only the webhook refuses: it is down, and the node webhooks fail open.
    assert (
        _apply(Change("bogus", {}, {P: "bogus"}, EVERYBODY), SRE, release=release, identities=identities).denial is None
    )
    wrong = []
    for change in CHANGES:
        outcome = _apply(change, role, release=release, identities=identities)
        allowed = role in change.allowed_for
        if allowed != (outcome.denial is None):
            wrong.append(f"{change.name}: expected {'allowed' if allowed else 'denied'}, got {outcome.denial!r}")
            continue
        if outcome.denial is not None:
            assert f"ValidatingAdmissionPolicy '{release.policy}'" in outcome.denial, outcome.denial
            key = next(k for k in (P, MARKER, OWN_MARKER) if k in change.annotations)
            assert f"metadata.annotations[{key}]: Forbidden" in outcome.denial, outcome.denial
        else:
            keys = {P, MARKER, *change.annotations}
            annotations = admin.read_node(outcome.node).metadata.annotations or {}
            expected = _expected_annotations(outcome.before, change)
            assert {k: a for k, a in annotations.items() if k in keys} == {
                k: a for k, a in expected.items() if k in keys
            }, change.name
    assert wrong == [], f"{role}: " + "; ".join(wrong)


def test_both_mcm_identities_may_write_the_marker_but_not_the_auto_value(
    release: Release, identities: Identities
) -> None:
    """Every name in webhook.mcmUsernames (a seed's MCM runs in the shoot namespace)."""
    marker, auto = _change("add the marker"), _change("set auto-preserve")
    for mcm in (MCM, SEED_MCM):
        assert _apply(marker, MCM_ROLE, release=release, identities=identities, mcm=mcm).denial is None
        denial = _apply(auto, MCM_ROLE, release=release, identities=identities, mcm=mcm).denial
        assert denial is not None
        assert release.policy in denial


def test_the_policy_passed_the_api_servers_type_check(release: Release, kube_client: client.ApiClient) -> None:
    """The API server checks the expressions against the Node schema and reports problems in the status."""
    registration = client.AdmissionregistrationV1Api(kube_client)

    def checked() -> Any:
        policy = registration.read_validating_admission_policy(release.policy)
        status = policy.status
        return status if status and status.observed_generation == policy.metadata.generation else None

    status = eventually(checked)
    assert status.type_checking is not None
    assert not status.type_checking.expression_warnings, status.type_checking
    assert not status.conditions or all(c.status != "False" for c in status.conditions), status.conditions


# --- the webhook's blind spot -------------------------------------------------------------------------------

# The table's changes on nodes that can still be prepared (no Node can be given the auto value any more).
BLIND_SPOT = [c for c in CHANGES if c.before != LEGACY]


def _forbidden_on_guarded_keys(
    change: Change, before: Mapping[str, str], username: str, settings: AdmissionSettings
) -> list[str]:
    """What the webhook's own rules (the core it runs) would forbid about the auto value and the marker."""
    errors = annotation_errors(
        old=None if change.create else before,
        new=_expected_annotations(before, change),
        username=username,
        settings=settings,
    )
    guarded = {f"metadata.annotations[{P}]", f"metadata.annotations[{MARKER}]"}
    return [str(e.path) for e in errors if e.type == ErrorType.FORBIDDEN and str(e.path) in guarded]


def test_what_the_node_webhook_no_longer_sees_the_policy_catches(
    release: Release,
    identities: Identities,
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    tmp_path: Path,
) -> None:
    """With the webhook running: requests by kubelets, MCM and the controller never reach it (the chart's
    matchConditions exclude them), and every one of them its rules would forbid on the auto value or the
    marker is refused by the policy; a plain user's still reaches the webhook."""
    install(tmp_path, local_serving_pair(release.ca))
    settings = AdmissionSettings(controller_username=release.controller, mcm_usernames=frozenset({MCM, SEED_MCM}))
    # The release runs no webhook of its own: the server here reads as the chart's webhook ServiceAccount.
    identity = asyncio.run(
        chart_identity(control_plane.kubeconfig, release.namespace, leader_election=False, component="webhook")
    )
    thread = ServerThread(
        lambda: WebhookServer(
            host="127.0.0.1",
            port=release.port,
            cert_dir=tmp_path,
            settings=settings,
            machine_sets=KubernetesMachineSets(kubeconfig=identity),
            cert_poll_interval=1.0,
        )
    )
    server = thread.start()
    admin = client.CoreV1Api(kube_client)

    def calls() -> float:
        value = server.metrics.registry.get_sample_value(
            "machine_preservation_webhook_requests_total", {"endpoint": "validate-preserve-annotation"}
        )
        return value or 0.0

    try:
        probe = f"{PREFIX}{uuid.uuid4().hex[:8]}"
        admin.create_node(_node(probe, {}))
        # The webhook is up and judging: a value no policy knows is refused by it.
        bogus = eventually(
            lambda: kube.denial(
                lambda: admin.patch_node(probe, {"metadata": {"annotations": {P: "bogus"}}}, dry_run="All")
            )
        )
        assert wc.NODE_PRESERVE_WEBHOOK in bogus, bogus

        caught: dict[str, int] = {}
        for role in (KUBELET, MCM_ROLE, CONTROLLER, SRE):
            caught[role] = 0
            for change in BLIND_SPOT:
                before_calls = calls()
                outcome = _apply(change, role, release=release, identities=identities)
                username = identities.username(role, outcome.node)
                forbidden = _forbidden_on_guarded_keys(change, change.before, username, settings)
                if role == SRE:
                    # Not excluded: the webhook judges the relevant changes the policy lets through (a request the
                    # policy refuses never gets as far as the webhooks).
                    relevant = set(change.annotations) & set(wc.PRESERVE_RELATED_ANNOTATIONS)
                    if relevant and outcome.denial is None:
                        assert calls() == before_calls + 1, change.name
                    continue
                assert calls() == before_calls, f"{role} reached the webhook: {change.name}"
                if forbidden:
                    caught[role] += 1
                    assert outcome.denial is not None, f"{role} slipped past both: {change.name} {forbidden}"
                    assert release.policy in outcome.denial, outcome.denial
        # Not vacuous: each excluded identity had changes the webhook would have refused.
        assert caught[KUBELET] > 0, caught
        assert caught[MCM_ROLE] > 0, caught
    finally:
        thread.stop()
