"""What the controller makes of MCM's CRDs, against the real apiserver. MCM v0.61.3's CRDs prune
`status.currentStatus.preserveExpiryTime` (and the MachineSet's preservation fields): the controller starts on
them, mirrors nothing into status and keeps each preservation's record in the Machine's annotations, and a
preservation still ends at its expiry, once. Where the CRD keeps the field, the expiry is mirrored there, capped
like the record's. A controller that cannot read the CRDs does not start."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.preservation.crd_check import (
    AUTO_MAX_PATH,
    EXPIRY_PATH,
    MACHINE_CRD,
    ControlFactsCache,
    CrdFacts,
    check_machine_crd,
    inspect_crds,
    keeps,
)
from machine_preservation.core import vocabulary as v
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.crds import crd_manifests
from tests.controller.running import running_controller
from tests.controller.support import (
    GROUP,
    VERSION,
    create_machine,
    events_about,
    get_machine,
    is_preserved,
    machine_model,
    new_node,
    read_node_model,
    read_raw,
)
from tests.polling import eventually_async

OTHER_GROUP = "prune-check.machine-preservation.test"
MERGE = "application/merge-patch+json"
P = v.PRESERVE_ANNOTATION
MCM_CRDS = (MACHINE_CRD, f"machinesets.{GROUP}", f"machinedeployments.{GROUP}")
# What MCM v0.61.3's CRDs lack of ours (v0.62's): per CRD, (path to an object schema, property).
V062_ONLY: dict[str, list[tuple[tuple[str, ...], str]]] = {
    MCM_CRDS[0]: [(("status", "currentStatus"), "preserveExpiryTime")],
    MCM_CRDS[1]: [
        (("spec",), "autoPreserveFailedMachineMax"),
        (("status",), "autoPreserveFailedMachineCount"),
        (("status",), "preservedFailedReplicas"),
    ],
    MCM_CRDS[2]: [(("spec",), "autoPreserveFailedMachineMax"), (("status",), "preservedFailedReplicas")],
}
FAR = "2030-01-01T00:00:00Z"


def as_v061(crd: dict[str, Any]) -> dict[str, Any]:
    """The CRD without v0.62's preservation fields: they are pruned, as v0.61.3's CRDs prune them."""
    pruned = copy.deepcopy(crd)
    for version in pruned["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for path, field in V062_ONLY[crd["metadata"]["name"]]:
            node = schema
            for key in path:
                node = node["properties"][key]
            del node["properties"][field]
            node.pop("x-kubernetes-preserve-unknown-fields", None)  # else the field would be kept anyway
        columns = version.get("additionalPrinterColumns") or []
        version["additionalPrinterColumns"] = [
            c for c in columns if not any(field in c["jsonPath"] for _, field in V062_ONLY[crd["metadata"]["name"]])
        ]
    return pruned


async def replace_crd(extensions: client.ApiextensionsV1Api, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    current = await read_raw(extensions.read_custom_resource_definition_without_preload_content(name))
    body = {**crd, "metadata": {"name": name, "resourceVersion": current["metadata"]["resourceVersion"]}}
    await extensions.replace_custom_resource_definition(name, body)


async def expiry_kept(api: client.ApiClient, namespace: str, probe: str) -> bool | None:
    """Whether a status write of `preserveExpiryTime` on Machine `probe` keeps it (None: the apiserver cannot
    serve Machines right now, as while a CRD's storage is set up again)."""
    status = {"status": {"currentStatus": {"preserveExpiryTime": FAR}}}
    try:
        written = await client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "machines", probe, status, _content_type=MERGE
        )
    except ApiException as error:
        if error.status in (429, 503):
            return None
        raise
    return "preserveExpiryTime" in written["status"]["currentStatus"]


@pytest.fixture
async def crds_like_v061(api: client.ApiClient, namespace: str) -> AsyncIterator[None]:
    """MCM's Machine kinds served as MCM v0.61.3 serves them for the test's duration, then as before. The
    session shares these CRDs, so the test waits until the apiserver enforces each schema."""
    extensions = client.ApiextensionsV1Api(api)
    originals = {}
    for name in MCM_CRDS:
        raw = await read_raw(extensions.read_custom_resource_definition_without_preload_content(name))
        originals[name] = {"apiVersion": raw["apiVersion"], "kind": raw["kind"], "spec": raw["spec"]}
        originals[name]["metadata"] = {"name": name}
    await create_machine(client.CustomObjectsApi(api), namespace, "probe")
    try:
        for crd in originals.values():
            await replace_crd(extensions, as_v061(crd))
        await eventually_async(lambda: _is(expiry_kept(api, namespace, "probe"), False), limit=60)
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "machines", "probe"
        )
        yield
    finally:
        for crd in originals.values():
            await replace_crd(extensions, crd)
        await create_machine(client.CustomObjectsApi(api), namespace, "probe-after")
        await eventually_async(lambda: _is(expiry_kept(api, namespace, "probe-after"), True), limit=60)


