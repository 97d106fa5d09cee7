"""One webhook for many shoots: node endpoints under /shoots/{namespace}/…, MCM's ServiceAccount per namespace,
several controller identities, and whether MCM preserves natively decided per namespace."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings, service_account_username
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.core.webhook_configurations import (
    CA_ANNOTATION_PATH,
    MACHINE_DELETION_PATH,
    MCM_MARKER_PATH,
    PRESERVE_ANNOTATION_PATH,
    ClientConfig,
    shoot_path,
)
from machine_preservation.webhook.app import NODE_PATHS, WebhookConfig, build_app
from machine_preservation.webhook.metrics import WebhookMetrics
from tests.webhook.conftest import NOW, AiohttpClient, StaticMachineSets
from tests.webhook.reviews import (
    ADMIN,
    MACHINE_KIND,
    MCM,
    NODE_KIND,
    decoded_patch,
    machine,
    machine_set,
    node,
    review,
)

NEW, OLD = "shoot--p--new", "shoot--p--old"  # MCM v0.62 (native), v0.61
SEED_CONTROLLER = "system:serviceaccount:extension-mp:gardener-extension-machine-preservation"
SHOOT_CONTROLLER = "system:serviceaccount:kube-system:machine-preservation"
SETTINGS = AdmissionSettings(
    controller_username=SEED_CONTROLLER,
    more_controller_usernames=frozenset({SHOOT_CONTROLLER}),
    mcm_usernames=frozenset({MCM}),
    mcm_service_accounts=frozenset({"machine-controller-manager"}),
)
CA = v.CA_SCALE_DOWN_DISABLED_ANNOTATION
BY_MCM = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
OURS = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION


def mcm_of(namespace: str) -> str:
    return service_account_username(namespace, "machine-controller-manager")


@dataclass
class Natives:
    """NativeSource stand-in: what each namespace's MCM is (the real one is tested in test_native_by_namespace)."""

    native_namespaces: set[str] = field(default_factory=lambda: {NEW})
    asked: list[str] = field(default_factory=list)
    closed: bool = False

    async def native(self, namespace: str) -> bool:
        self.asked.append(namespace)
        return namespace in self.native_namespaces

    async def close(self) -> None:
        self.closed = True


@dataclass
class Shoots:
    client: TestClient[web.Request, web.Application]
    natives: Natives
    machine_sets: StaticMachineSets
    metrics: WebhookMetrics

    async def review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post(path, json=body)
        answer = await response.json()
        assert response.status == 200, answer
        assert answer["response"]["uid"] == body["request"]["uid"]
        result: dict[str, Any] = answer["response"]
        return result


async def make(
    aiohttp_client: AiohttpClient, *, per_namespace: bool = True, settings: AdmissionSettings = SETTINGS
) -> Shoots:
    natives, machine_sets, metrics = Natives(), StaticMachineSets(), WebhookMetrics()
    app = build_app(
        WebhookConfig(
            settings=settings,
            machine_sets=machine_sets,
            native=natives if per_namespace else None,
            ready=lambda: True,
            metrics=metrics,
            clock=lambda: NOW,
        )
    )
    return Shoots(await aiohttp_client(app), natives, machine_sets, metrics)


@pytest.fixture
async def shoots(aiohttp_client: AiohttpClient) -> Shoots:
    return await make(aiohttp_client)


def test_the_url_is_the_one_the_extension_provisions() -> None:
    """The controller gives each shoot `<webhook url>/shoots/<namespace>` as base URL; the configuration
    builders append the endpoint's path to it."""
    base = ClientConfig(ca_bundle=b"ca", url=f"https://wh.extension-mp.svc:443/shoots/{NEW}")
    for path in NODE_PATHS:
        assert base.for_path(path)["url"] == f"https://wh.extension-mp.svc:443{shoot_path(NEW, path)}"
    assert shoot_path(NEW, PRESERVE_ANNOTATION_PATH) == f"/shoots/{NEW}/validate-preserve-annotation"


# --- native preservation per shoot ---------------------------------------------------------------------------


def user_drops_ca(**marker: str) -> dict[str, Any]:
    """A user's update removing the CA annotation from a node marked by MCM's `…-by-mcm` (and `marker`)."""
    old = node(annotations={CA: "true", BY_MCM: "true", **marker})
    new = node(annotations={BY_MCM: "true", **marker})
    return review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old, username=ADMIN)


async def test_by_mcm_counts_as_preserved_in_a_shoot_whose_mcm_is_native(shoots: Shoots) -> None:
    response = await shoots.review(shoot_path(NEW, CA_ANNOTATION_PATH), user_drops_ca())
    assert decoded_patch(response) == [
        {
            "op": "add",
            "path": "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled",
            "value": "true",
        }
    ]
    # With a v0.61 MCM the marker only says a rollout ran: no preservation, nothing restored.
    response = await shoots.review(shoot_path(OLD, CA_ANNOTATION_PATH), user_drops_ca())
    assert response["allowed"] is True
    assert "patch" not in response
    assert shoots.natives.asked == [NEW, NEW, OLD, OLD], "once before the body is read, once to judge it"
    # Our own marker is preservation in every shoot.
    response = await shoots.review(shoot_path(OLD, CA_ANNOTATION_PATH), user_drops_ca(**{OURS: "true"}))
    assert decoded_patch(response)


