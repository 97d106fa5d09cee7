"""Real MCM v0.62.1, which preserves machines itself, next to our product started with
`--mcm-native-preservation=auto`: the two never fight.

- The product decides "native" from the cluster (this plane carries v0.62.1's CRDs) and says so at start.
- MCM runs the whole lifecycle: `now` on a Node, `when-failed` on a Machine that then fails, and its own
  auto-preservation (`autoPreserveFailedMachineMax` on the MachineDeployment, the value `auto-preserved`,
  which our webhook lets MCM's identity write). Preserved Failed machines are kept, not replaced, until
  their expiry, and replaced after it (our deletion guard stands down).
- Our controller only observes: one PreservationStarted Event per preservation MCM starts, none again after a
  restart, and not one write of its identity to a Machine or a Node.
- Our webhook still judges what people write (a bad value on a Node or a Machine, a user writing the auto
  value) and still restores the CA annotation of a preserved node.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster.mcm_pool import GROUP, MERGE_PATCH, VERSION, machine_phase
from machine_preservation.localcluster.mcm_runner import McmSettings
from tests.e2e.harness import (
    RealMcm,
    annotate_machine,
    annotate_node,
    fail_machine,
    machine_annotations,
    nudge_machine,
    patch_machine_deployment,
    preserve_expiry,
    preserved_condition,
)
from tests.e2e.product import Product
from tests.polling import eventually_async

NATIVE_VERSION = "v0.62.1"
pytestmark = pytest.mark.parametrize("mcm_version", [NATIVE_VERSION], indirect=True)

# MCM's own preservation timeout: long enough for what each test looks at while machines are preserved, short
# enough to see a Failed machine replaced after its expiry.
MCM_PRESERVE_TIMEOUT = dt.timedelta(seconds=50)
STARTED = v.EventReason.PRESERVATION_STARTED.value
CA_KEY = v.CA_SCALE_DOWN_DISABLED_ANNOTATION


@pytest.fixture
def mcm_settings() -> McmSettings:
    return McmSettings(
        extra_machine_controller_args=(f"--machine-preserve-timeout={int(MCM_PRESERVE_TIMEOUT.total_seconds())}s",)
    )


_API_REQUEST = re.compile(
    r"^machine_preservation_api_requests_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$", re.MULTILINE
)


async def controller_metrics(product: Product) -> dict[tuple[str, str, str], float]:
    """The running controller's API requests so far, by (verb, resource, HTTP code), both clusters summed."""
    port = int(re.findall(r"metrics, /healthz and /readyz on http://127\.0\.0\.1:(\d+)", product.log("controller"))[-1])
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found: dict[tuple[str, str, str], float] = {}
    for match in _API_REQUEST.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        key = (labels["verb"], labels["resource"], labels["code"])
        found[key] = found.get(key, 0.0) + float(match.group("value"))
    return found


async def started_events(product: Product, kind: str, name: str) -> list[Any]:
    return [e for e in await product.events(kind=kind, name=name) if e.reason == STARTED]


async def preserved_by_mcm(real_mcm: RealMcm, name: str, *, phase: str) -> dt.datetime:
    """Wait until MCM has preserved the machine in `phase` and completed it on the node; its expiry."""

    async def check() -> dt.datetime | None:
        machine = await real_mcm.machine(name)
        node = await real_mcm.node(name)
        if machine is None or node is None or machine_phase(machine) != phase:
            return None
        expiry = preserve_expiry(machine)
        condition = preserved_condition(node)
        if expiry is None or condition is None or condition.get("status") != "True":
            return None
        if phase == "Failed" and v.DRAINED_SUCCESSFULLY_MESSAGE not in condition.get("message", ""):
            return None
        return expiry

    found: dt.datetime = await eventually_async(check, limit=90, interval=0.25)
    return found


