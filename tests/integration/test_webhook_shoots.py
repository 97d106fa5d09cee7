"""One webhook for a seed's shoot namespaces, against the real API server: MCM's ServiceAccount of a namespace is
MCM there and nobody in another namespace, and whether MCM preserves natively is read per namespace from that
namespace's MCM Deployment. The server is configured by the flags the Gardener chart passes."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from machine_preservation.cli.main import build_parser
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import service_account_username
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.localcluster import seed_install
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from machine_preservation.webhook.commands import settings_from, write_self_signed
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.mcm_detection import NativeByNamespace
from machine_preservation.webhook.server import WebhookServer
from tests.integration.seed_identity import seed_chart_identity
from tests.polling import eventually
from tests.webhook import configurations as wc

MACHINES = (v.MACHINE_API_GROUP, v.MACHINE_API_VERSION)
SEED_CONTROLLER = "system:serviceaccount:extension-mp:gardener-extension-machine-preservation"


def _mcm_deployment(image: str) -> dict[str, Any]:
    labels = {"app": "machine-controller-manager"}
    container = {"name": "machine-controller-manager", "image": image}
    return {
        "metadata": {"name": "machine-controller-manager", "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


@contextmanager
def _shoot_namespaces(kube_client: client.ApiClient, label: str, **images: str) -> Iterator[dict[str, str]]:
    # Client certificate CNs are at most 64 characters: short names (shoot--<tag>--a, …).
    tag = uuid.uuid4().hex[:4]
    core, apps = client.CoreV1Api(kube_client), client.AppsV1Api(kube_client)
    names = {key: f"shoot--{tag}--{chr(ord('a') + index)}" for index, key in enumerate(images)}
    for key, image in images.items():
        core.create_namespace({"metadata": {"name": names[key], "labels": {label: "true"}}})
        apps.create_namespaced_deployment(names[key], _mcm_deployment(image))
    try:
        yield names
    finally:
        for name in names.values():
            core.delete_namespace(name)


def _failed_machine(custom: client.CustomObjectsApi, namespace: str, name: str, annotations: dict[str, str]) -> None:
    custom.create_namespaced_custom_object(
        *MACHINES,
        namespace,
        "machines",
        {
            "apiVersion": f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}",
            "kind": "Machine",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
        },
    )
    custom.patch_namespaced_custom_object_status(
        *MACHINES, namespace, "machines", name, {"status": {"currentStatus": {"phase": "Failed"}}}
    )


def _mcm(namespace: str) -> str:
    return service_account_username(namespace, "machine-controller-manager")


async def test_mcm_per_namespace_and_native_preservation_per_namespace(
    control_plane: ControlPlane,
    kube_client: client.ApiClient,
    kubeconfig_for: Callable[..., Path],
    tmp_path: Path,
) -> None:
    label = f"machine-preservation.test/{uuid.uuid4().hex[:8]}"
    args = build_parser().parse_args(
        [
            "webhook",
            "--cert-dir=/unused",
            f"--controller-username={SEED_CONTROLLER}",
            "--controller-username=system:serviceaccount:kube-system:machine-preservation",
            "--mcm-service-account=machine-controller-manager",
            "--mcm-native-preservation-per-namespace",
        ]
    )
    cert_dir = tmp_path / "certs"
    write_self_signed(cert_dir=cert_dir, names=("127.0.0.1",), now=dt.datetime.now(dt.UTC))
    port = free_port()
    # The deletion guard's and the MCM detection's reads as the seed chart's webhook ServiceAccount.
    identity = await seed_chart_identity(control_plane, tmp_path, deployment=seed_install.WEBHOOK_DEPLOYMENT)
    machine_sets = KubernetesMachineSets(kubeconfig=identity)
    natives = NativeByNamespace.from_kubeconfig(identity, ttl=args.native_preservation_ttl)
    server = WebhookServer(
        host="127.0.0.1",
        port=port,
        cert_dir=cert_dir,
        settings=settings_from(args, native=False),
        machine_sets=machine_sets,
        native=natives,
        cert_poll_interval=0.2,
    )
    custom = client.CustomObjectsApi(kube_client)
    registration = client.AdmissionregistrationV1Api(kube_client)
    name = f"mp-shoots-{uuid.uuid4().hex[:8]}"

    with _shoot_namespaces(kube_client, label, old="r/mcm:v0.61.3", new="r/mcm:v0.62.0", other="r/mcm:v0.61.3") as ns:
        client_config = wc.ClientConfig(ca_bundle=(cert_dir / "ca.crt").read_bytes(), url=f"https://127.0.0.1:{port}")
        configuration = wc.validating_configuration(
            name=name,
            webhooks=[
                wc.machine_deletion_webhook(
                    client=client_config,
                    mcm_usernames=[_mcm(namespace) for namespace in ns.values()],
                    namespace_selector={"matchLabels": {label: "true"}},
                )
            ],
        )

        def as_user(user: str) -> client.CustomObjectsApi:
            api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig_for(user, ("system:masters",)))
            )
            return client.CustomObjectsApi(api_client)

        def denial(api: client.CustomObjectsApi, namespace: str, machine: str) -> str:
            """The denial of deleting `machine`, "" when it was deleted."""
            try:
                api.delete_namespaced_custom_object(*MACHINES, namespace, "machines", machine)
            except ApiException as error:
                if error.status != 403:
                    raise
                return str(error.body)
            return ""

        record = PreservationRecord(
            since=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
            until=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
            by=v.PreservedBy.USER,
        ).annotations()
        registration.create_validating_webhook_configuration(
            client.V1ValidatingWebhookConfiguration.model_validate(configuration)
        )
        try:
            async with server:
                mcm_old, mcm_other, mcm_new = (as_user(_mcm(ns[key])) for key in ("old", "other", "new"))

                def in_force() -> bool:
                    probe = f"probe-{uuid.uuid4().hex[:6]}"
                    _failed_machine(custom, ns["old"], probe, record)
                    return bool(denial(mcm_old, ns["old"], probe))

                await asyncio.to_thread(eventually, in_force)

                # MCM of a namespace deleting its own preserved Failed machine: guarded.
                await asyncio.to_thread(_failed_machine, custom, ns["old"], "kept", record)
                message = await asyncio.to_thread(denial, mcm_old, ns["old"], "kept")
                assert 'machine \\"kept\\" is Failed and preserved until' in message
                # The same kind of identity of another namespace is not MCM there: its delete passes.
                assert await asyncio.to_thread(denial, mcm_other, ns["old"], "kept") == ""

                # Native per namespace: a machine asking for preservation without our record is about to be
                # preserved by us under MCM v0.61, and MCM's own business under v0.62.
                asking = {v.PRESERVE_ANNOTATION: "now"}
                await asyncio.to_thread(_failed_machine, custom, ns["old"], "asking", asking)
                await asyncio.to_thread(_failed_machine, custom, ns["new"], "asking", asking)
                assert "about to be preserved" in await asyncio.to_thread(denial, mcm_old, ns["old"], "asking")
                assert await asyncio.to_thread(denial, mcm_new, ns["new"], "asking") == ""
                # Our own record stays guarded under a native MCM too (a preservation handed over).
                await asyncio.to_thread(_failed_machine, custom, ns["new"], "kept", record)
                assert await asyncio.to_thread(denial, mcm_new, ns["new"], "kept")
        finally:
            registration.delete_validating_webhook_configuration(name)
            await machine_sets.close()
