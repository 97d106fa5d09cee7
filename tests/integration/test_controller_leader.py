"""Leader election on a real Lease, hand-over between controllers, graceful shutdown (in process and
through the CLI with SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.leader import LeaderElector
from machine_preservation.controller.standalone import LEASE_NAME
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Node
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from tests.controller.running import chart_identity, running_controller
from tests.controller.support import create_machine, create_node, is_preserved, machine_model, read_node_model
from tests.polling import eventually_async

# Renewed every second; a leader steps down only after 10 s without a renewal, so a busy machine (a renewal answered
# seconds late) does not end a leadership the test expects to last. Hand-overs come from releases, never from waiting
# out a lease, so the tests do not wait for its 15 s.
FAST_LEASE = {"lease_duration": 15, "renew_deadline": 10.0, "retry_period": 1.0}


async def holder(api: client.ApiClient, namespace: str, name: str = LEASE_NAME) -> str | None:
    try:
        lease = await client.CoordinationV1Api(api).read_namespaced_lease(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return lease.spec.holder_identity if lease.spec else None


async def preserved(api: client.ApiClient, namespace: str, name: str) -> bool:
    return is_preserved(await machine_model(api, namespace, name))


async def test_two_electors_one_wins_and_release_hands_over(api: client.ApiClient, namespace: str) -> None:
    electors = [
        LeaderElector(api_client=api, namespace=namespace, name="lease", identity=f"e{i}", **FAST_LEASE)
        for i in range(2)
    ]
    tasks = [asyncio.create_task(e.run()) for e in electors]
    try:
        await eventually_async(lambda: any(e.leading.is_set() for e in electors))
        winner = next(e for e in electors if e.leading.is_set())
        loser = next(e for e in electors if e is not winner)
        # Renewals keep the winner in place: three of them seen, the loser waiting throughout.
        renewals: set[dt.datetime] = set()
        async with asyncio.timeout(60):
            while len(renewals) <= 3:  # the renewal first seen, then three more
                lease = (await client.CoordinationV1Api(api).read_namespaced_lease("lease", namespace)).spec
                assert not loser.leading.is_set()
                assert lease.holder_identity == winner.identity
                renewals.add(lease.renew_time)
                await asyncio.sleep(0.2)

        tasks[electors.index(winner)].cancel()
        assert await winner.release()
        assert not await winner.release(), "only the holder can release"
        await eventually_async(lambda: loser.leading.is_set(), limit=15)
        assert await holder(api, namespace, "lease") == loser.identity
        assert not winner.lost.is_set()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_lease_records_utc_times_and_counts_transitions_whatever_the_local_time_zone(
    api: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: the library's local-time stamps would be 14 h off
    time.tzset()
    coordination = client.CoordinationV1Api(api)
    electors = [
        LeaderElector(api_client=api, namespace=namespace, name="tz", identity=f"e{i}", **FAST_LEASE) for i in range(2)
    ]
    first = asyncio.create_task(electors[0].run())
    second: asyncio.Task[None] | None = None
    try:
        await eventually_async(lambda: electors[0].leading.is_set())

        async def renewed() -> Any:
            """The Lease once renewed at least once."""
            found = (await coordination.read_namespaced_lease("tz", namespace)).spec
            return found if found.renew_time > found.acquire_time else None

        lease = await eventually_async(renewed, limit=30, interval=0.2)
        now = dt.datetime.now(dt.UTC)
        assert abs((now - lease.renew_time).total_seconds()) < 5, (lease.renew_time, now)
        assert abs((now - lease.acquire_time).total_seconds()) < 10, (lease.acquire_time, now)
        assert lease.acquire_time < lease.renew_time, "renewals keep the acquire time"
        assert lease.lease_transitions == 0

        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert await electors[0].release()
        second = asyncio.create_task(electors[1].run())
        await eventually_async(lambda: electors[1].leading.is_set(), limit=15)
        lease = (await coordination.read_namespaced_lease("tz", namespace)).spec
        assert (lease.holder_identity, lease.lease_transitions) == ("e1", 1)
        assert abs((dt.datetime.now(dt.UTC) - lease.acquire_time).total_seconds()) < 5
    finally:
        for task in (first, second):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        monkeypatch.undo()
        time.tzset()


async def test_a_follower_does_not_reconcile_until_the_leader_shuts_down(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    options = {"leader_elect": True, **FAST_LEASE}
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, identity="first", **options
    ) as first:
        await eventually_async(lambda: _holds(api, namespace, "first"))
        async with running_controller(
            kubeconfig=control_plane.kubeconfig, namespace=namespace, identity="second", **options
        ) as second:
            await create_machine(custom, namespace, "a", annotations={v.PRESERVE_ANNOTATION: "now"})
            await eventually_async(lambda: preserved(api, namespace, "a"))
            assert second.controller.caches is not None
            assert not second.controller.caches.machines.synced, "a follower does not even watch"
            assert second.controller.ready(), "a standby is ready: it must not block a rollout"
            assert not second.controller.leading

            assert await first.shutdown() == 0
            assert await holder(api, namespace) in (None, "second"), "the leader released its lease"
            await eventually_async(lambda: _holds(api, namespace, "second"), limit=15)
            await create_machine(custom, namespace, "b", annotations={v.PRESERVE_ANNOTATION: "now"})
            await eventually_async(lambda: preserved(api, namespace, "b"))
            assert await second.shutdown() == 0
    assert await holder(api, namespace) is None


async def test_shutdown_finishes_the_reconcile_in_flight(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    core, custom, policy = client.CoreV1Api(api), client.CustomObjectsApi(api), client.PolicyV1Api(api)
    node = f"n-{uuid.uuid4().hex[:8]}"
    await create_node(core, node, ready=False)
    try:
        await core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/none"}]},
            },
        )
        await policy.create_namespaced_pod_disruption_budget(
            namespace,
            {"metadata": {"name": "g"}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}},
        )
        async with running_controller(
            kubeconfig=control_plane.kubeconfig,
            namespace=namespace,
            leader_elect=True,
            max_drain_attempt=dt.timedelta(seconds=4),
            **FAST_LEASE,
        ) as running:
            await create_machine(
                custom, namespace, "m", node=node, phase="Failed", annotations={v.PRESERVE_ANNOTATION: "now"}
            )
            # The drain is under way (taint written, eviction refused by the PDB) when the stop comes.
            await eventually_async(lambda: _tainted(api, node))
            assert await running.shutdown() == 0
        machine = await machine_model(api, namespace, "m")
        record = machine.preservation if machine is not None else None
        assert record is not None
        assert record.drain is not None, "the in-flight drain finished and recorded its outcome before exit"
        assert record.drain.outcome == v.DrainOutcome.FAILED
        condition = (await _node(api, node)).preserved_condition
        assert condition is not None
        assert condition.message.startswith(v.DRAIN_FAILED_MESSAGE)
        assert f"{namespace}/guarded" in condition.message
        assert await holder(api, namespace) is None
    finally:
        await core.delete_node(node)


async def test_the_cli_runs_until_sigterm_and_exits_cleanly(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    identity = await chart_identity(control_plane.kubeconfig, namespace, leader_election=True)
    log = (tmp_path / "controller.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "machine_preservation.cli",
        "controller",
        f"--control-kubeconfig={identity}",
        f"--target-kubeconfig={identity}",
        f"--namespace={namespace}",
        f"--metrics-port={port}",
        "--machine-preserve-timeout=1h",
        "--mcm-native-preservation=false",  # the test CRDs carry v0.62's fields, which `auto` reads as native
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "POD_NAME": "cli-test"},
    )
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                        return response.status == 200
                return False

            await eventually_async(ready, limit=60)
        await create_machine(client.CustomObjectsApi(api), namespace, "m", annotations={v.PRESERVE_ANNOTATION: "now"})
        await eventually_async(lambda: preserved(api, namespace, "m"))
        lease_holder = await holder(api, namespace)
        assert lease_holder is not None
        assert lease_holder.startswith("cli-test_")
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
        assert code == 0, (tmp_path / "controller.log").read_text()
        assert await holder(api, namespace) is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log.close()


async def _holds(api: client.ApiClient, namespace: str, identity: str) -> bool:
    return await holder(api, namespace) == identity


async def _node(api: client.ApiClient, name: str) -> Node:
    return await read_node_model(client.CoreV1Api(api), name)


async def _tainted(api: client.ApiClient, name: str) -> bool:
    return (await _node(api, name)).has_taint(v.PRESERVED_TAINT_KEY, v.PRESERVED_TAINT_EFFECT)


async def test_losing_the_lease_ends_the_controller_with_an_error_and_leaves_the_new_holder_alone(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    async with running_controller(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, leader_elect=True, identity="victim", **FAST_LEASE
    ) as running:
        await eventually_async(lambda: _holds(api, namespace, "victim"))
        coordination = client.CoordinationV1Api(api)

        async def steal() -> bool:
            """Take the Lease over; False when the victim renewed it in between (409), to try again."""
            lease = await coordination.read_namespaced_lease(LEASE_NAME, namespace)
            assert lease.spec is not None
            lease.spec.holder_identity = "thief"
            lease.spec.lease_duration_seconds = 60
            try:
                await coordination.replace_namespaced_lease(LEASE_NAME, namespace, lease)
            except ApiException as error:
                if error.status != 409:
                    raise
                return False
            return True

        await eventually_async(steal)
        code = await asyncio.wait_for(running.task, 30)
    assert code == 1, "crash-only: a controller that lost its lease exits instead of reconciling on"
    assert await holder(api, namespace) == "thief"
