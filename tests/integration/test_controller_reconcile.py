"""The controller end to end on the real control plane with the real core: start, drain, stop, expiry,
auto-preservation per MachineSet, metrics and probes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import aiohttp
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Node
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_machine,
    is_preserved,
    is_unpreserved,
    machine_model,
    machine_set_owner,
    new_node,
    pdb_settled,
    read_node_model,
    read_raw,
    running_pod,
)
from tests.polling import eventually_async


async def node_model(api: client.ApiClient, name: str) -> Node:
    return await read_node_model(client.CoreV1Api(api), name)


async def event_reasons(api: client.ApiClient, namespace: str) -> set[str]:
    return {e.reason for e in (await client.CoreV1Api(api).list_namespaced_event(namespace)).items if e.reason}


async def test_now_on_the_node_preserves_and_removing_it_stops(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = await new_node(api, node_names, ready=True)
    await create_machine(custom, namespace, "m", node=node)
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
        started = dt.datetime.now(dt.UTC)
        await core.patch_node(node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "now"}}})

        async def preserved() -> bool:
            machine, n = await machine_model(api, namespace, "m"), await node_model(api, node)
            condition = n.preserved_condition
            return bool(
                is_preserved(machine)
                and condition is not None
                and condition.status == "True"
                and n.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
            )

        await eventually_async(preserved)
        machine, n = await machine_model(api, namespace, "m"), await node_model(api, node)
        assert machine is not None
        record = machine.preservation
        assert record is not None
        assert record.by == v.PreservedBy.USER
        assert abs(record.since - started) < dt.timedelta(seconds=30)
        assert record.until == record.since + dt.timedelta(hours=72), "the default timeout"
        assert machine.mirrored_expiry == record.until
        assert machine.metadata.annotations[v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION] == "now"
        assert n.metadata.annotations[v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION] == "true"
        condition = n.preserved_condition
        assert condition is not None
        assert condition.reason == "Preserved by user."
        assert condition.message.startswith("Machine preserved until ")
        assert not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT), "a Running machine is not tainted"
        await eventually_async(lambda: _has(event_reasons(api, namespace), "PreservationStarted"))

        await core.patch_node(node, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: None}}})

        async def stopped() -> bool:
            machine, n = await machine_model(api, namespace, "m"), await node_model(api, node)
            condition = n.preserved_condition
            return bool(
                is_unpreserved(machine)
                and condition is not None
                and condition.status == "False"
                and v.CA_SCALE_DOWN_DISABLED_ANNOTATION not in n.metadata.annotations
            )

        await eventually_async(stopped)
        n = await node_model(api, node)
        condition = n.preserved_condition
        assert condition is not None
        assert (condition.reason, condition.message) == ("Preservation stopped.", "")
        assert v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION not in n.metadata.annotations


async def test_a_node_marked_by_an_earlier_version_is_migrated_without_a_gap(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    """An earlier version marked its CA annotation with MCM's `-by-mcm`, which MCM v0.61 removes after rollouts:
    the controller swaps it for its own marker in one write, and the annotation stays throughout."""
    custom = client.CustomObjectsApi(api)
    ca, legacy, ours = (
        v.CA_SCALE_DOWN_DISABLED_ANNOTATION,
        v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION,
        v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION,
    )
    node = await new_node(
        api, node_names, ready=True, annotations={v.PRESERVE_ANNOTATION: "now", ca: "true", legacy: "true"}
    )
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=5)
    record = {
        v.PRESERVED_SINCE_ANNOTATION: format_timestamp(since),
        v.PRESERVED_UNTIL_ANNOTATION: format_timestamp(since + dt.timedelta(hours=1)),
        v.PRESERVED_BY_ANNOTATION: "user",
        v.PRESERVED_ADDED_CA_ANNOTATION: "true",
        v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now",
    }
    await create_machine(custom, namespace, "m", node=node, annotations=record)
    seen: list[str | None] = []
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):

        async def migrated() -> bool:
            annotations = (await node_model(api, node)).metadata.annotations
            seen.append(annotations.get(ca))
            return annotations.get(ours) == "true" and legacy not in annotations

        await eventually_async(migrated, interval=0.02)
    assert set(seen) == {"true"}, seen
    assert (await node_model(api, node)).metadata.annotations.get(ca) == "true"
    machine = await machine_model(api, namespace, "m")
    assert machine is not None
    assert machine.preservation is not None
    assert machine.preservation.since == since, "the same preservation, not a new one"


async def test_a_failed_preserved_machine_is_tainted_drained_and_deleted_at_expiry(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = await new_node(api, node_names, ready=False)
    await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "workload"},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "registry.invalid/none"}],
            },
        },
    )
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace) as running:
        await create_machine(
            custom,
            namespace,
            "m",
            node=node,
            phase="Failed",
            annotations={v.PRESERVE_ANNOTATION: "now"},
            spec={"machinePreserveTimeout": "8s"},
        )

        async def drained() -> bool:
            machine, n = await machine_model(api, namespace, "m"), await node_model(api, node)
            record = machine.preservation if machine is not None else None
            condition = n.preserved_condition
            return bool(
                record is not None
                and record.drain is not None
                and record.drain.outcome == v.DrainOutcome.DRAINED
                and condition is not None
                and condition.status == "True"
                and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
                and n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
            )

        await eventually_async(drained)
        registry = running.controller.metrics.registry
        assert registry.get_sample_value("machine_preservation_drains_total", {"outcome": "succeeded"}) == 1
        pod = await read_raw(core.read_namespaced_pod_without_preload_content("workload", namespace))
        assert pod["metadata"].get("deletionTimestamp"), "the pod was evicted"
        assert (await node_model(api, node)).spec.unschedulable is False

        # Expiry: the machine's own 8s timeout runs out; a Failed machine is then deleted and the node cleaned.
        await eventually_async(lambda: _is_none(machine_model(api, namespace, "m")), limit=60)
        n = await node_model(api, node)
        assert not n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)
        condition = n.preserved_condition
        assert condition is not None
        assert condition.reason == "Preservation stopped."
        assert v.CA_SCALE_DOWN_DISABLED_ANNOTATION not in n.metadata.annotations
        reasons = await event_reasons(api, namespace)
        assert {"PreservationStarted", "PreservedNodeDrained"} <= reasons


async def test_machine_set_auto_preserves_up_to_its_max(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = await machine_set_owner(api, namespace, "ms", replicas=3, autoPreserveFailedMachineMax=1)
    for name in ("a", "b"):
        node = await new_node(api, node_names, ready=False)
        await create_machine(custom, namespace, name, node=node, phase="Failed", owner=owner)
    node = await new_node(api, node_names, ready=True)
    await create_machine(custom, namespace, "healthy", node=node, owner=owner)

    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):

        async def one_auto_preserved() -> bool:
            machines = [await machine_model(api, namespace, n) for n in ("a", "b", "healthy")]
            values = [m.metadata.annotations.get(v.PRESERVE_ANNOTATION) if m else None for m in machines]
            records = [m.preservation if m else None for m in machines]
            return (
                sorted(map(str, values)) == ["None", "None", "auto-preserve"]
                and sum(r is not None for r in records) == 1
                and all(r.by == v.PreservedBy.AUTO for r in records if r is not None)
                and sum(is_preserved(m) for m in machines) == 1
            )

        await eventually_async(one_auto_preserved)
        await eventually_async(lambda: _status_counts(custom, namespace))
        healthy = await machine_model(api, namespace, "healthy")
        assert healthy is not None
        assert v.PRESERVE_ANNOTATION not in healthy.metadata.annotations


async def test_metrics_and_probes(control_plane: ControlPlane, api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m", annotations={v.PRESERVE_ANNOTATION: "now"})
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace) as running:
        port = running.controller.metrics_port
        assert port > 0
        await eventually_async(lambda: _preserved(api, namespace, "m"))
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200

            async def scraped() -> str:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                    text = await response.text()
                # The objects show the preservation before the reconcile that wrote it records its duration.
                expected = (
                    "machine_preservation_preserved_machines"
                    f'{{namespace="{namespace}",phase="Running",reason="manual"}} 1.0',
                    'machine_preservation_reconcile_duration_seconds_count{controller="machines",result="success"}',
                )
                return text if all(line in text for line in expected) else ""

            text = await eventually_async(scraped)
        assert (
            'machine_preservation_api_requests_total{cluster="control",code="200",resource="machines/status",verb="patch"}'
            in text
        )
        assert 'machine_preservation_queue_depth{queue="machines"}' in text


async def _has(reasons: Any, reason: str) -> bool:
    return reason in await reasons


async def _is_none(machine: Any) -> bool:
    return await machine is None


async def _preserved(api: client.ApiClient, namespace: str, name: str) -> bool:
    return is_preserved(await machine_model(api, namespace, name))


async def _status_counts(custom: client.CustomObjectsApi, namespace: str) -> bool:
    current = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "machinesets", "ms")
    assert isinstance(current, dict)
    status = current.get("status") or {}
    return status.get("autoPreserveFailedMachineCount") == 1 and status.get("preservedFailedReplicas") == 1


async def test_a_converged_cluster_gets_no_writes_across_resyncs(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    node = await new_node(api, node_names, ready=True, annotations={v.PRESERVE_ANNOTATION: "now"})
    await create_machine(custom, namespace, "preserved", node=node)
    await create_machine(custom, namespace, "plain")
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, resync_period=0.5
    ) as running:
        await eventually_async(lambda: _preserved(api, namespace, "preserved"))
        caches = running.controller.caches
        assert caches is not None

        async def settled() -> float:
            before = running.controller.metrics.api_writes()
            resyncs = caches.machines.stats.resyncs
            await eventually_async(lambda: caches.machines.stats.resyncs >= resyncs + 2)
            return before if running.controller.metrics.api_writes() == before else 0.0

        writes = await eventually_async(settled)
        resyncs = caches.machines.stats.resyncs
        await eventually_async(lambda: caches.machines.stats.resyncs >= resyncs + 3)
        assert running.controller.metrics.api_writes() == writes, "steady state: every reconcile plans nothing"
        assert running.controller.ready()


async def test_blocked_drains_do_not_hold_up_other_machines(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    core, custom, policy = client.CoreV1Api(api), client.CustomObjectsApi(api), client.PolicyV1Api(api)
    blocked = [await new_node(api, node_names, ready=False) for _ in range(2)]
    for index, node in enumerate(blocked):
        await running_pod(core, namespace, f"guarded-{index}", node=node, labels={"app": "guarded"})
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {"metadata": {"name": "g"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}},
    )
    # The budget is in force before any drain: every eviction is refused (429), so the drains block on it.
    await eventually_async(lambda: pdb_settled(policy, namespace, "g", allowed=0))
    healthy = await new_node(api, node_names, ready=True)
    await create_machine(custom, namespace, "c", node=healthy)
    async with running_controller(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        workers=2,  # one drain at a time, one worker always free
        # Longer than any test: the drains are still blocked when the assertions run, however busy the machine.
        max_drain_attempt=dt.timedelta(minutes=10),
        shutdown_grace=0.5,  # the stop need not wait for the blocked drain
    ):
        for index, node in enumerate(blocked):
            await create_machine(
                custom, namespace, f"f{index}", node=node, phase="Failed", annotations={v.PRESERVE_ANNOTATION: "now"}
            )
        await eventually_async(lambda: _all_tainted(api, blocked))
        await core.patch_node(healthy, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "now"}}})
        # Without the drain limit both workers would sit in the drains and c would wait for one to end.
        await eventually_async(lambda: _preserved(api, namespace, "c"))
        for index in range(2):
            machine = await machine_model(api, namespace, f"f{index}")
            record = machine.preservation if machine is not None else None
            assert record is not None
            assert record.drain is None, "no drain outcome is recorded yet"

        async def both_draining() -> bool:
            conditions = [(await node_model(api, node)).preserved_condition for node in blocked]
            return all(c is not None and c.message.startswith(v.DRAINING_MESSAGE) for c in conditions)

        await eventually_async(both_draining)
    for index in range(2):
        pod = await core.read_namespaced_pod(f"guarded-{index}", namespace)
        assert pod.metadata.deletion_timestamp is None, "the PDB, not a pod's grace period, blocked the drain"


async def _all_tainted(api: client.ApiClient, nodes: list[str]) -> bool:
    models = [await node_model(api, n) for n in nodes]
    return all(n.has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT) for n in models)
