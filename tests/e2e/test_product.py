"""The `product` fixture itself: our processes run as the chart's identities under the chart's RBAC, the
chart's webhook configurations reach the webhook, the controller restarts, and its writes are seen."""

from __future__ import annotations

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core import vocabulary as v
from machine_preservation.kube.clients import MERGE_PATCH, new_api_client
from machine_preservation.localcluster.mcm_pool import GROUP, VERSION, machine_node
from tests.e2e.harness import RealMcm
from tests.e2e.product import Product, field_paths
from tests.polling import eventually_async


def test_field_paths_key_annotations_by_their_keys() -> None:
    body = {"metadata": {"annotations": {"a.b/c": "x", "d": None}}, "status": {"conditions": [{"type": "X"}]}}
    assert field_paths(body) == ("metadata.annotations[a.b/c]", "metadata.annotations[d]", "status.conditions")
    json_patch = [
        {"op": "test", "path": "/spec/taints/0", "value": {}},
        {"op": "add", "path": "/spec/taints/-", "value": {}},
        {"op": "remove", "path": "/metadata/annotations/a.b~1c"},
    ]
    assert field_paths(json_patch) == ("metadata.annotations[a.b/c]", "spec.taints")


async def test_product_runs_as_the_chart_release_and_is_seen_writing(real_mcm: RealMcm, product: Product) -> None:
    await real_mcm.create_pool("pool", replicas=1)
    machines = await real_mcm.wait_for_pool("pool", 1)
    name = machines[0]["metadata"]["name"]
    await product.start(preserve_timeout="60s")
    await product.start(preserve_timeout="60s")  # idempotent

    assert product.controller_user == f"system:serviceaccount:{real_mcm.namespace}:mp-controller"
    assert product.webhook_user == f"system:serviceaccount:{real_mcm.namespace}:mp-webhook"

    # An SRE's bad value is denied by our webhook through the chart's registration.
    sre = await new_api_client(kubeconfig=product.kubeconfig_for("sre", groups=("system:masters",)))
    try:
        custom = client.CustomObjectsApi(sre)
        with pytest.raises(ApiException) as denied:
            await custom.patch_namespaced_custom_object(
                GROUP, VERSION, real_mcm.namespace, "machines", name,
                {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "bogus"}}}, _content_type=MERGE_PATCH,
            )  # fmt: skip
        assert "when-failed" in str(denied.value.body)
        # A good one starts a preservation, which only the controller's identity records.
        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, real_mcm.namespace, "machines", name,
            {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: "now"}}}, _content_type=MERGE_PATCH,
        )  # fmt: skip
    finally:
        await sre.close()

    async def preserved() -> bool:
        machine = await real_mcm.machine(name)
        return bool(machine and v.PRESERVED_UNTIL_ANNOTATION in machine["metadata"].get("annotations", {}))

    await eventually_async(preserved, limit=30)
    writes = await eventually_async(product.controller_writes, limit=10)
    annotated = [w for w in writes if w.kind == "Machine" and w.name == name]
    assert any(f"metadata.annotations[{v.PRESERVED_UNTIL_ANNOTATION}]" in w.fields for w in annotated), writes

    # Its Events follow the record's write.
    async def announced() -> bool:
        starts = [e for e in await product.events("Machine", name) if e.reason == "PreservationStarted"]
        return [(e.count, e.source) for e in starts] == [(1, "machine-preservation-controller")]

    await eventually_async(announced, limit=10)

    # Killed and started again, the webhook restarted: both ready once more.
    await product.kill_controller()
    await product.start_controller()
    await product.stop_webhook()
    await product.start_webhook()
    product.check_running()
    assert machine_node(machines[0]) == name
    mcm_writes = await product.writes_by(product.mcm_user)
    assert mcm_writes, "MCM's own writes are audited too"

    # Torn down: no process left, nothing of the release outside the namespace.
    registration = client.AdmissionregistrationV1Api(real_mcm.api)
    rbac = client.RbacAuthorizationV1Api(real_mcm.api)

    async def release_objects() -> list[str]:
        names = [
            *(c.metadata.name for c in (await registration.list_validating_webhook_configuration()).items),
            *(c.metadata.name for c in (await registration.list_mutating_webhook_configuration()).items),
            *(p.metadata.name for p in (await registration.list_validating_admission_policy()).items),
            *(r.metadata.name for r in (await rbac.list_cluster_role()).items),
            *(b.metadata.name for b in (await rbac.list_cluster_role_binding()).items),
            *(r.metadata.name for r in (await rbac.list_namespaced_role("default")).items),
        ]
        return [n for n in names if n.endswith(f".{real_mcm.namespace}")]

    assert len(await release_objects()) >= 9  # 2 webhook configurations, 1 policy, roles and bindings
    processes = [product._webhook, product._controller]
    await product.tear_down()
    assert all(p is not None and p.poll() is not None for p in processes)
    assert await release_objects() == []
