"""The deletion guard reads watch-based caches, not the API server per review (issue #32, finding 6): behind a real
kube-apiserver whose audit log records every read of MCM's and Gardener's kinds, N guarded deletes by MCM cost no
LIST or GET of the webhook's identity (the seed chart's, under its RBAC), a MachineSet change reaches the guard
through the watch, and a guard whose caches have not synced fails closed, as when the API server does not answer.

The guard runs in-process (its endpoint called with the reviews the API server would send), as Gardener's extension:
seed-wide caches, the shoot namespace's Cluster and Extension read too.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import ShootExtension
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import Verdict
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.localcluster import gardener, seed_install
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import seed_plane
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.webhook.app import Endpoints, WebhookConfig
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.metrics import WebhookMetrics
from machine_preservation.webhook.wire import AdmissionRequest
from tests.integration.seed_identity import seed_chart_identity
from tests.polling import eventually_async
from tests.webhook.reviews import MACHINE_KIND, review

GROUP, VERSION = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION
MCM_SERVICE_ACCOUNT = "machine-controller-manager"
CONTROLLER = "system:serviceaccount:mp-test:controller"
DELETES = 20
# Every read of MCM's kinds and Gardener's extension kinds, by anyone: the webhook is told apart by its user.
AUDIT_POLICY: dict[str, object] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["get", "list", "watch"],
            "resources": [{"group": GROUP}, {"group": gardener.EXTENSIONS_GROUP}],
        },
        {"level": "None"},
    ],
}


@dataclass(frozen=True)
class Seed:
    plane: ControlPlane
    identity: Path  # the seed chart's webhook ServiceAccount
    username: str  # as the API server names it


@pytest.fixture(scope="module")
def bare_seed(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seed]:
    """A seed with MCM's kinds and Gardener's Cluster, without Gardener's Extension kind yet."""
    directory = tmp_path_factory.mktemp("webhook-cached-reads")
    with seed_plane(directory=directory / "seed", bin_dir=toolchain.bin_dir, audit_policy=AUDIT_POLICY) as plane:
        identity = asyncio.run(seed_chart_identity(plane, directory, deployment=seed_install.WEBHOOK_DEPLOYMENT))
        yield Seed(plane, identity, _username(identity))


@pytest.fixture(scope="module")
def seed(bare_seed: Seed) -> Seed:
    """The seed with all of Gardener's seed CRDs."""
    gardener.install_seed_crds(bare_seed.plane.kubeconfig, operator=False)
    return bare_seed


def _username(kubeconfig: Path) -> str:
    """The ServiceAccount's username, from its token's claims."""
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    claims = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    return str(decoded["sub"])


@pytest.fixture
async def admin(seed: Seed) -> AsyncIterator[client.CustomObjectsApi]:
    api = await new_api_client(kubeconfig=seed.plane.kubeconfig)
    try:
        yield client.CustomObjectsApi(api)
    finally:
        await api.close()  # type: ignore[no-untyped-call]


def _reads(seed: Seed, *, after: int = 0) -> list[str]:
    """The webhook's reads (not watches) the API server completed, from audit line `after` on."""
    lines = seed.plane.audit_log.read_text().splitlines()[after:]
    found = []
    for line in lines:
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or (event.get("user") or {}).get("username") != seed.username:
            continue
        if event.get("verb") in ("get", "list"):
            ref = event.get("objectRef") or {}
            found.append(f"{event['verb']} {ref.get('resource')} {ref.get('namespace', '')}/{ref.get('name', '')}")
    return found


def _marks(seed: Seed, namespace: str) -> int:
    """How many of the test's marks (an administrator's get of the MachineSet) the audit log holds."""
    found = 0
    for line in seed.plane.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            event.get("stage") == "ResponseComplete"
            and event.get("verb") == "get"
            and (event.get("user") or {}).get("username") != seed.username
            and (ref.get("resource"), ref.get("namespace"), ref.get("name")) == ("machinesets", namespace, "ms")
        ):
            found += 1
    return found


async def _audited_so_far(seed: Seed, admin: client.CustomObjectsApi, namespace: str) -> None:
    """Returns once the audit log holds the requests answered before the call: the API server logs each request as
    it completes, so once a read sent now (a mark) is in the log, the reads answered before it are too."""
    before = _marks(seed, namespace)
    await admin.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    await eventually_async(lambda: _marks(seed, namespace) > before, limit=30, interval=0.1)


def _audit_lines(seed: Seed) -> int:
    return len(seed.plane.audit_log.read_text().splitlines())