async def _is(result: Any, expected: bool) -> bool:
    return await result is expected


@pytest.fixture
async def other_group_pruning_crd(api: client.ApiClient) -> AsyncIterator[str]:
    """A copy of our Machine CRD in another group, as v0.61.3's (nothing else in the session sees it)."""
    crd = next(m for m in crd_manifests() if m["metadata"]["name"] == MACHINE_CRD)
    crd = as_v061(crd)
    name = f"machines.{OTHER_GROUP}"
    crd["metadata"] = {"name": name}
    crd["spec"]["group"] = OTHER_GROUP
    extensions = client.ApiextensionsV1Api(api)
    await extensions.create_custom_resource_definition(crd)  # type: ignore[arg-type]

    async def established() -> bool:
        current = await extensions.read_custom_resource_definition(name)
        conditions = (current.status.conditions if current.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await eventually_async(established)
    yield name
    await extensions.delete_custom_resource_definition(name)


def status_writes(metrics: Metrics) -> float:
    """Successful writes to Machines' status subresource so far."""
    return sum(
        sample.value
        for metric in metrics.api_requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
        and sample.labels.get("resource") == "machines/status"
        and sample.labels.get("verb") in ("patch", "update")
    )


# --- what the CRDs keep ---------------------------------------------------------------------------------------


async def test_the_installed_crds_keep_the_preservation_fields(api: client.ApiClient) -> None:
    assert await inspect_crds(api) == CrdFacts(machine_keeps_expiry=True, machine_set_keeps_auto_max=True)


async def test_the_seeds_crds_are_read_once_per_period_for_every_shoot(api: client.ApiClient) -> None:
    now = [0.0]
    cache = ControlFactsCache(api, max_age=60.0, clock=lambda: now[0])
    together = await asyncio.gather(*(cache.get() for _ in range(20)))  # 20 shoots starting at once
    assert all(facts is together[0] for facts in together), "one read, shared by all"
    assert together[0].crds == CrdFacts(machine_keeps_expiry=True, machine_set_keeps_auto_max=True)
    now[0] = 59.0
    assert await cache.get() is together[0], "still fresh"
    now[0] = 60.0
    again = await cache.get()
    assert again is not together[0], "read again once the period is over"
    assert again == together[0]


async def test_a_crd_like_v061s_really_prunes_the_expiry_and_is_accepted(
    api: client.ApiClient, namespace: str, other_group_pruning_crd: str
) -> None:
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{OTHER_GROUP}/v1alpha1", "kind": "Machine", "metadata": {"name": "m"}, "spec": {}}
    await custom.create_namespaced_custom_object(OTHER_GROUP, "v1alpha1", namespace, "machines", body)
    status = {"status": {"currentStatus": {"phase": "Failed", "preserveExpiryTime": FAR}}}
    written = await custom.patch_namespaced_custom_object_status(
        OTHER_GROUP, "v1alpha1", namespace, "machines", "m", status, _content_type=MERGE
    )
    assert isinstance(written, dict)
    assert written["status"]["currentStatus"] == {"phase": "Failed"}, "the apiserver pruned the expiry"

    crd = await read_raw(
        client.ApiextensionsV1Api(api).read_custom_resource_definition_without_preload_content(other_group_pruning_crd)
    )
    assert check_machine_crd(crd) is False, "usable, and said to prune the expiry"
    assert not keeps(crd, EXPIRY_PATH)


async def test_crds_like_v061s_are_read_as_pruning(api: client.ApiClient, crds_like_v061: None) -> None:
    assert await inspect_crds(api) == CrdFacts(machine_keeps_expiry=False, machine_set_keeps_auto_max=False)
    machine_set = await read_raw(
        client.ApiextensionsV1Api(api).read_custom_resource_definition_without_preload_content(MCM_CRDS[1])
    )
    assert not keeps(machine_set, AUTO_MAX_PATH)


# --- the controller on either ------------------------------------------------------------------------------


async def test_on_v061s_crds_the_controller_starts_preserves_in_annotations_and_ends_at_expiry_once(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    node_names: list[str],
    crds_like_v061: None,
) -> None:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    kept_node, short_node = await new_node(api, node_names, ready=True), await new_node(api, node_names, ready=True)
    await create_machine(custom, namespace, "kept", node=kept_node, annotations={P: "now"})
    await create_machine(
        custom, namespace, "short", node=short_node, annotations={P: "now"}, spec={"machinePreserveTimeout": "4s"}
    )
    async with running_controller(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        resync_period=0.5,
        native_preservation=NativePreservationMode.AUTO,  # the CRDs say v0.61: not native
    ) as running:
        controller = running.controller
        assert not controller.native
        assert not controller.preservation.mirror_status

        async def kept_preserved() -> bool:
            machine, node = await machine_model(api, namespace, "kept"), await read_node_model(core, kept_node)
            condition = node.preserved_condition
            return bool(
                machine is not None
                and machine.preservation is not None
                and condition is not None
                and condition.status == "True"
                and node.metadata.annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == "true"
            )

        await eventually_async(kept_preserved)

        async def short_expired() -> bool:
            machine = await machine_model(api, namespace, "short")
            reasons = {e.reason for e in await events_about(api, namespace, "Machine", "short")}
            return machine is not None and machine.preservation is None and "PreservationExpired" in reasons

        await eventually_async(short_expired, limit=60)
        caches = controller.caches
        assert caches is not None
        resyncs = caches.machines.stats.resyncs
        await eventually_async(lambda: caches.machines.stats.resyncs >= resyncs + 3)

        kept = await machine_model(api, namespace, "kept")
        assert kept is not None
        record = kept.preservation
        assert record is not None
        assert (record.by, record.until - record.since) == (v.PreservedBy.USER, dt.timedelta(hours=72))
        raw = await get_machine(custom, namespace, "kept")
        assert "preserveExpiryTime" not in raw["status"]["currentStatus"], "nothing is mirrored where it is pruned"
        short = await machine_model(api, namespace, "short")
        assert short is not None
        assert short.preservation is None, "not preserved again after its expiry"
        assert P not in short.metadata.annotations, "the preserve annotation goes at expiry"
        assert status_writes(controller.metrics) == 0, "no status write is attempted where the CRD prunes the expiry"
    for kind, name in (("Machine", "short"), ("Node", short_node)):
        events = [e for e in await events_about(api, namespace, kind, name) if (e.reason or "").startswith("Pres")]
        # One preservation, started once and expired once: a stop never turned into a new start.
        assert sorted((e.reason, e.count) for e in events) == [
            ("PreservationExpired", 1),
            ("PreservationStarted", 1),
        ], (kind, [(e.reason, e.count, e.message) for e in events])


async def test_where_the_crd_keeps_it_the_mirror_shows_the_capped_expiry(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, node_names: list[str]
) -> None:
    node = await new_node(api, node_names, ready=True)
    await create_machine(
        client.CustomObjectsApi(api),
        namespace,
        "m",
        node=node,
        annotations={P: "now"},
        spec={"machinePreserveTimeout": "100h"},
    )
    max_timeout = dt.timedelta(hours=1)
    async with running_controller(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        preservation=PreservationConfig(max_preserve_timeout=max_timeout),
    ) as running:
        assert running.controller.preservation.mirror_status
        await eventually_async(lambda: _preserved(api, namespace, max_timeout))
        machine = await machine_model(api, namespace, "m")
        assert machine is not None
        record = machine.preservation
        assert record is not None
        assert record.until == record.since + max_timeout, "100h asked, the maximum (1h) granted"
        assert machine.mirrored_expiry == record.since + max_timeout


async def _preserved(api: client.ApiClient, namespace: str, max_timeout: dt.timedelta) -> bool:
    return is_preserved(await machine_model(api, namespace, "m"), max_timeout=max_timeout)


async def test_the_cli_refuses_to_start_when_it_cannot_read_the_crds(kubeconfig_for: Any, namespace: str) -> None:
    # An identity that may not read CRDs: what they keep cannot be told, so the controller must not run.
    kubeconfig = kubeconfig_for("nobody")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "machine_preservation.cli",
        "controller",
        f"--control-kubeconfig={kubeconfig}",
        f"--target-kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--metrics-port=0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "error: Cannot read the Machine CRD machines.machine.sapcloud.io: HTTP 403" in stderr.decode()
