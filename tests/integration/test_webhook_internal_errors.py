"""An internal error of the webhook behind the real kube-apiserver: a Node request passes with the webhook's
warning (node rules must never block kubelets); a Machine request fails closed under `failurePolicy: Fail`,
and passes where the rule is registered with `Ignore`, because the webhook answers HTTP 500 and leaves the
decision to the API server.

The webhook runs in-process with its preserve-annotation decision raising as a bug would; its configurations
are scoped to this module's labelled nodes and two namespaces (one per policy for the Machine rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from machine_preservation.certs.authority import generate_ca
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.app import INTERNAL_ERROR_MESSAGE, INTERNAL_ERROR_WARNING, Endpoints
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from machine_preservation.webhook.wire import AdmissionRequest
from tests.certificates import install, local_serving_pair
from tests.controller.running import chart_identity
from tests.integration.test_webhook import ALICE, CONTROLLER, MCM, Env, P, ServerThread, _machine
from tests.polling import eventually
from tests.webhook import configurations as wc
from tests.webhook.configurations import FailurePolicy

MACHINES = "machines.machine.sapcloud.io"
LABEL = "machine-preservation.test/internal-errors"


async def _crash(_self: Endpoints, _request: AdmissionRequest) -> Any:
    raise RuntimeError("a bug")


@dataclass
class Setup:
    env: Env
    namespaces: dict[FailurePolicy, str]


def _machine_rule(client_config: wc.ClientConfig, namespace: str, policy: FailurePolicy) -> dict[str, Any]:
    webhook = wc.machine_preserve_annotation_webhook(
        client=client_config,
        controller_username=CONTROLLER,
        failure_policy=policy,
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    )
    webhook["name"] = f"{policy.lower()}.{webhook['name']}"  # two of them in one configuration
    return webhook


@pytest.fixture(scope="module")
def setup(
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    toolchain: Toolchain,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    token = uuid.uuid4().hex[:8]
    directory = tmp_path_factory.mktemp("webhook-internal-errors")
    ca = generate_ca(common_name="internal-errors-ca", now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=3))
    install(directory, local_serving_pair(ca))
    core = client.CoreV1Api(kube_client)
    registration = client.AdmissionregistrationV1Api(kube_client)
    name = f"mp-internal-errors-{token}"
    namespaces: dict[FailurePolicy, str] = {"Fail": f"ie-fail-{token}", "Ignore": f"ie-ignore-{token}"}
    with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as cleanup:
        for namespace in namespaces.values():
            core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": namespace}}))
            cleanup.callback(_delete, functools.partial(core.delete_namespace, namespace))
        # The server reads as the chart's webhook ServiceAccount of a release serving the first namespace; the
        # rules registered here never ask it for a deletion verdict.
        identity = asyncio.run(
            chart_identity(control_plane.kubeconfig, namespaces["Fail"], leader_election=False, component="webhook")
        )
        patch.setattr(Endpoints, "preserve_annotation", _crash)
        thread = ServerThread(
            lambda: WebhookServer(
                host="127.0.0.1",
                port=0,
                cert_dir=directory,
                settings=AdmissionSettings(controller_username=CONTROLLER, mcm_usernames=frozenset({MCM})),
                machine_sets=KubernetesMachineSets(kubeconfig=identity),
                cert_poll_interval=1.0,
            )
        )
        server = thread.start()
        cleanup.callback(thread.stop)
        thread.ca_pem = ca.cert_pem.decode()
        try:
            # Both may do everything (system:masters): what is judged here is admission, not authorization.
            masters = ("system:masters",)
            kubeconfigs = {
                user: control_plane.write_kubeconfig(directory / f"{i}.kubeconfig", user=user, groups=masters)
                for i, user in enumerate((ALICE, CONTROLLER))
            }
            client_config = wc.ClientConfig(ca_bundle=ca.cert_pem, url=f"https://127.0.0.1:{server.port}")
            validating = wc.validating_configuration(
                name=name,
                webhooks=[
                    wc.node_preserve_annotation_webhook(
                        client=client_config,
                        controller_username=CONTROLLER,
                        mcm_usernames=[MCM],
                        object_selector={"matchLabels": {LABEL: token}},
                    ),
                    *(_machine_rule(client_config, namespace, policy) for policy, namespace in namespaces.items()),
                ],
            )
            registration.create_validating_webhook_configuration(
                client.V1ValidatingWebhookConfiguration.model_validate(validating)
            )
            env = Env(token, namespaces["Fail"], thread, toolchain.kubectl, kubeconfigs, kube_client)
            _wait_until_registered(env, namespaces["Fail"])
            yield Setup(env, namespaces)
        finally:
            _delete(lambda: registration.delete_validating_webhook_configuration(name))
            for node in core.list_node(label_selector=f"{LABEL}={token}").items:
                if node.metadata is not None and node.metadata.name:
                    core.delete_node(node.metadata.name)


def _delete(action: Callable[[], object]) -> None:
    """Cleanup: what setup did not get to create is not there to delete."""
    try:
        action()
    except ApiException as error:
        if error.status != 404:
            raise


def _create_node(env: Env, suffix: str) -> str:
    name = f"ie-{env.token}-{suffix}"
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {LABEL: env.token}}}
    env.ok(CONTROLLER, "create", "-f", "-", stdin=json.dumps(manifest))
    return name


def _create_machine(env: Env, namespace: str, name: str) -> None:
    env.ok(CONTROLLER, "-n", namespace, "create", "-f", "-", stdin=json.dumps(_machine(name)))


def _machine_annotations(env: Env, namespace: str, name: str) -> dict[str, str]:
    machine: Any = client.CustomObjectsApi(env.api).get_namespaced_custom_object(
        v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, namespace, "machines", name
    )
    return dict(machine["metadata"].get("annotations") or {})


def _wait_until_registered(env: Env, fail_namespace: str) -> None:
    """The API server learns about configurations through an informer: probe until the rules are in force."""
    node = _create_node(env, "probe")
    _create_machine(env, fail_namespace, "probe")

    def node_rule_in_force() -> bool:
        result = env.run(ALICE, "annotate", "node", node, f"{P}=now", "--dry-run=server")
        return result.returncode == 0 and INTERNAL_ERROR_WARNING in result.stderr

    def machine_rule_in_force() -> bool:
        result = env.run(ALICE, "-n", fail_namespace, "annotate", MACHINES, "probe", f"{P}=now", "--dry-run=server")
        return result.returncode != 0 and INTERNAL_ERROR_MESSAGE in result.stderr

    eventually(node_rule_in_force)
    eventually(machine_rule_in_force)


def test_a_node_request_passes_with_the_warning(setup: Setup) -> None:
    env = setup.env
    node = _create_node(env, "node")
    result = env.ok(ALICE, "annotate", "node", node, f"{P}=now")
    assert f"Warning: {INTERNAL_ERROR_WARNING}" in result.stderr
    assert env.node_annotations(node)[P] == "now"


def test_a_machine_request_fails_closed_under_failure_policy_fail(setup: Setup) -> None:
    env, namespace = setup.env, setup.namespaces["Fail"]
    _create_machine(env, namespace, "guarded")
    stderr = env.denied(ALICE, "-n", namespace, "annotate", MACHINES, "guarded", f"{P}=now")
    policy_name = f"fail.{wc.MACHINE_PRESERVE_WEBHOOK}"
    assert f'failed calling webhook "{policy_name}"' in stderr
    assert INTERNAL_ERROR_MESSAGE in stderr
    assert P not in _machine_annotations(env, namespace, "guarded")


def test_the_api_server_applies_the_registered_policy_not_the_webhook(setup: Setup) -> None:
    """The same internal error, where an operator registered the Machine rule with Ignore, lets it pass."""
    env, namespace = setup.env, setup.namespaces["Ignore"]
    _create_machine(env, namespace, "unguarded")
    env.ok(ALICE, "-n", namespace, "annotate", MACHINES, "unguarded", f"{P}=now")
    assert _machine_annotations(env, namespace, "unguarded")[P] == "now"
