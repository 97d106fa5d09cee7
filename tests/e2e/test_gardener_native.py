"""The Gardener extension with native preservation decided per shoot, on real parts: one seed carrying MCM v0.62.1's
CRDs (gardenlet applies MCM's CRDs seed-wide, so a seed where some shoots still run v0.61 has the new ones), shoot
`a` running real MCM v0.62.1 and shoot `b` real MCM v0.61.3, each with its own kube-apiserver and
gardener-resource-manager, and MCM's Deployment object in each shoot namespace with the image of its version (what
the extension and the webhook read; only the object, MCM runs as local processes). One installation serves both.

- Both Extensions get Ready; the extension decides per shoot from MCM's image: native for `a` (it says so in its
  log and in `a`'s ControlPlaneHealthy message), not for `b`.
- A `when-failed` failure in each shoot: in `a` MCM preserves the Failed machine itself (its expiry in
  `status.currentStatus.preserveExpiryTime`) and the extension only observes: not one write of its identity to
  MCM's objects in `a`, no record, no taint. In `b` the extension preserves (record annotations, taint).
- MCM v0.61.3 runs on v0.62.1's CRDs, but its status updates drop the v0.62 status fields the extension mirrors
  its preservation to; the extension writes them again, once per such update: it settles, no fight.
- MCM of `b` is upgraded to v0.62.1 (its Deployment's image rolled, the old MCM stopped, the new one started):
  the extension notices on its next look at MCM (`--mcm-recheck-period`, short here) and hands `b`'s running
  preservation over to MCM (our expiry where MCM reads it, our taint and record gone) without restarting: the
  same process, `b`'s Extension stays Ready and now says native, `a`'s lifecycle is not restarted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.localcluster import gardener
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import (
    MCM_IMAGE,
    MCM_SERVICE_ACCOUNT,
    Installation,
    Shoot,
    annotate_machine,
    annotate_node,
    installation,
    machine,
    new_shoot,
    node,
    preserved,
    preserved_until,
    ready,
    served,
    tainted,
)
from machine_preservation.localcluster.mcm_pool import (
    GROUP,
    POOL_LABEL,
    VERSION,
    create_pool,
    machine_phase,
    wait_for_pool,
)
from machine_preservation.localcluster.toolchain import Toolchain
from tests.e2e.gardener_harness import AuditedWrite, fail_node, machine_writes, preserve_expiry, record_of, upgrade_mcm
from tests.polling import eventually_async

OLD, NEW = "v0.61.3", "v0.62.1"
# The seed carries v0.62.1's CRDs; shoot b's MCM v0.61.3 runs against them.
pytestmark = pytest.mark.parametrize("mcm_version", [NEW], indirect=True)

POOL = "worker1"
RECHECK_PERIOD = "2s"
NATIVE_MESSAGE = "MCM preserves natively"


def removes_record(body: Any) -> bool:
    """Whether a merge patch removes our record (its `preserved-until`)."""
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    return v.PRESERVED_UNTIL_ANNOTATION in annotations and annotations[v.PRESERVED_UNTIL_ANNOTATION] is None


async def test_native_preservation_is_decided_per_shoot_and_follows_an_upgrade(
    mcm_plane: ControlPlane, seed: client.ApiClient, toolchain: Toolchain, tmp_path: Path
) -> None:
    async with (
        installation(
            mcm_plane,
            seed,
            toolchain,
            tmp_path / "installation",
            extra_extension_args=[f"--mcm-recheck-period={RECHECK_PERIOD}"],
        ) as installed,
        new_shoot(
            mcm_plane,
            seed,
            tmp_path / "a",
            workers=[gardener.worker(POOL, maximum=2)],
            mcm_version=NEW,
            mcm_deployment=True,
        ) as a,
        new_shoot(
            mcm_plane,
            seed,
            tmp_path / "b",
            workers=[gardener.worker(POOL, maximum=2, machine_preserve_timeout="2h")],
            mcm_version=OLD,
            mcm_deployment=True,
        ) as b,
    ):
        try:
            await _scenario(mcm_plane, seed, installed, a, b)
        except BaseException:
            print(installed.log_tail(80))
            for shoot in (a, b):
                print(f"MCM {shoot.mcm.version} of {shoot.namespace}:\n{shoot.mcm.log_tail(40)}")
            raise


async def _scenario(plane: ControlPlane, seed: client.ApiClient, installed: Installation, a: Shoot, b: Shoot) -> None:
    started = time.monotonic()

    def progress(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}")

    # Enable: both Extensions Ready, each shoot served, on its own verdict.
    for shoot in (a, b):
        await gardener.apply_extension(seed, shoot.namespace)
    for shoot in (a, b):
        await ready(seed, shoot.namespace, limit=30)

    async def served_message(shoot: Shoot) -> str | None:
        found = await served(seed, shoot.namespace)
        return str(found.get("message")) if found else None

    messages = {
        shoot.namespace: await eventually_async(lambda s=shoot: served_message(s), limit=30)  # type: ignore[misc]
        for shoot in (a, b)
    }
    assert NATIVE_MESSAGE in messages[a.namespace], messages
    assert NATIVE_MESSAGE not in messages[b.namespace], messages
    log = installed.extension_log()
    assert f"{a.namespace}: MCM native preservation: on (MCM's image {MCM_IMAGE}:{NEW} is {NEW})" in log
    assert f"{b.namespace}: MCM native preservation: off (MCM's image {MCM_IMAGE}:{OLD} is {OLD})" in log
    progress(f"both Extensions Ready; ControlPlaneHealthy: {messages}")

    # One machine in each shoot, its node in the shoot's own API server.
    for shoot in (a, b):
        await create_pool(
            seed,
            shoot.namespace,
            POOL,
            replicas=1,
            machine_deployment_labels={POOL_LABEL: POOL},
            node_labels={POOL_LABEL: POOL},
        )
    victims = {}
    for shoot in (a, b):
        [found] = await wait_for_pool(seed, shoot.namespace, POOL, 1, target=shoot.api)
        victims[shoot.namespace] = found["metadata"]["name"]
    progress("a machine running in each shoot")

    # A `when-failed` failure in each shoot at once. In a on the Machine: MCM v0.62.1 looks at a machine whose
    # phase changed only when the Machine carries the annotation (one on the Node alone is acted on at MCM's next
    # look at the machine, minutes later unless the Node changes again).
    await annotate_machine(seed, a, victims[a.namespace], "when-failed")
    await annotate_node(b, victims[b.namespace], "when-failed")
    await asyncio.gather(*(fail_node(seed, shoot, victims[shoot.namespace]) for shoot in (a, b)))
    progress("both machines Failed")

    # Shoot a: MCM v0.62.1 preserves it; the extension only observes.
    async def preserved_by_mcm() -> dt.datetime | None:
        name = victims[a.namespace]
        found = await machine(seed, a.namespace, name)
        expiry = preserve_expiry(found)
        if machine_phase(found or {}) != "Failed" or expiry is None:
            return None
        conditions = ((await node(a, name) or {}).get("status") or {}).get("conditions") or []
        return expiry if any(c.get("type") == "Preserved" and c.get("status") == "True" for c in conditions) else None

    mcm_expiry = await eventually_async(preserved_by_mcm, limit=60, interval=0.25)
    progress(f"a: {victims[a.namespace]} Failed, preserved by MCM until {mcm_expiry}")

    # Shoot b: the extension preserves it (its record, its taint), with the Shoot's pool timeout.
    record = await eventually_async(lambda: preserved(seed, b, victims[b.namespace]), limit=60, interval=0.25)
    ours = preserved_until(record)
    progress(f"b: {victims[b.namespace]} Failed, preserved by the extension until {ours}")

    found_a = await machine(seed, a.namespace, victims[a.namespace])
    assert record_of(found_a) == {}, found_a
    assert not tainted(await node(a, victims[a.namespace]))
    assert machine_writes(plane, user=installed.extension_user, namespace=a.namespace) == []
    assert machine_writes(plane, user=installed.extension_user, namespace=b.namespace)

    # MCM v0.61.3 runs on v0.62.1's CRDs; they keep the status fields the extension mirrors its preservations to
    # (the expiry, the counters), which v0.61.3 does not know: each of its status updates drops them and the
    # extension writes them again, but only in answer to those updates.
    mcm_user = f"system:serviceaccount:{b.namespace}:{MCM_SERVICE_ACCOUNT}"

    def status_writes(user: str) -> list[AuditedWrite]:
        return [
            w
            for w in machine_writes(plane, user=user, namespace=b.namespace)
            if w.resource.endswith("/status") and w.code == 200
        ]

    # The window opens once the start's mirrors are written (the Machine's expiry, the MachineSet's and the
    # MachineDeployment's preservedFailedReplicas): on a busy machine they may still be on their way, and they answer
    # no update of MCM's.
    async def mirrored() -> bool:
        if preserve_expiry(await machine(seed, b.namespace, victims[b.namespace])) is None:
            return False
        for plural in ("machinesets", "machinedeployments"):
            listed = await client.CustomObjectsApi(seed).list_namespaced_custom_object(
                GROUP, VERSION, b.namespace, plural
            )
            if any((item.get("status") or {}).get("preservedFailedReplicas") != 1 for item in listed["items"]):
                return False
        return True

    await eventually_async(mirrored, limit=60, interval=0.25)
    before = {user: len(status_writes(user)) for user in (installed.extension_user, mcm_user)}
    await asyncio.sleep(5)
    window = {user: status_writes(user)[before[user] :] for user in before}
    print(
        f"b under MCM {OLD} for 5 s: MCM's status updates {len(window[mcm_user])}, "
        f"the extension's status patches {len(window[installed.extension_user])}"
    )
    # No loop: our writes answer MCM's updates (one of MCM's may drop what we mirror on more than one object, and a
    # write may already be under way), they do not feed each other; a loop would write dozens of times in 5 s.
    assert len(window[installed.extension_user]) <= 2 * len(window[mcm_user]) + 2, window
    # An update of MCM's may just have dropped the expiry, and our answer be on its way.
    await eventually_async(mirrored, limit=10, interval=0.25)

    # --- MCM of shoot b upgraded to v0.62.1: handed over, without a restart ------------------------------------
    pid = installed.extension.pid
    await upgrade_mcm(seed, b, NEW)
    upgraded = time.monotonic()
    progress(f"b: MCM {NEW} running, its Deployment's image {NEW}")

    async def handed_over() -> dict[str, Any] | None:
        found = await machine(seed, b.namespace, victims[b.namespace])
        if found is None or record_of(found) or preserve_expiry(found) is None:
            return None
        if tainted(await node(b, victims[b.namespace])):
            return None
        return found

    found_b = await eventually_async(handed_over, limit=60, interval=0.25)
    progress(f"b: handed over {time.monotonic() - upgraded:.1f} s after the upgrade")
    expiry_b = preserve_expiry(found_b)
    assert expiry_b is not None
    assert abs(expiry_b - ours) <= dt.timedelta(seconds=1), (expiry_b, ours)  # the same preservation, carried on
    assert machine_phase(found_b) == "Failed"
    log = installed.extension_log()
    assert f"{b.namespace}: MCM native preservation is now on" in log
    assert f"{b.namespace}: MCM native preservation: on (MCM's image {MCM_IMAGE}:{NEW} is {NEW})" in log
    # Only b's lifecycle restarted: a's decided once.
    assert log.count(f"{a.namespace}: MCM native preservation: on") == 1

    # The same extension process, b's Extension Ready and now native.
    assert installed.extension.poll() is None
    assert installed.extension.pid == pid

    async def native_b() -> str | None:
        message = await served_message(b)
        return message if message is not None and NATIVE_MESSAGE in message else None

    await eventually_async(native_b, limit=30)
    await ready(seed, b.namespace, limit=10)
    await ready(seed, a.namespace, limit=10)

    # From here on the extension only observes b as well; MCM keeps the machine. Counted from the hand-over's last
    # write to the machine (the record's removal) as the seed's audit log has it: the log takes a write in once it is
    # answered, which on a busy machine may be after the machine shows it.
    def hand_over_written() -> int | None:
        writes = machine_writes(plane, user=installed.extension_user, namespace=b.namespace)
        return len(writes) if any(w.code == 200 and removes_record(w.body) for w in writes) else None

    handed = await eventually_async(hand_over_written, limit=30)
    await asyncio.sleep(3)  # a window for what must not happen: a fight would write within it
    later = machine_writes(plane, user=installed.extension_user, namespace=b.namespace)[handed:]
    assert later == [], later
    found_b = await machine(seed, b.namespace, victims[b.namespace])
    assert found_b is not None
    assert found_b["metadata"].get("deletionTimestamp") is None
    assert preserve_expiry(found_b) == expiry_b
    progress("done")
