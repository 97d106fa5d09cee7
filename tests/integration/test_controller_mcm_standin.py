"""The controller with the MCM stand-in (machine_preservation.standin) on the real control plane: a
preserved machine that fails is kept, tainted, drained and ranked last for scale-down while MCM replaces
nothing; when preservation is turned off the controller ends it and MCM replaces the machine."""

from __future__ import annotations

from kubernetes.aio import client

from machine_preservation.cluster.controlplane import ControlPlane
from machine_preservation.core import vocabulary as v
from machine_preservation.standin.mcm import McmStandIn, set_node_ready
from tests.controller.running import running_controller
from tests.controller.support import GROUP, VERSION, eventually, is_preserved, machines_of, read_node_model


async def create_machine_set(api: client.ApiClient, namespace: str, replicas: int) -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "machinesets",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "MachineSet",
            "metadata": {"name": "ms"},
            "spec": {"replicas": replicas, "template": {"spec": {"class": {"kind": "C", "name": "c"}}}},
        },
    )


async def test_a_preserved_machine_that_fails_is_kept_and_drained_then_replaced_once_preservation_ends(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, standin: McmStandIn
) -> None:
    await create_machine_set(api, namespace, replicas=2)
    machines = await eventually(lambda: _running(api, namespace, 2))
    kept = sorted(machines)[0]
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace):
        await client.CoreV1Api(api).patch_node(kept, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "now"}}})
        await eventually(lambda: _preserved(api, namespace, kept))
        await set_node_ready(api, name=kept, ready=False)

        async def failed_and_drained() -> bool:
            machine = (await machines_of(api, namespace)).get(kept)
            assert machine is not None, "MCM must not delete the preserved machine"
            record = machine.preservation
            condition = (await read_node_model(client.CoreV1Api(api), kept)).preserved_condition
            return (
                machine.phase == "Failed"
                and record is not None
                and record.drain is not None
                and record.drain.outcome == v.DrainOutcome.DRAINED
                and condition is not None
                and condition.message.startswith(v.DRAINED_SUCCESSFULLY_MESSAGE)
            )

        await eventually(failed_and_drained)
        current = await machines_of(api, namespace)
        assert set(current) == set(machines), "nothing was replaced while the machine is preserved"
        assert current[kept].metadata.annotations[v.MACHINE_PRIORITY_ANNOTATION] == "5", "ceiling 3 + 2 (manual)"

        # `false`: the controller ends the preservation of the Failed machine (and deletes it); MCM replaces it.
        await client.CoreV1Api(api).patch_node(kept, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "false"}}})
        replacement = await eventually(lambda: _running(api, namespace, 2, without=kept), limit=60)
        assert kept not in replacement


async def _running(api: client.ApiClient, namespace: str, count: int, without: str = "") -> list[str]:
    machines = await machines_of(api, namespace)
    running = [name for name, m in machines.items() if m.phase == "Running"]
    if without in machines or len(running) != count:
        return []
    return running


async def _preserved(api: client.ApiClient, namespace: str, name: str) -> bool:
    return is_preserved((await machines_of(api, namespace)).get(name))
