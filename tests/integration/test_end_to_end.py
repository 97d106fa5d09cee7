"""Webhook, controller and the MCM stand-in together on the real control plane: MCM (the stand-in, as MCM's
identity) tries to delete a Failed machine that asks to be preserved (`when-failed`) before the controller
has got to it; the webhook's deletion guard denies that, and the controller then preserves the machine."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.cluster.controlplane import ControlPlane
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.standin.mcm import MCM_USERNAME, McmStandIn, set_node_ready
from machine_preservation.webhook import configuration as wc
from machine_preservation.webhook.commands import write_self_signed
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.server import WebhookServer
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_custom,
    create_machine,
    events_about,
    eventually,
    is_preserved,
    is_unpreserved,
    machines_of,
    read_node_model,
)


@contextlib.asynccontextmanager
async def webhooks(
    api: client.ApiClient, kubeconfig: Path, namespace: str, directory: Path, *, controller: str
) -> AsyncIterator[WebhookServer]:
    """The webhook server in this event loop, registered as the chart does for validation: the preserve
    annotation on Nodes and Machines (everyone but `controller`), and the deletion guard for MCM's deletes.
    Machines are scoped to `namespace`; the registration goes when the test ends."""
    assert write_self_signed(cert_dir=directory, names=("127.0.0.1",), now=dt.datetime.now(dt.UTC))
    ca_bundle = (directory / "ca.crt").read_bytes()
    machine_sets = KubernetesMachineSets(kubeconfig=kubeconfig)
    settings = AdmissionSettings(controller_username=controller, mcm_usernames=frozenset({MCM_USERNAME}))
    registration = client.AdmissionregistrationV1Api(api)
    name = f"mp-e2e-{uuid.uuid4().hex[:8]}"
    scoped = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    async with WebhookServer(
        host="127.0.0.1", port=0, cert_dir=directory, settings=settings, machine_sets=machine_sets
    ) as server:
        config = wc.ClientConfig(ca_bundle=ca_bundle, url=f"https://127.0.0.1:{server.port}")
        validating = [
            wc.node_preserve_annotation_webhook(
                client=config, controller_username=controller, mcm_usernames=[MCM_USERNAME]
            ),
            wc.machine_preserve_annotation_webhook(
                client=config, controller_username=controller, namespace_selector=scoped
            ),
            wc.machine_deletion_webhook(client=config, mcm_usernames=[MCM_USERNAME], namespace_selector=scoped),
        ]
        await registration.create_validating_webhook_configuration(
            wc.validating_configuration(name=name, webhooks=validating)
        )
        try:
            yield server
        finally:
            await registration.delete_validating_webhook_configuration(name)
            await machine_sets.close()


async def mcm_may_delete(mcm: client.ApiClient, namespace: str, name: str) -> str:
    """Ask the API server, as MCM and without deleting anything, whether MCM may delete the machine: "" when
    it may, else the denial's text."""
    try:
        await client.CustomObjectsApi(mcm).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "machines", name, dry_run="All"
        )
    except ApiException as error:
        if error.status != 403:
            raise
        message: str = json.loads(error.body)["message"]
        return message
    return ""


async def test_mcm_is_denied_deleting_a_machine_pending_preservation_and_the_controller_then_preserves_it(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    standin: McmStandIn,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    # The controller runs as its own identity: the annotation guards let its writes through, and only its.
    controller = f"system:serviceaccount:{namespace}:mp-controller"
    controller_kubeconfig = kubeconfig_for(controller, ("system:masters",))
    async with webhooks(api, control_plane.kubeconfig, namespace, tmp_path / "certs", controller=controller):
        # The API server learns of the configuration through an informer: wait until the guard is in force.
        custom = client.CustomObjectsApi(api)
        await create_machine(
            custom, namespace, "probe", phase="Failed", annotations={v.PRESERVE_ANNOTATION: "when-failed"}
        )
        await eventually(lambda: mcm_may_delete(standin.api, namespace, "probe"))
        await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "probe")

        await create_custom(
            api,
            namespace,
            "MachineSet",
            "ms",
            spec={"replicas": 1, "template": {"spec": {"class": {"kind": "C", "name": "c"}}}},
        )

        async def one_running() -> str:
            machines = await machines_of(api, namespace)
            running = [name for name, m in machines.items() if m.phase == "Running"]
            return running[0] if len(machines) == 1 and running else ""

        name = await eventually(one_running)
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "machines",
            name,
            {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "when-failed"}}},
            _content_type="application/merge-patch+json",
        )
        # The node dies: MCM marks the machine Failed, then its MachineSet controller tries to delete it.
        await set_node_ready(api, name=name, ready=False)
        await eventually(lambda: standin.deletions_denied > 0)
        machines = await machines_of(api, namespace)
        assert list(machines) == [name], "the machine was neither deleted nor replaced"
        assert machines[name].phase == "Failed"
        assert is_unpreserved(machines[name]), "not preserved yet: no controller runs"
        denial = await mcm_may_delete(standin.api, namespace, name)
        assert f'machine "{name}" is Failed and about to be preserved (preserve value "when-failed"' in denial

        async with running_controller(kubeconfig=controller_kubeconfig, namespace=namespace):

            async def preserved_and_drained() -> bool:
                machine = (await machines_of(api, namespace)).get(name)
                assert machine is not None, "MCM must not delete the machine"
                node = await read_node_model(client.CoreV1Api(api), name)
                condition = node.preserved_condition
                record = machine.preservation
                return (
                    machine.phase == "Failed"
                    and is_preserved(machine)
                    and record is not None
                    and record.drain is not None
                    and record.drain.outcome == v.DrainOutcome.DRAINED
                    and node.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
                    and condition is not None
                    and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
                )

            await eventually(preserved_and_drained)

            async def reported_on_machine_and_node() -> bool:
                wanted = {"PreservationStarted", "PreservedNodeDrained"}
                about = [await events_about(api, namespace, kind, name) for kind in ("Machine", "Node")]
                return all(wanted <= {e.reason for e in events} for events in about)

            await eventually(reported_on_machine_and_node)
            denial = await mcm_may_delete(standin.api, namespace, name)
            assert f'machine "{name}" is Failed and preserved until' in denial
            kept = await machines_of(api, namespace)
            assert list(kept) == [name], "still kept, nothing replaced"
            # The controller's own annotation writes (its record too) passed the Machine annotation guard.
            assert kept[name].metadata.annotations[v.MACHINE_PRIORITY_ANNOTATION] == "5"
            assert kept[name].metadata.annotations[v.PRESERVED_BY_ANNOTATION] == v.PreservedBy.USER
