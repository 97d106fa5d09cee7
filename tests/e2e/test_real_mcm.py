"""The harness itself, against real MCM of every version we build: a pool comes up with Nodes registered by
the fake driver, a node that stops being Ready is failed and replaced by MCM, as on a real seed, and a
restarted MCM finds its machines again (the fake cloud's VMs outlive the process)."""

from __future__ import annotations

import time

import pytest

from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import machine_node
from tests.e2e.harness import ALL_MCM_VERSIONS, RealMcm
from tests.polling import eventually_async

MCM_NODE_FINALIZER = "node.machine.sapcloud.io/machine-controller"

both_versions = pytest.mark.parametrize("mcm_version", ALL_MCM_VERSIONS, indirect=True)


@both_versions
async def test_pool_gets_running_machines_with_nodes(real_mcm: RealMcm) -> None:
    started = time.monotonic()
    await real_mcm.create_pool("pool-a", replicas=2)

    machines = await real_mcm.wait_for_pool("pool-a", 2)
    print(f"MCM {real_mcm.version}: 2 machines Running with Ready Nodes after {time.monotonic() - started:.1f}s")

    for machine in machines:
        name = machine["metadata"]["name"]
        assert machine_node(machine) == name
        assert machine["spec"]["providerID"] == f"fake:///{name}"
        node = await real_mcm.node(name)
        assert node is not None
        assert node["spec"]["providerID"] == f"fake:///{name}"
        # MCM saw the Node appear after its Machine: it guards the Node with its finalizer and copied the pool
        # label from the MachineDeployment's node template.
        assert MCM_NODE_FINALIZER in node["metadata"].get("finalizers", [])

    async def labelled() -> bool:
        nodes = [await real_mcm.node(m["metadata"]["name"]) for m in machines]
        return all(n and n["metadata"]["labels"].get("worker.gardener.cloud/pool") == "pool-a" for n in nodes)

    await eventually_async(labelled, limit=60)
    print(f"MCM {real_mcm.version}: pool label on both Nodes after {time.monotonic() - started:.1f}s")
    # MCM's identity has every permission MCM uses.
    assert "forbidden" not in real_mcm.logs().lower()


@both_versions
async def test_not_ready_node_is_failed_and_replaced(real_mcm: RealMcm) -> None:
    await real_mcm.create_pool("pool-b", replicas=2)
    machines = await real_mcm.wait_for_pool("pool-b", 2)
    victim = machines[0]["metadata"]["name"]
    survivor = machines[1]["metadata"]["name"]

    failed_at = time.monotonic()
    await real_mcm.set_node_ready(victim, False)
    replaced = await real_mcm.wait_for_pool("pool-b", 2, limit=180)

    names = {m["metadata"]["name"] for m in replaced}
    assert victim not in names
    assert survivor in names
    assert await real_mcm.node(victim) is None
    history = real_mcm.recorder.history(victim)
    assert history[-1] == "deleted"
    assert "Failed" in history
    # The healthy machine stayed Running throughout.
    after = [e for e in real_mcm.recorder.events if e.name == survivor and e.at >= failed_at]
    assert all(e.phase == "Running" and not e.deleting for e in after), after

    failed = real_mcm.recorder.first(victim, phase="Failed")
    gone = real_mcm.recorder.first(victim, event_type="DELETED")
    (replacement,) = names - {survivor}
    created = real_mcm.recorder.first(replacement)
    assert failed is not None
    assert gone is not None
    assert created is not None
    print(
        f"MCM {real_mcm.version}: NotReady -> phases {history}; Failed after {failed.at - failed_at:.1f}s, "
        f"replacement created after {created.at - failed_at:.1f}s, machine gone after {gone.at - failed_at:.1f}s, "
        f"replacement Running after {time.monotonic() - failed_at:.1f}s"
    )


@pytest.mark.parametrize("mcm_version", [DEFAULT_MCM_VERSION], indirect=True)
async def test_restart_keeps_machines(real_mcm: RealMcm) -> None:
    await real_mcm.create_pool("pool-c", replicas=1)
    (machine,) = await real_mcm.wait_for_pool("pool-c", 1)
    name = machine["metadata"]["name"]

    restarted_at = time.monotonic()
    await real_mcm.restart()

    def resynced() -> bool:
        # The new machine controller has reconciled the machine (its log since the restart names it).
        since_restart = real_mcm.runner.log("machine-controller").read_text().rsplit("=== ", 1)[-1]
        return f'reconcileClusterMachine: Stop for "{name}"' in since_restart

    await eventually_async(resynced, limit=60)
    (after,) = await real_mcm.wait_for_pool("pool-c", 1)
    assert after["metadata"]["name"] == name
    assert all(e.phase == "Running" for e in real_mcm.recorder.events if e.name == name and e.at >= restarted_at)
