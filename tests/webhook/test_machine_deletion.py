"""POST /validate-machine-deletion: MCM may not delete a Failed machine we keep, unless replica counts need it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from aiohttp.test_utils import TestClient

from machine_preservation.core import vocabulary as v
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.webhook.app import WebhookConfig, build_app
from machine_preservation.webhook.metrics import WebhookMetrics
from tests.webhook.conftest import NOW, SETTINGS, AiohttpClient, StaticMachineSets, Webhook
from tests.webhook.reviews import ADMIN, CONTROLLER, MACHINE_KIND, MCM, machine, machine_set, review

PATH = "/validate-machine-deletion"
NAMESPACE = "shoot--p--s"
UNTIL = "2026-11-21T15:00:00Z"


def preserved(
    name: str = "m1",
    *,
    since: dt.datetime = NOW - dt.timedelta(hours=1),
    until: dt.datetime = NOW + dt.timedelta(hours=3),
    phase: str = "Failed",
    owner: str = "ms",
    **annotations: str,
) -> dict[str, Any]:
    """A machine with our preservation record (the annotations are the record; the status is only a mirror)."""
    written = PreservationRecord(since=since, until=until, by=v.PreservedBy.USER).annotations()
    return machine(name, {**written, **annotations}, phase=phase, owner=owner)


def delete(obj: dict[str, Any], username: str = MCM) -> dict[str, Any]:
    return review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=username)


def sized(name: str = "ms", *, replicas: int, max_: int = 0, deployment: str = "") -> dict[str, Any]:
    document = machine_set(name, max_=max_)
    document["spec"]["replicas"] = replicas
    if deployment:
        document["metadata"]["ownerReferences"] = [
            {"kind": "MachineDeployment", "name": deployment, "uid": f"uid-{deployment}", "controller": True}
        ]
    return document


def cluster(**shoot: Any) -> dict[str, Any]:
    return {"apiVersion": "extensions.gardener.cloud/v1alpha1", "kind": "Cluster", "spec": {"shoot": shoot}}


async def test_mcm_is_denied_a_preserved_failed_machine_with_the_capped_expiry(webhook: Webhook) -> None:
    webhook.machine_sets.machine_sets = [sized(replicas=2)]
    webhook.machine_sets.machines = [preserved(), machine("m2")]
    response = await webhook.review(PATH, delete(preserved()))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith(f'machine "m1" is Failed and preserved until {UNTIL}; its MachineSet "ms" wants 2')
    assert f"annotate the machine (or its node) with {v.PRESERVE_ANNOTATION}=false" in message
    # The denial was confirmed against the Shoot; there is no Cluster here (not Gardener).
    assert webhook.machine_sets.reads == [(NAMESPACE, "ms")]
    assert webhook.machine_sets.cluster_reads == [NAMESPACE]
    beyond_cap = preserved(since=NOW - dt.timedelta(days=29, hours=23), until=NOW + dt.timedelta(days=3650))
    capped = (await webhook.review(PATH, delete(beyond_cap)))["status"]["message"]
    assert "preserved until 2026-11-21T13:00:00Z" in capped  # since + the 30-day default maximum


async def test_the_status_mirror_is_not_believed(webhook: Webhook) -> None:
    forged = machine(phase="Failed", expiry="9999-12-31T23:59:59Z")
    assert (await webhook.review(PATH, delete(forged)))["allowed"] is True


async def test_users_and_the_controller_always_pass_without_a_read(webhook: Webhook) -> None:
    for username in (ADMIN, CONTROLLER):
        response = await webhook.review(PATH, delete(preserved(), username))
        assert response["allowed"] is True
    assert (webhook.machine_sets.reads, webhook.machine_sets.cluster_reads) == ([], [])


async def test_expired_or_unpreserved_healthy_machines_may_go_without_a_read(webhook: Webhook) -> None:
    expired = preserved(since=NOW - dt.timedelta(hours=3), until=NOW - dt.timedelta(minutes=1))
    assert (await webhook.review(PATH, delete(expired)))["allowed"]
    assert (await webhook.review(PATH, delete(machine("m1", {v.PRESERVE_ANNOTATION: "now"}, phase="Running"))))[
        "allowed"
    ]
    assert (webhook.machine_sets.reads, webhook.machine_sets.cluster_reads) == ([], [])


async def test_a_preserved_healthy_machine_is_kept_whose_node_mcm_saw_deleted(webhook: Webhook) -> None:
    # MCM deletes the Machine of every deleted Node: a machine we keep is guarded in any phase.
    response = await webhook.review(PATH, delete(preserved(phase="Running")))
    assert response["allowed"] is False
    assert 'machine "m1" is Running and preserved until' in response["status"]["message"]
    assert f"{v.PRESERVE_ANNOTATION}=false" in response["status"]["message"]


async def test_a_pending_machine_is_denied(webhook: Webhook) -> None:
    for values in ({v.PRESERVE_ANNOTATION: "when-failed"}, {v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now"}):
        response = await webhook.review(PATH, delete(machine("m1", values, phase="Failed")))
        assert response["allowed"] is False
        assert "about to be preserved" in response["status"]["message"]


async def test_pending_by_budget_reads_the_machine_set(webhook: Webhook) -> None:
    failed = machine(phase="Failed")
    webhook.machine_sets.machine_sets = [machine_set(max_=1)]
    webhook.machine_sets.machines = [failed, machine("m2")]
    response = await webhook.review(PATH, delete(failed))
    assert response["allowed"] is False
    assert 'about to be auto-preserved (MachineSet "ms" has room' in response["status"]["message"]
    assert webhook.machine_sets.reads == [(NAMESPACE, "ms")]


async def test_a_full_budget_or_no_machine_set_lets_mcm_delete_without_reading_the_shoot(webhook: Webhook) -> None:
    failed = machine(phase="Failed")
    holder = preserved("m0", **{v.PRESERVE_ANNOTATION: "auto-preserve"})
    webhook.machine_sets.machine_sets = [machine_set(max_=1)]
    webhook.machine_sets.machines = [failed, holder]
    assert (await webhook.review(PATH, delete(failed)))["allowed"]
    webhook.machine_sets.machine_sets = []
    assert (await webhook.review(PATH, delete(failed)))["allowed"]
    assert webhook.machine_sets.cluster_reads == []


async def test_where_mcms_objects_drop_the_max_the_budget_comes_from_the_shoot(webhook: Webhook) -> None:
    failed = machine(phase="Failed")
    pruned = sized(replicas=2, deployment="md")
    del pruned["spec"]["autoPreserveFailedMachineMax"]  # MCM v0.61's CRDs prune it
    webhook.machine_sets.machine_sets = [pruned]
    webhook.machine_sets.machines = [failed, machine("m2")]
    md = {"metadata": {"name": "md", "labels": {"worker.gardener.cloud/pool": "p"}}, "spec": {"replicas": 2}}
    webhook.machine_sets.machine_deployments = [md]
    assert (await webhook.review(PATH, delete(failed)))["allowed"] is True  # no Cluster: no budget
    assert webhook.machine_sets.cluster_reads == [NAMESPACE]
    pool = {"name": "p", "machineControllerManager": {"autoPreserveFailedMachineMax": 1}}
    webhook.machine_sets.clusters = {NAMESPACE: cluster(spec={"provider": {"workers": [pool]}})}
    response = await webhook.review(PATH, delete(failed))
    assert response["allowed"] is False
    assert 'about to be auto-preserved (MachineSet "ms" has room' in response["status"]["message"]


async def test_scale_to_zero_lets_mcm_delete_the_preserved_machine(webhook: Webhook) -> None:
    webhook.machine_sets.machine_sets = [sized(replicas=0)]
    webhook.machine_sets.machines = [preserved(), machine("m2")]
    assert (await webhook.review(PATH, delete(preserved())))["allowed"] is True
    assert webhook.machine_sets.cluster_reads == []


async def test_scale_down_beyond_the_unpreserved_machines_lets_the_surplus_go(webhook: Webhook) -> None:
    webhook.machine_sets.machine_sets = [sized(replicas=1)]
    first = preserved("a", **{v.MACHINE_PRIORITY_ANNOTATION: "4"})
    second = preserved("b", **{v.MACHINE_PRIORITY_ANNOTATION: "5"})
    webhook.machine_sets.machines = [first, second, machine("h")]
    assert (await webhook.review(PATH, delete(first)))["allowed"] is True
    assert (await webhook.review(PATH, delete(second)))["allowed"] is False


async def test_a_machine_deployment_scaled_to_zero_or_deleted_lets_it_go(webhook: Webhook) -> None:
    webhook.machine_sets.machine_sets = [sized(replicas=2, deployment="md")]
    webhook.machine_sets.machines = [preserved(), machine("m2")]
    md: dict[str, Any] = {"metadata": {"name": "md", "uid": "uid-md"}, "spec": {"replicas": 2}}
    webhook.machine_sets.machine_deployments = [md]
    assert (await webhook.review(PATH, delete(preserved())))["allowed"] is False
    md["spec"]["replicas"] = 0
    assert (await webhook.review(PATH, delete(preserved())))["allowed"] is True
    md["spec"]["replicas"] = 2
    md["metadata"]["deletionTimestamp"] = "2026-11-21T11:00:00Z"
    assert (await webhook.review(PATH, delete(preserved())))["allowed"] is True


async def test_a_hibernated_deleted_or_migrated_shoot_lets_it_go(webhook: Webhook) -> None:
    webhook.machine_sets.machine_sets = [sized(replicas=2)]
    webhook.machine_sets.machines = [preserved(), machine("m2")]
    for shoot in (
        {"spec": {"hibernation": {"enabled": True}}},
        {"metadata": {"name": "s", "deletionTimestamp": "2026-11-21T11:00:00Z"}},
        {"status": {"lastOperation": {"type": "Migrate", "state": "Processing"}}},
    ):
        webhook.machine_sets.clusters = {NAMESPACE: cluster(**shoot)}
        assert (await webhook.review(PATH, delete(preserved())))["allowed"] is True
    webhook.machine_sets.clusters = {NAMESPACE: cluster(spec={"hibernation": {"enabled": False}})}
    assert (await webhook.review(PATH, delete(preserved())))["allowed"] is False


async def test_a_force_deletion_marker_lets_it_go_without_a_read(webhook: Webhook) -> None:
    marked = preserved()
    marked["metadata"]["labels"]["force-deletion"] = "True"
    assert (await webhook.review(PATH, delete(marked)))["allowed"] is True
    assert (webhook.machine_sets.reads, webhook.machine_sets.cluster_reads) == ([], [])


async def test_an_unreadable_machine_set_denies_mcm_with_503_and_counts_an_error(webhook: Webhook) -> None:
    webhook.machine_sets.failure = "connection refused"
    response = await webhook.review(PATH, delete(machine(phase="Failed")))
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert response["status"]["reason"] == "ServiceUnavailable"
    message = response["status"]["message"]
    assert message == 'cannot decide whether MCM may delete machine "m1": connection refused; retry later'
    assert (
        webhook.sample(
            "machine_preservation_webhook_errors_total", endpoint="validate-machine-deletion", kind="upstream"
        )
        == 1
    )
    assert (await webhook.review(PATH, delete(machine(phase="Failed"), ADMIN)))["allowed"]


async def test_an_unreadable_shoot_denies_mcm_with_503(webhook: Webhook) -> None:
    webhook.machine_sets.cluster_failure = "403 Forbidden"
    response = await webhook.review(PATH, delete(preserved()))
    assert (response["allowed"], response["status"]["code"]) == (False, 503)
    assert "403 Forbidden; retry later" in response["status"]["message"]
    # A delete the machine alone allows never gets that far.
    webhook.machine_sets.machine_sets = [sized(replicas=0)]
    assert (await webhook.review(PATH, delete(preserved())))["allowed"] is True


async def test_dry_run_deletes_are_judged_alike(webhook: Webhook) -> None:
    obj = preserved()
    real = review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=MCM, uid="u")
    dry = review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=MCM, uid="u", dry_run=True)
    assert await webhook.review(PATH, real) == await webhook.review(PATH, dry)


async def test_an_internal_error_is_a_500_so_that_the_failure_policy_applies(webhook: Webhook) -> None:
    webhook.machine_sets.crash = True
    body = delete(machine(phase="Failed"))
    status, answer = await webhook.post(PATH, body)
    assert (status, answer["reason"]) == (500, "InternalError")
    labels = {"endpoint": "validate-machine-deletion", "kind": "internal"}
    assert webhook.sample("machine_preservation_webhook_errors_total", **labels) == 1


async def _native(aiohttp_client: AiohttpClient) -> tuple[TestClient[Any, Any], StaticMachineSets]:
    source = StaticMachineSets()
    app = build_app(
        WebhookConfig(
            settings=SETTINGS.model_copy(update={"mcm_native_preservation": True}),
            machine_sets=source,
            ready=lambda: True,
            metrics=WebhookMetrics(),
            clock=lambda: NOW,
        )
    )
    return await aiohttp_client(app), source


async def test_with_native_mcm_only_machines_carrying_our_record_stay_guarded(aiohttp_client: AiohttpClient) -> None:
    client, source = await _native(aiohttp_client)

    async def allowed(obj: dict[str, Any]) -> bool:
        answer = await (await client.post(PATH, json=delete(obj))).json()
        return bool(answer["response"]["allowed"])

    source.machine_sets = [machine_set(max_=1)]
    assert await allowed(machine(phase="Failed"))  # MCM's own auto-preservation: its business
    assert await allowed(machine("m1", {v.PRESERVE_ANNOTATION: "now"}, phase="Failed"))
    assert source.reads == []
    source.machine_sets = [sized(replicas=2)]
    source.machines = [preserved(), machine("m2")]
    assert not await allowed(preserved())  # handed over while running: guarded until our record is gone
    source.machine_sets = [sized(replicas=0)]
    assert await allowed(preserved())


def gardener_extension(*, deleting: bool = False, last: tuple[str, str] = ("Reconcile", "Succeeded")) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "machine-preservation", "namespace": NAMESPACE}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-21T11:00:00Z"
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Extension",
        "metadata": metadata,
        "spec": {"type": "machine-preservation"},
        "status": {"lastOperation": {"type": last[0], "state": last[1]}},
    }


async def test_a_disabled_extension_lets_mcm_replace_a_machine_with_a_leftover_value(webhook: Webhook) -> None:
    source = webhook.machine_sets
    source.gardener_extension = True
    leftover = machine("m1", {v.PRESERVE_ANNOTATION: "when-failed"}, phase="Failed")
    source.extensions = {NAMESPACE: gardener_extension()}
    response = await webhook.review(PATH, delete(leftover))
    assert response["allowed"] is False
    assert "about to be preserved" in response["status"]["message"]
    assert source.extension_reads == [NAMESPACE]
    for released in (
        gardener_extension(deleting=True),
        gardener_extension(last=("Migrate", "Succeeded")),
        None,  # gone
    ):
        source.extensions = {NAMESPACE: released} if released is not None else {}
        assert (await webhook.review(PATH, delete(leftover)))["allowed"] is True
        # Preserved ones too: the controller is releasing them.
        source.machine_sets, source.machines = [sized(replicas=2)], [preserved(), machine("m2")]
        assert (await webhook.review(PATH, delete(preserved())))["allowed"] is True
        source.machine_sets, source.machines = [], []
    source.extensions = {NAMESPACE: gardener_extension(last=("Migrate", "Processing"))}
    assert (await webhook.review(PATH, delete(leftover)))["allowed"] is False


async def test_the_extension_is_read_only_for_a_denial_and_only_as_the_extension(webhook: Webhook) -> None:
    source = webhook.machine_sets
    leftover = machine("m1", {v.PRESERVE_ANNOTATION: "when-failed"}, phase="Failed")
    # Not serving as Gardener's extension: nothing read, today's answer.
    assert (await webhook.review(PATH, delete(leftover)))["allowed"] is False
    assert source.extension_reads == []
    source.gardener_extension = True
    for allowed_anyway in (
        delete(leftover, ADMIN),
        delete(machine(phase="Failed")),
        delete(machine("m1", {v.PRESERVE_ANNOTATION: "now"}, phase="Running")),
    ):
        assert (await webhook.review(PATH, allowed_anyway))["allowed"] is True
    source.clusters = {NAMESPACE: cluster(spec={"hibernation": {"enabled": True}})}
    assert (await webhook.review(PATH, delete(leftover)))["allowed"] is True
    assert source.extension_reads == []


async def test_a_denial_reads_each_object_once(webhook: Webhook) -> None:
    """The guard's one loop: the MachineSet, the Cluster, the Extension, each read once, then the verdict."""
    source = webhook.machine_sets
    source.gardener_extension = True
    source.machine_sets, source.machines = [sized(replicas=2)], [preserved(), machine("m2")]
    source.clusters = {NAMESPACE: cluster()}
    source.extensions = {NAMESPACE: gardener_extension()}
    response = await webhook.review(PATH, delete(preserved()))
    assert response["allowed"] is False
    assert "preserved until" in response["status"]["message"]
    assert (source.reads, source.cluster_reads, source.extension_reads) == (
        [(NAMESPACE, "ms")],
        [NAMESPACE],
        [NAMESPACE],
    )


async def test_an_unreadable_extension_denies_mcm_with_503(webhook: Webhook) -> None:
    source = webhook.machine_sets
    source.gardener_extension = True
    source.extension_failure = "reading the Extension shoot--p--s/machine-preservation: 403 Forbidden"
    response = await webhook.review(PATH, delete(machine("m1", {v.PRESERVE_ANNOTATION: "now"}, phase="Failed")))
    assert (response["allowed"], response["status"]["code"]) == (False, 503)
    assert response["status"]["message"] == (
        'cannot decide whether MCM may delete machine "m1": reading the Extension '
        "shoot--p--s/machine-preservation: 403 Forbidden; retry later"
    )
    # A delete allowed without it never gets that far.
    assert (await webhook.review(PATH, delete(machine(phase="Failed"))))["allowed"] is True