async def _shoot_namespace(seed: Seed, admin: client.CustomObjectsApi) -> str:
    """A shoot namespace with its Cluster (the Shoot neither hibernated nor deleted), our Extension, and a
    MachineSet wanting 2 machines: a Failed one the controller preserves, and a healthy one."""
    namespace = gardener.shoot_namespace_name(uuid.uuid4().hex[:4], "s")
    async with await new_api_client(kubeconfig=seed.plane.kubeconfig) as api:
        await client.CoreV1Api(api).create_namespace(gardener.shoot_namespace_manifest(namespace))  # type: ignore[arg-type]
        shoot = {"apiVersion": "core.gardener.cloud/v1beta1", "kind": "Shoot", "metadata": {"name": "s"}, "spec": {}}
        await gardener.apply_cluster(api, gardener.cluster_manifest(namespace, shoot=shoot))
    await admin.create_namespaced_custom_object(
        gardener.EXTENSIONS_GROUP,
        gardener.EXTENSIONS_VERSION,
        namespace,
        "extensions",
        {
            "apiVersion": f"{gardener.EXTENSIONS_GROUP}/{gardener.EXTENSIONS_VERSION}",
            "kind": "Extension",
            "metadata": {"name": gardener.EXTENSION_TYPE, "namespace": namespace},
            "spec": {"type": gardener.EXTENSION_TYPE},
        },
    )
    machine_set = await admin.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machinesets",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "MachineSet",
            "metadata": {"name": "ms"},
            "spec": {"replicas": 2, "template": {"spec": {"class": {"kind": "AWSMachineClass", "name": "c"}}}},
        },
    )
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MachineSet", "name": "ms", "controller": True}
    owner["uid"] = machine_set["metadata"]["uid"]
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=1)
    record = PreservationRecord(since=since, until=since + dt.timedelta(hours=1), by=v.PreservedBy.USER)
    for name, written, phase in (("kept", record.annotations(), "Failed"), ("other", {}, "Running")):
        await admin.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "machines",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Machine",
                "metadata": {"name": name, "annotations": written, "ownerReferences": [owner]},
                "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}},
            },
        )
        await admin.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "machines", name, {"status": {"currentStatus": {"phase": phase}}}
        )
    return namespace


def _endpoints(source: KubernetesMachineSets) -> Endpoints:
    settings = AdmissionSettings(
        controller_username=CONTROLLER, mcm_usernames=frozenset(), mcm_service_accounts=frozenset({MCM_SERVICE_ACCOUNT})
    )
    config = WebhookConfig(settings=settings, machine_sets=source, ready=lambda: True, metrics=WebhookMetrics())
    return Endpoints(config)


async def _mcm_deletes(endpoints: Endpoints, admin: client.CustomObjectsApi, namespace: str, name: str) -> Verdict:
    """The guard's verdict on MCM deleting `name`, the review carrying the Machine as the API server has it."""
    machine = await admin.get_namespaced_custom_object(GROUP, VERSION, namespace, "machines", name)
    mcm = f"system:serviceaccount:{namespace}:{MCM_SERVICE_ACCOUNT}"
    body = review(kind=MACHINE_KIND, operation="DELETE", old=machine, username=mcm)
    return await endpoints.machine_deletion(AdmissionRequest.model_validate(body["request"]))


async def test_a_kind_the_api_server_does_not_serve_is_unknown_until_its_crd_comes(bare_seed: Seed) -> None:
    """No Extension kind (not Gardener): the caches count as synced and the Extension as unknown (None: the guard
    as without the extension); once the CRD is installed, the guard reads our Extension (here: none, absent)."""
    source = KubernetesMachineSets(kubeconfig=bare_seed.identity, gardener_extension=True)
    try:
        await source.start()
        await eventually_async(source.synced)
        assert await source.read_extension(namespace="shoot--p--none") is None
        await asyncio.to_thread(gardener.install_seed_crds, bare_seed.plane.kubeconfig, operator=False)

        async def absent() -> bool:
            return await source.read_extension(namespace="shoot--p--none") == ShootExtension(present=False)

        await eventually_async(absent, limit=60.0)
    finally:
        await source.close()


async def test_guarded_deletes_read_the_caches_and_see_a_machine_set_change(
    seed: Seed, admin: client.CustomObjectsApi
) -> None:
    namespace = await _shoot_namespace(seed, admin)
    source = KubernetesMachineSets(kubeconfig=seed.identity, gardener_extension=True)
    try:
        await source.start()
        await eventually_async(source.synced)
        endpoints = _endpoints(source)
        mark = _audit_lines(seed)
        for _ in range(DELETES):
            verdict = await _mcm_deletes(endpoints, admin, namespace, "kept")
            assert not verdict.allowed
            assert 'its MachineSet "ms" wants 2 machine(s) and keeps it among them' in verdict.message

        # Scaled to zero: the watch brings the change, and the guard lets MCM delete the kept machine.
        await admin.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "machinesets", "ms", {"spec": {"replicas": 0}}, _content_type=MERGE_PATCH
        )

        async def allowed() -> bool:
            return (await _mcm_deletes(endpoints, admin, namespace, "kept")).allowed

        await eventually_async(allowed)
        await _audited_so_far(seed, admin, namespace)
        assert _reads(seed, after=mark) == []
        # …while the caches' own lists are there (the identity's reads are in the log at all).
        assert any(read.startswith("list machinesets") for read in _reads(seed))
    finally:
        await source.close()


async def test_before_its_caches_have_synced_the_guard_fails_closed(
    seed: Seed, admin: client.CustomObjectsApi, tmp_path: Path
) -> None:
    namespace = await _shoot_namespace(seed, admin)
    # The same identity, on an address where no API server answers: the caches cannot sync.
    unreachable = yaml.safe_load(seed.identity.read_text())
    unreachable["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    kubeconfig = tmp_path / "unreachable.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(unreachable))
    source = KubernetesMachineSets(kubeconfig=kubeconfig, gardener_extension=True)
    try:
        await source.start()
        verdict = await _mcm_deletes(_endpoints(source), admin, namespace, "kept")
        assert not source.synced()
        assert not verdict.allowed
        assert verdict.code == 503
        assert 'cannot decide whether MCM may delete machine "kept"' in verdict.message
    finally:
        await source.close()