async def test_the_plain_node_paths_keep_the_process_wide_decision(
    shoots: Shoots, aiohttp_client: AiohttpClient
) -> None:
    response = await shoots.review(CA_ANNOTATION_PATH, user_drops_ca())
    assert "patch" not in response  # SETTINGS: not native
    assert shoots.natives.asked == []
    native = await make(aiohttp_client, settings=SETTINGS.model_copy(update={"mcm_native_preservation": True}))
    assert decoded_patch(await native.review(CA_ANNOTATION_PATH, user_drops_ca()))
    # ... and the prefixed path still asks the namespace, which here is not native.
    assert "patch" not in await native.review(shoot_path(OLD, CA_ANNOTATION_PATH), user_drops_ca())
    assert native.natives.asked == [OLD, OLD]


def mcm_adds_its_marker() -> dict[str, Any]:
    old = node(annotations={CA: "true", OURS: "true"})
    new = node(annotations={CA: "true", OURS: "true", BY_MCM: "true"})
    return review(kind=NODE_KIND, operation="UPDATE", obj=new, old=old, username=MCM)


async def test_the_mcm_marker_is_taken_out_only_where_mcm_is_not_native(shoots: Shoots) -> None:
    response = await shoots.review(shoot_path(OLD, MCM_MARKER_PATH), mcm_adds_its_marker())
    assert decoded_patch(response) == [{"op": "remove", "path": "/metadata/annotations/" + BY_MCM.replace("/", "~1")}]
    response = await shoots.review(shoot_path(NEW, MCM_MARKER_PATH), mcm_adds_its_marker())
    assert "patch" not in response


async def test_a_native_mcm_may_write_its_auto_value_on_its_own_machines(shoots: Shoots) -> None:
    def auto_by(namespace: str, username: str) -> dict[str, Any]:
        old = machine(namespace=namespace)
        new = machine(namespace=namespace, annotations={v.PRESERVE_ANNOTATION: v.UPSTREAM_AUTO_PRESERVE_VALUE})
        return review(kind=MACHINE_KIND, operation="UPDATE", obj=new, old=old, username=username)

    assert (await shoots.review(PRESERVE_ANNOTATION_PATH, auto_by(NEW, mcm_of(NEW))))["allowed"] is True
    # MCM v0.61 does not preserve: its auto value is refused like anyone's.
    assert (await shoots.review(PRESERVE_ANNOTATION_PATH, auto_by(OLD, mcm_of(OLD))))["allowed"] is False
    # Another shoot's MCM is nobody on this shoot's machines.
    assert (await shoots.review(PRESERVE_ANNOTATION_PATH, auto_by(NEW, mcm_of(OLD))))["allowed"] is False
    assert set(shoots.natives.asked) == {NEW, OLD}


# --- MCM's ServiceAccount per namespace on the deletion guard -------------------------------------------------------


def preserved_in(namespace: str) -> dict[str, Any]:
    record = PreservationRecord(
        since=NOW - dt.timedelta(hours=1), until=NOW + dt.timedelta(hours=3), by=v.PreservedBy.USER
    )
    return machine("m1", record.annotations(), phase="Failed", namespace=namespace)


def delete(obj: dict[str, Any], username: str) -> dict[str, Any]:
    return review(kind=MACHINE_KIND, operation="DELETE", old=obj, username=username)


@pytest.mark.parametrize("namespace", [NEW, OLD])
async def test_mcm_of_a_namespace_is_guarded_there_and_nobody_elsewhere(shoots: Shoots, namespace: str) -> None:
    other = OLD if namespace == NEW else NEW
    shoots.machine_sets.machine_sets = [machine_set(namespace=namespace)]
    shoots.machine_sets.machines = [preserved_in(namespace), machine("m2", namespace=namespace)]
    # A preservation of ours stays guarded also where MCM is native (handed over while it ran).
    response = await shoots.review(MACHINE_DELETION_PATH, delete(preserved_in(namespace), mcm_of(namespace)))
    assert response["allowed"] is False
    assert response["status"]["message"].startswith('machine "m1" is Failed and preserved until 2026-11-21T15:00:00Z')
    assert shoots.machine_sets.reads == [(namespace, "ms")]
    # The other namespace's MCM deleting this machine: not MCM here, passes without a read.
    response = await shoots.review(MACHINE_DELETION_PATH, delete(preserved_in(namespace), mcm_of(other)))
    assert response["allowed"] is True
    assert shoots.machine_sets.reads == [(namespace, "ms")]