async def test_mcm_preserves_natively_and_the_controller_only_observes(real_mcm: RealMcm, product: Product) -> None:
    started = time.monotonic()

    def progress(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}")

    await product.start(native="auto")
    assert "MCM native preservation: on (MCM's CRDs carry the preservation fields" in product.log("controller")
    assert "MCM native preservation: on" in product.log("webhook")

    await real_mcm.create_pool("native", replicas=3)
    # MCM copies the MachineDeployment's max to its MachineSet and enforces it there.
    await patch_machine_deployment(real_mcm, "native", {"spec": {"autoPreserveFailedMachineMax": 1}})
    machines = await real_mcm.wait_for_pool("native", 3)
    now_name, when_failed_name, auto_name = (m["metadata"]["name"] for m in machines)

    # `now` on a healthy machine's node.
    await annotate_node(real_mcm, now_name, {v.PRESERVE_ANNOTATION: "now"})
    now_expiry = await preserved_by_mcm(real_mcm, now_name, phase="Running")
    progress(f"{now_name} preserved by MCM (now) until {now_expiry}")
    node = await real_mcm.node(now_name)
    assert node is not None
    assert node["metadata"]["annotations"].get(CA_KEY) == "true"
    condition = preserved_condition(node)
    assert condition is not None
    assert condition["reason"] == v.ConditionReason.PRESERVED_BY_USER.value
    assert condition["message"].startswith(v.PRESERVED_UNTIL_MESSAGE_PREFIX)

    # `when-failed` on a machine that then fails, then a failure nobody asked for (auto-preserved by MCM). One
    # after the other: MCM marks one machine of a MachineDeployment Failed at a time (maxSurge 1), and counts
    # a Failed machine as being replaced until its expiry is set.
    await annotate_machine(real_mcm, when_failed_name, {v.PRESERVE_ANNOTATION: "when-failed"})
    await fail_machine(real_mcm, when_failed_name)
    when_failed_expiry = await preserved_by_mcm(real_mcm, when_failed_name, phase="Failed")
    progress(f"{when_failed_name} Failed, preserved by MCM (when-failed) until {when_failed_expiry}")
    await fail_machine(real_mcm, auto_name)
    auto_expiry = await preserved_by_mcm(real_mcm, auto_name, phase="Failed")
    progress(f"{auto_name} Failed, auto-preserved by MCM until {auto_expiry}")
    # MCM's own value, written by MCM's identity, passed our webhook.
    assert (await machine_annotations(real_mcm, auto_name)).get(v.PRESERVE_ANNOTATION) == "auto-preserved"
    auto_node = await real_mcm.node(auto_name)
    assert auto_node is not None
    auto_condition = preserved_condition(auto_node)
    assert auto_condition is not None
    assert auto_condition["reason"] == v.ConditionReason.PRESERVED_BY_MCM.value
    # v0.62.1 drains a preserved Failed node with a cordon (later MCM versions taint it instead).
    assert auto_node["spec"].get("unschedulable") is True

    # Our controller saw each preservation start, once, on the Machine and its Node.
    expiries = {now_name: now_expiry, when_failed_name: when_failed_expiry, auto_name: auto_expiry}

    async def each_started_once() -> bool:
        for name in expiries:
            for kind in ("Machine", "Node"):
                events = await started_events(product, kind, name)
                if len(events) != 1:
                    return False
                assert events[0].count == 1, events
        return True

    await eventually_async(each_started_once, limit=30, interval=0.5)

    # A restarted controller reconciles every machine again and records nothing twice: each of the six
    # Events it sees again is answered "already exists" (409), and none is created anew.
    await product.stop_controller()
    await product.start_controller()
    assert product.log("controller").count("MCM native preservation: on") == 2

    async def events_seen_again() -> bool:
        metrics = await controller_metrics(product)
        return metrics.get(("create", "events", "409"), 0) >= 2 * len(expiries)

    await eventually_async(events_seen_again, limit=30, interval=0.5)
    assert (await controller_metrics(product)).get(("create", "events", "201"), 0) == 0
    progress("controller restarted, every Event seen again, none recorded twice")
    for name in expiries:
        for kind in ("Machine", "Node"):
            events = await started_events(product, kind, name)
            assert [(e.count, e.type) for e in events] == [(1, "Normal")], (kind, name, events)

    # Nothing replaced the Failed machines while they were preserved.
    current = {m["metadata"]["name"] for m in await real_mcm.machines("native")}
    assert current == set(expiries)

    # After the expiry MCM lets them go and replaces them. MCM acts on an expiry at its next reconcile of the
    # machine (its periodic one comes every 10 minutes): an update of the Machine stands in for it.
    last_expiry = max(when_failed_expiry, auto_expiry)
    await eventually_async(
        lambda: dt.datetime.now(dt.UTC) > last_expiry + dt.timedelta(seconds=1), limit=90, interval=0.5
    )
    progress("both expiries passed, both Failed machines still there")
    for name in (when_failed_name, auto_name):
        await nudge_machine(real_mcm, name)

    async def replaced() -> list[dict[str, Any]] | None:
        # Two replacements run; the Failed machines are on their way out (MCM's termination takes ~25 s more).
        machines = await real_mcm.machines("native")
        fresh = [m for m in machines if m["metadata"]["name"] not in expiries and machine_phase(m) == "Running"]
        going = all(
            m["metadata"].get("deletionTimestamp")
            for m in machines
            if m["metadata"]["name"] in (when_failed_name, auto_name)
        )
        return fresh if len(fresh) == 2 and going else None

    replacements: list[dict[str, Any]] = await eventually_async(replaced, limit=90, interval=0.25)
    progress("both replaced")
    for replacement in replacements:
        created = dt.datetime.fromisoformat(replacement["metadata"]["creationTimestamp"])
        assert created >= min(when_failed_expiry, auto_expiry).replace(microsecond=0), (created, expiries)
    # MCM deleted each Failed machine (through our webhook, whose deletion guard stands down) after its expiry.
    deletes = {
        w.name: w.at
        for w in await product.writes_by(product.mcm_user)
        if w.kind == "Machine" and w.operation == "delete" and w.code == 200
    }
    for name in (when_failed_name, auto_name):
        assert deletes[name] >= expiries[name], (name, deletes, expiries)
    for name in (when_failed_name, auto_name):
        assert "Failed" in real_mcm.recorder.history(name)

    # Not one write of the controller's identity to MCM's objects or the Nodes, from start to end.
    assert await product.controller_writes(real_mcm.namespace) == []


