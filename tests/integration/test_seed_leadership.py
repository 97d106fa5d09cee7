"""Two replicas of the Gardener extension process on one seed, the leader's Lease renewals refused: the old leader
stops writing, to the seed and to every shoot, before the new one can take over (judged from both API servers'
audit logs, each replica named by its User-Agent)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.controller.gardener.seed import EXIT_LOST_LEADERSHIP, LEASE_NAME, SeedController
from machine_preservation.core import vocabulary as v
from machine_preservation.kube.clients import user_agent
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import bare_shoot, seed_plane, served
from machine_preservation.localcluster.toolchain import Toolchain
from tests.controller.support import aio_client, create_machine, create_node, read_node_model
from tests.integration.test_extension_controller import installed_extension, new_ca_pem
from tests.polling import eventually_async

WRITES = ["create", "update", "patch", "delete", "deletecollection"]
# Every write, by anyone: the replicas are told apart by their User-Agent.
AUDIT_POLICY: dict[str, object] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "verbs": WRITES}, {"level": "None"}],
}
# Short, and as client-go's defaults are proportioned: what was sent before the renew deadline has 4 s to land.
LEASE = {"lease_duration": 8, "renew_deadline": 4.0, "retry_period": 1.0}


@dataclasses.dataclass(frozen=True)
class Write:
    received: dt.datetime
    completed: dt.datetime
    what: str


@pytest.fixture(scope="module")
def audited_seed(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with seed_plane(
        directory=tmp_path_factory.mktemp("audited-seed"), bin_dir=toolchain.bin_dir, audit_policy=AUDIT_POLICY
    ) as plane:
        gardener.install_seed_crds(plane.kubeconfig, operator=False)
        yield plane


@pytest.fixture
async def api(audited_seed: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api_client = await aio_client(audited_seed.kubeconfig)
    yield api_client
    await api_client.close()


def writes(log: Path, identity: str) -> list[Write]:
    """The writes the replica `identity` sent, as the API server keeping `log` completed them."""
    found = []
    for line in log.read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        if event.get("userAgent") != user_agent(identity) or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        found.append(
            Write(
                received=dt.datetime.fromisoformat(event["requestReceivedTimestamp"]),
                completed=dt.datetime.fromisoformat(event["stageTimestamp"]),
                what=f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')} {ref.get('name')} "
                f"{(event.get('responseStatus') or {}).get('code')}",
            )
        )
    return found


def refuse_renewals(namespace: str, holder: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding refusing every update of the Lease that keeps `holder`: that
    replica's renewals fail, all its other requests pass."""
    name = f"refuse-renewals-{uuid.uuid4().hex[:6]}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["leases"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"object.metadata.namespace != '{namespace}' || object.metadata.name != "
                    f"'{LEASE_NAME}' || !has(object.spec.holderIdentity) || object.spec.holderIdentity != '{holder}'",
                    "message": "renewals refused by the test",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


async def test_the_old_leader_stops_writing_everywhere_before_the_new_one_leads(
    audited_seed: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    options = await installed_extension(
        audited_seed,
        api,
        new_ca_pem("leadership-ca"),
        tmp_path / "extension",
        leader_elect=True,
        max_drain_attempt=dt.timedelta(seconds=40),  # still draining when the Lease goes, and beyond
        **LEASE,
    )
    replicas = {
        name: SeedController(
            options=dataclasses.replace(options, runtime=dataclasses.replace(options.runtime, identity=name))
        )
        for name in ("old", "new")
    }
    stops = {name: asyncio.Event() for name in replicas}
    tasks: dict[str, asyncio.Task[int]] = {}
    admission = client.AdmissionregistrationV1Api(api)
    async with bare_shoot(
        audited_seed, api, tmp_path, workers=[gardener.worker("worker1")], audit_policy=AUDIT_POLICY
    ) as shoot:
        try:
            tasks["old"] = asyncio.create_task(replicas["old"].run(stops["old"]))
            await eventually_async(lambda: replicas["old"].leading, limit=30)
            tasks["new"] = asyncio.create_task(replicas["new"].run(stops["new"]))
            await gardener.apply_extension(api, shoot.namespace)
            await eventually_async(lambda: served(api, shoot.namespace), limit=60)

            # A Failed machine whose node's pod a PodDisruptionBudget keeps: the old leader drains, and its
            # evictions are refused, for as long as its drain attempt lasts.
            node = f"n-{uuid.uuid4().hex[:6]}"
            await create_node(client.CoreV1Api(shoot.api), node, ready=False)
            await client.CoreV1Api(shoot.api).create_namespaced_pod(
                "default",
                {  # type: ignore[arg-type]
                    "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/none"}]},
                },
            )
            # Running and Ready: only then does the eviction API weigh the budget (a Pending pod may always go).
            await client.CoreV1Api(shoot.api).patch_namespaced_pod_status(
                "guarded",
                "default",
                {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            )
            await client.PolicyV1Api(shoot.api).create_namespaced_pod_disruption_budget(
                "default",
                {  # type: ignore[arg-type]
                    "metadata": {"name": "g"},
                    "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
                },
            )
            await create_machine(
                client.CustomObjectsApi(api),
                shoot.namespace,
                "m",
                node=node,
                phase="Failed",
                annotations={v.PRESERVE_ANNOTATION: "now"},
            )

            async def evicting() -> bool:
                return any("eviction" in w.what for w in writes(shoot.plane.audit_log, "old"))

            await eventually_async(evicting, limit=30)
            assert (await read_node_model(client.CoreV1Api(shoot.api), node)).has_taint(
                v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT
            )

            policy, binding = refuse_renewals(options.namespace, "old")
            await admission.create_validating_admission_policy(policy)  # type: ignore[arg-type]
            await admission.create_validating_admission_policy_binding(binding)  # type: ignore[arg-type]

            # The old leader gives up (crash-only), the standby takes over and drains on.
            assert await asyncio.wait_for(tasks["old"], 120) == EXIT_LOST_LEADERSHIP
            await eventually_async(lambda: replicas["new"].leading, limit=60)

            async def new_evicts() -> bool:
                return any("eviction" in w.what for w in writes(shoot.plane.audit_log, "new"))

            await eventually_async(new_evicts, limit=60)

            logs = (audited_seed.audit_log, shoot.plane.audit_log)
            old = sorted((w for log in logs for w in writes(log, "old")), key=lambda w: w.completed)
            new = sorted((w for log in logs for w in writes(log, "new")), key=lambda w: w.received)
            assert old[-1].completed < new[0].received, (
                f"the old leader's last write ({old[-1]}) came after the new leader's first ({new[0]})"
            )
            print(f"old leader's last write {old[-1]}; the new leader's first {new[0]}")
        finally:
            for name, task in tasks.items():
                stops[name].set()
                await asyncio.gather(task, return_exceptions=True)
            await admission.delete_collection_validating_admission_policy_binding()
            await admission.delete_collection_validating_admission_policy()