async def test_the_deletion_guard_is_off_for_machines_a_native_mcm_keeps(shoots: Shoots) -> None:
    """A Failed machine asking for preservation without our record: about to be preserved by us under MCM v0.61,
    MCM's own business under v0.62."""

    def asking(namespace: str) -> dict[str, Any]:
        return machine("m1", {v.PRESERVE_ANNOTATION: "now"}, phase="Failed", namespace=namespace)

    denied = await shoots.review(MACHINE_DELETION_PATH, delete(asking(OLD), mcm_of(OLD)))
    assert denied["allowed"] is False
    assert "about to be preserved" in denied["status"]["message"]
    assert (await shoots.review(MACHINE_DELETION_PATH, delete(asking(NEW), mcm_of(NEW))))["allowed"] is True


async def test_without_a_source_every_namespace_has_the_process_wide_decision(aiohttp_client: AiohttpClient) -> None:
    shoots = await make(aiohttp_client, per_namespace=False)
    response = await shoots.review(shoot_path(NEW, CA_ANNOTATION_PATH), user_drops_ca())
    assert "patch" not in response
    asking = machine("m1", {v.PRESERVE_ANNOTATION: "now"}, phase="Failed", namespace=NEW)
    assert (await shoots.review(MACHINE_DELETION_PATH, delete(asking, mcm_of(NEW))))["allowed"] is False


# --- identities -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("controller", [SEED_CONTROLLER, SHOOT_CONTROLLER])
async def test_every_controller_identity_may_write_the_auto_value(shoots: Shoots, controller: str) -> None:
    auto = node(annotations={v.PRESERVE_ANNOTATION: v.PreserveValue.AUTO.value})
    body = review(kind=NODE_KIND, operation="UPDATE", obj=auto, old=node(), username=controller)
    assert (await shoots.review(shoot_path(NEW, PRESERVE_ANNOTATION_PATH), body))["allowed"] is True
    body = review(kind=NODE_KIND, operation="UPDATE", obj=auto, old=node(), username=mcm_of(NEW))
    denied = await shoots.review(shoot_path(NEW, PRESERVE_ANNOTATION_PATH), body)
    assert denied["allowed"] is False
    assert f"({SEED_CONTROLLER}, {SHOOT_CONTROLLER})" in denied["status"]["message"]


# --- the URL -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    ["Shoot--p--a", "shoot_p_a", "-shoot", "shoot-", "a" * 64, "shoot--p--a.x", "sh%C3%B6ot", "%20"],
)
@pytest.mark.parametrize("path", NODE_PATHS)
async def test_a_url_that_names_no_namespace_is_a_bad_request(shoots: Shoots, namespace: str, path: str) -> None:
    body = user_drops_ca()
    response = await shoots.client.post(f"/shoots/{namespace}{path}", json=body)
    assert response.status == 400
    answer = await response.json()
    assert answer["response"]["allowed"] is False
    assert "is not a namespace name" in answer["response"]["status"]["message"]
    assert shoots.natives.asked == []
    endpoint = path.lstrip("/")
    errors = shoots.metrics.registry.get_sample_value(
        "machine_preservation_webhook_errors_total", {"endpoint": endpoint, "kind": "bad_request"}
    )
    assert errors == 1.0


@pytest.mark.parametrize(
    "path",
    [
        f"/shoots/{NEW}/validate-machine-deletion",  # the seed's endpoints have no shoot form
        f"/shoots/{NEW}/validate-shoot",
        f"/shoots/{NEW}/nothing",
        f"/shoots/a/b{CA_ANNOTATION_PATH}",
        f"/shoots/{CA_ANNOTATION_PATH}",
        f"/shoots{CA_ANNOTATION_PATH}",
    ],
)
async def test_other_paths_under_shoots_do_not_exist(shoots: Shoots, path: str) -> None:
    response = await shoots.client.post(path, json=user_drops_ca())
    assert response.status == 404
    assert shoots.natives.asked == []


async def test_a_shoot_sends_nodes_only(shoots: Shoots) -> None:
    body = review(kind=MACHINE_KIND, operation="CREATE", obj=machine(namespace=NEW))
    response = await shoots.client.post(shoot_path(NEW, PRESERVE_ANNOTATION_PATH), json=body)
    assert response.status == 400
    message = (await response.json())["response"]["status"]["message"]
    assert message == "this endpoint handles core/Node, not machine.sapcloud.io/Machine"


async def test_metrics_count_the_endpoint_not_the_shoot(shoots: Shoots) -> None:
    for namespace in (NEW, OLD, "shoot--p--third"):
        await shoots.review(shoot_path(namespace, CA_ANNOTATION_PATH), user_drops_ca())
    await shoots.review(CA_ANNOTATION_PATH, user_drops_ca())
    exposition = shoots.metrics.exposition().decode()
    assert "shoot--" not in exposition
    requests = shoots.metrics.registry.get_sample_value(
        "machine_preservation_webhook_requests_total", {"endpoint": CA_ANNOTATION_PATH.lstrip("/")}
    )
    assert requests == 4.0


async def test_the_source_is_closed_with_the_app(aiohttp_client: AiohttpClient) -> None:
    shoots = await make(aiohttp_client)
    await shoots.client.close()
    assert shoots.natives.closed