async def test_the_webhook_still_judges_values_and_guards_the_ca_annotation(
    real_mcm: RealMcm, product: Product
) -> None:
    await product.start(native="auto")
    assert "MCM native preservation: on" in product.log("webhook")
    await real_mcm.create_pool("judged", replicas=1)
    (machine,) = await real_mcm.wait_for_pool("judged", 1)
    name = machine["metadata"]["name"]
    await annotate_node(real_mcm, name, {v.PRESERVE_ANNOTATION: "now"})
    await preserved_by_mcm(real_mcm, name, phase="Running")

    sre = await new_api_client(kubeconfig=product.kubeconfig_for("sre", groups=("system:masters",)))
    try:
        core = client.CoreV1Api(sre)
        custom = client.CustomObjectsApi(sre)

        async def denied(patch: Callable[[], Awaitable[object]]) -> str:
            """The message of the API server's refusal."""
            with pytest.raises(ApiException) as caught:
                await patch()
            message: str = json.loads(caught.value.body)["message"]
            assert "denied the request" in message, message
            return message

        def annotate_node_as_sre(value: str) -> Callable[[], Awaitable[object]]:
            return lambda: core.patch_node(
                name, {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}}, _content_type=MERGE_PATCH
            )

        def annotate_machine_as_sre(value: str) -> Callable[[], Awaitable[object]]:
            return lambda: custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                real_mcm.namespace,
                "machines",
                name,
                {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value}}},
                _content_type=MERGE_PATCH,
            )

        field_path = f"metadata.annotations[{v.PRESERVE_ANNOTATION}]"
        # A value nobody knows, on the Node and on the Machine: denied, naming the field and the values allowed.
        for message in (
            await denied(annotate_node_as_sre("forever")),
            await denied(annotate_machine_as_sre("forever")),
        ):
            assert f'{field_path}: Unsupported value: "forever"' in message, message
            assert all(f'"{value}"' in message for value in ("now", "when-failed", "false")), message
        # MCM's auto value from anyone but MCM (and our controller): reserved.
        message = await denied(annotate_machine_as_sre("auto-preserved"))
        assert f'{field_path}: Forbidden: the value "auto-preserved" is reserved' in message, message

        # Turning the CA annotation off on a node MCM preserves: put back to "true".
        await core.patch_node(name, {"metadata": {"annotations": {CA_KEY: "false"}}}, _content_type=MERGE_PATCH)
    finally:
        await sre.close()
    node = await real_mcm.node(name)
    assert node is not None
    assert node["metadata"]["annotations"].get(CA_KEY) == "true"
    assert v.PRESERVE_ANNOTATION not in await machine_annotations(real_mcm, name)
    assert (await real_mcm.node(name) or {})["metadata"]["annotations"][v.PRESERVE_ANNOTATION] == "now"

    assert await product.controller_writes(real_mcm.namespace) == []


async def test_mcm_deletes_a_natively_preserved_machine_whose_node_is_deleted(
    real_mcm: RealMcm, product: Product
) -> None:
    """What v0.62.1 does itself: a Node deleted under a machine MCM preserves takes the machine with it (MCM's
    `triggerMachineDeletion` does not look at the preservation). Our deletion guard stands down for MCM's own
    preservations (no record of ours) and keeps only preservations handed over from us (tests/unit)."""
    await product.start(native="auto")
    await real_mcm.create_pool("native", replicas=2)
    machines = await real_mcm.wait_for_pool("native", 2)
    victim = machines[0]["metadata"]["name"]
    await annotate_node(real_mcm, victim, {v.PRESERVE_ANNOTATION: "now"})
    expiry = await preserved_by_mcm(real_mcm, victim, phase="Running")

    await client.CoreV1Api(real_mcm.api).delete_node(victim)
    deleted_at = time.monotonic()

    async def deleting() -> bool:
        return real_mcm.recorder.first(victim, event_type="DELETED") is not None or any(
            e.deleting for e in real_mcm.recorder.events if e.name == victim
        )

    await eventually_async(deleting, limit=30, interval=0.2)
    assert dt.datetime.now(dt.UTC) < expiry, "MCM went for it long before its own expiry"
    print(f"{victim}: deleting {time.monotonic() - deleted_at:.1f} s after its Node was deleted")

    async def replaced() -> bool:
        names = {m["metadata"]["name"] for m in await real_mcm.machines("native")}
        return victim not in names and len(names) == 2

    await eventually_async(replaced, limit=120, interval=0.5)
    assert real_mcm.recorder.history(victim)[-1] == "deleted"
    # Our guard stood down: the machine carried no record of ours, and MCM's delete went through at once.
    deletes = [w for w in await product.writes_by(product.mcm_user) if w.name == victim and w.operation == "delete"]
    assert [w for w in deletes if w.code < 300], "MCM deleted the machine of the deleted Node"
    assert [w.code for w in deletes if w.code == 403] == [], "never denied"
    product.check_running()
