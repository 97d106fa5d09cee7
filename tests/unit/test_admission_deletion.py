"""The deletion guard: MCM may not delete a Failed machine we keep, unless the replica counts need it gone."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import (
    DENIALS,
    FORCE_DELETION_LABEL,
    NEEDS,
    Assessment,
    DeletionRequest,
    MachineSetView,
    Need,
    Outcome,
    ReadCluster,
    ReadExtension,
    ReadMachineSet,
    Reads,
    ShootExtension,
    assess_machine_deletion,
)
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.gardener.cluster import ShootLifecycle, cluster_as_read, read_cluster, shoot_lifecycle
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.core.preservation_record import PreservationRecord
from machine_preservation.core.preserve_value import last_known_node

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
CONTROLLER = "system:serviceaccount:mp:controller"
MAX = dt.timedelta(days=30)
SETTINGS = AdmissionSettings(controller_username=CONTROLLER, mcm_usernames=frozenset({MCM}), max_preserve_timeout=MAX)
NATIVE = SETTINGS.model_copy(update={"mcm_native_preservation": True})
P = v.PRESERVE_ANNOTATION
NAMESPACE = "shoot--p--s"
ACTIVE = (NOW - dt.timedelta(hours=1), NOW + dt.timedelta(hours=2))  # a record's (since, until)


def record(since: dt.datetime, until: dt.datetime, by: v.PreservedBy = v.PreservedBy.USER) -> dict[str, str]:
    return PreservationRecord(since=since, until=until, by=by).annotations()


def machine(
    name: str = "m1",
    *,
    phase: str = "Failed",
    preserved: tuple[dt.datetime, dt.datetime] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    owner: str = "ms",
    created: dt.datetime = NOW - dt.timedelta(hours=1),
    node: str = "n1",
    priority: int | None = None,
    deleting: bool = False,
    timeout: str | None = None,
) -> Machine:
    written = dict(annotations or {})
    if preserved is not None:
        written.update(record(*preserved))
    if priority is not None:
        written[v.MACHINE_PRIORITY_ANNOTATION] = str(priority)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "annotations": written,
        "labels": {**({"node": node} if node else {}), **(labels or {})},
        "creationTimestamp": created.isoformat(),
        "ownerReferences": [{"kind": "MachineSet", "name": owner, "uid": f"uid-{owner}", "controller": True}]
        if owner
        else [],
    }
    if deleting:
        metadata["deletionTimestamp"] = NOW.isoformat()
        metadata["finalizers"] = ["machine.sapcloud.io/machine-controller-manager"]
    spec = {"machinePreserveTimeout": timeout} if timeout is not None else {}
    return Machine.model_validate({"metadata": metadata, "spec": spec, "status": {"currentStatus": {"phase": phase}}})


def machine_set(
    name: str = "ms",
    *,
    replicas: int = 3,
    max_: int | None = 0,
    deployment: str | None = "md",
    created: dt.datetime = NOW - dt.timedelta(days=1),
    deleting: bool = False,
) -> MachineSet:
    """`max_=None`: the spec does not carry autoPreserveFailedMachineMax (MCM v0.61's CRD prunes it)."""
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "creationTimestamp": created.isoformat()}
    if deployment:
        metadata["ownerReferences"] = [
            {"kind": "MachineDeployment", "name": deployment, "uid": f"uid-{deployment}", "controller": True}
        ]
    if deleting:
        metadata["deletionTimestamp"] = NOW.isoformat()
    spec: dict[str, Any] = {"replicas": replicas}
    if max_ is not None:
        spec["autoPreserveFailedMachineMax"] = max_
    return MachineSet.model_validate({"metadata": metadata, "spec": spec})


def deployment(
    name: str = "md", *, replicas: int = 3, deleting: bool = False, pool: str | None = None
) -> MachineDeployment:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if pool is not None:
        metadata["labels"] = {"worker.gardener.cloud/pool": pool}
    if deleting:
        metadata["deletionTimestamp"] = NOW.isoformat()
    return MachineDeployment.model_validate({"metadata": metadata, "spec": {"replicas": replicas}})


def view(
    own: MachineSet,
    machines: list[Machine],
    *,
    siblings: list[MachineSet] | None = None,
    deployments: list[MachineDeployment] | None = None,
) -> MachineSetView:
    return MachineSetView(
        machine_set=own,
        machines=machines,
        siblings=siblings if siblings is not None else [own],
        machine_deployments=deployments if deployments is not None else [deployment(replicas=own.spec.replicas)],
    )


def gardener(
    *,
    hibernated: bool = False,
    deleted: bool = False,
    migrated: bool = False,
    workers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Gardener's Cluster for the namespace, as the API serves it: the Shoot as raw JSON in spec.shoot."""
    metadata: dict[str, Any] = {"name": "s", "namespace": "garden-p"}
    if deleted:
        metadata["deletionTimestamp"] = NOW.isoformat()
    shoot: dict[str, Any] = {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": metadata,
        "spec": {"hibernation": {"enabled": hibernated}, "provider": {"type": "aws", "workers": workers or []}},
        "status": {"lastOperation": {"type": "Migrate" if migrated else "Reconcile", "state": "Processing"}},
    }
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "shoot--p--s"},
        "spec": {"cloudProfile": {}, "shoot": shoot},
    }


def healthy(name: str, owner: str = "ms") -> Machine:
    return machine(name, phase="Running", owner=owner, node=f"node-{name}")


def request(m: Machine, *, username: str = MCM, settings_: AdmissionSettings = SETTINGS) -> DeletionRequest:
    return DeletionRequest(machine=m, username=username, settings=settings_, now=NOW)


def assess(
    m: Machine,
    *,
    username: str = MCM,
    machine_set: MachineSetView | None = None,
    cluster: dict[str, Any] | None = None,
    settings_: AdmissionSettings = SETTINGS,
    extension: ShootExtension | None = None,
) -> Assessment:
    """The verdict with everything read (None: there is none, or not read)."""
    reads = Reads(machine_set=machine_set, cluster=cluster, extension=extension)
    step = assess_machine_deletion(request(m, username=username, settings_=settings_), reads)
    assert isinstance(step, Assessment), step
    return step


def next_need(m: Machine, *, username: str = MCM, settings_: AdmissionSettings = SETTINGS, **read: Any) -> Need | None:
    """What the guard asks for with `read` read (the kinds not named there unread); None: it has its verdict."""
    step = assess_machine_deletion(request(m, username=username, settings_=settings_), Reads(**read))
    return None if isinstance(step, Assessment) else step


PRESERVED = machine(preserved=ACTIVE)
PRESERVED_SET = view(machine_set(replicas=3), [PRESERVED, healthy("h1"), healthy("h2")])


def _rows() -> list[Any]:
    cap_exceeded = (NOW - MAX - dt.timedelta(hours=1), NOW + dt.timedelta(days=365))
    budget = machine_set(replicas=2, max_=1)
    holder = machine("m0", annotations={P: "auto-preserve"}, preserved=ACTIVE, node="n0")
    two_kept = [
        machine("a", preserved=ACTIVE, priority=4, node="na"),
        machine("b", preserved=ACTIVE, priority=5, node="nb"),
    ]
    return [
        # Who is guarded, decided by the machine alone.
        pytest.param(PRESERVED, {"username": "alice"}, Outcome.NOT_GUARDED, id="a-user-is-never-blocked"),
        pytest.param(PRESERVED, {"username": CONTROLLER}, Outcome.NOT_GUARDED, id="the-controller-is-not-guarded"),
        pytest.param(
            machine(phase="Running", annotations={P: "now"}),
            {},
            Outcome.NOT_GUARDED,
            id="a-healthy-machine-without-our-record-is-not-guarded",
        ),
        pytest.param(
            machine(phase="Unknown", annotations={P: "now"}), {}, Outcome.NOT_GUARDED, id="unknown-is-not-failed"
        ),
        # A preserved machine is guarded in every phase: MCM deletes the Machine of a deleted Node.
        pytest.param(
            machine(phase="Running", preserved=ACTIVE), {}, Outcome.PRESERVED, id="a-preserved-healthy-machine-is-kept"
        ),
        pytest.param(
            machine(phase="Unknown", preserved=ACTIVE), {}, Outcome.PRESERVED, id="a-preserved-unknown-machine-is-kept"
        ),
        pytest.param(
            machine(phase="", preserved=ACTIVE), {}, Outcome.PRESERVED, id="a-preserved-machine-without-a-phase"
        ),
        pytest.param(
            machine(phase="Running", preserved=(NOW - dt.timedelta(hours=3), NOW)),
            {},
            Outcome.EXPIRED,
            id="a-healthy-machine-whose-preservation-ran-out",
        ),
        pytest.param(
            machine(phase="Running", preserved=ACTIVE),
            {"settings_": NATIVE},
            Outcome.PRESERVED,
            id="native-keeps-guarding-our-record-on-a-healthy-machine",
        ),
        pytest.param(
            machine(phase="Running", preserved=ACTIVE, labels={FORCE_DELETION_LABEL: "True"}),
            {},
            Outcome.FORCE_DELETION,
            id="a-preserved-healthy-machine-marked-for-forced-deletion",
        ),
        pytest.param(
            machine(phase="Running", preserved=ACTIVE),
            {"machine_set": view(machine_set(replicas=0), [machine(phase="Running", preserved=ACTIVE)])},
            Outcome.MACHINE_SET_SURPLUS,
            id="scale-to-zero-takes-a-preserved-healthy-machine",
        ),
        pytest.param(
            machine(phase="Running", preserved=ACTIVE),
            {"machine_set": view(machine_set(replicas=1), [machine(phase="Running", preserved=ACTIVE), healthy("h1")])},
            Outcome.PRESERVED,
            id="a-preserved-healthy-machine-is-not-replaced-while-the-count-keeps-it",
        ),
        pytest.param(
            machine(annotations={P: "now"}),
            {"settings_": NATIVE},
            Outcome.NOT_OURS,
            id="native-mcm-owns-machines-without-our-record",
        ),
        pytest.param(
            machine(preserved=ACTIVE), {"settings_": NATIVE}, Outcome.PRESERVED, id="native-keeps-guarding-our-record"
        ),
        pytest.param(
            machine(preserved=ACTIVE, deleting=True), {}, Outcome.ALREADY_DELETED, id="a-machine-already-going"
        ),
        pytest.param(
            machine(preserved=ACTIVE, labels={FORCE_DELETION_LABEL: "True"}),
            {},
            Outcome.FORCE_DELETION,
            id="marked-for-forced-deletion",
        ),
        pytest.param(
            machine(preserved=ACTIVE, labels={FORCE_DELETION_LABEL: "true"}),
            {},
            Outcome.PRESERVED,
            id="only-mcms-exact-force-deletion-marker-counts",
        ),
        pytest.param(
            machine(preserved=(NOW - dt.timedelta(hours=3), NOW)), {}, Outcome.EXPIRED, id="expired-exactly-now"
        ),
        pytest.param(machine(preserved=cap_exceeded), {}, Outcome.EXPIRED, id="expiry-beyond-the-cap-counts-as-cap"),
        pytest.param(
            machine(annotations={v.PRESERVED_SINCE_ANNOTATION: "garbage", P: "now"}),
            {},
            Outcome.EXPIRED,
            id="a-damaged-record-has-run-out",
        ),
        # Kept or not.
        pytest.param(machine(), {}, Outcome.NOT_KEPT, id="no-value-no-machine-set"),
        pytest.param(machine(annotations={P: "false"}), {}, Outcome.NOT_KEPT, id="opted-out"),
        pytest.param(machine(annotations={P: "garbage"}), {}, Outcome.NOT_KEPT, id="an-invalid-value-counts-as-absent"),
        pytest.param(
            machine(annotations={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "false", P: "now"}),
            {},
            Outcome.NOT_KEPT,
            id="the-nodes-false-wins",
        ),
        pytest.param(machine(annotations={P: "now"}), {}, Outcome.PENDING_BY_VALUE, id="pending-by-the-machines-value"),
        pytest.param(
            machine(annotations={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "when-failed"}),
            {},
            Outcome.PENDING_BY_VALUE,
            id="pending-by-the-nodes-value",
        ),
        pytest.param(
            machine(annotations={P: "auto-preserved"}),
            {},
            Outcome.PENDING_BY_VALUE,
            id="pending-by-upstreams-auto-value",
        ),
        pytest.param(
            machine(),
            {"machine_set": view(budget, [machine(), healthy("h1")])},
            Outcome.PENDING_BY_BUDGET,
            id="pending-by-budget-room",
        ),
        pytest.param(
            machine(),
            {"machine_set": view(budget, [holder, machine()])},
            Outcome.NOT_KEPT,
            id="a-full-budget-keeps-nothing-more",
        ),
        pytest.param(
            machine(),
            {
                "machine_set": view(
                    budget,
                    [machine()],
                    siblings=[budget, machine_set("ms-new", max_=1, created=NOW - dt.timedelta(minutes=5))],
                )
            },
            Outcome.NOT_KEPT,
            id="a-machine-set-being-rolled-out-grants-nothing",
        ),
        pytest.param(PRESERVED, {"machine_set": PRESERVED_SET}, Outcome.PRESERVED, id="a-replacing-delete"),
        # Replica counts win.
        pytest.param(
            PRESERVED,
            {"machine_set": view(machine_set(deleting=True), [PRESERVED])},
            Outcome.MACHINE_SET_DELETED,
            id="machine-set-deleted",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": view(machine_set(), [PRESERVED], deployments=[deployment(deleting=True)])},
            Outcome.MACHINE_DEPLOYMENT_DELETED,
            id="machine-deployment-deleted",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": view(machine_set(replicas=0), [PRESERVED, healthy("h1")])},
            Outcome.MACHINE_SET_SURPLUS,
            id="scale-to-zero",
        ),
        pytest.param(
            machine(annotations={P: "when-failed"}),
            {"machine_set": view(machine_set(replicas=0), [machine(annotations={P: "when-failed"})])},
            Outcome.MACHINE_SET_SURPLUS,
            id="scale-to-zero-takes-pending-machines-too",
        ),
        pytest.param(
            machine(),
            {"machine_set": view(machine_set(replicas=0, max_=1), [machine()])},
            Outcome.MACHINE_SET_SURPLUS,
            id="scale-to-zero-takes-budget-candidates-too",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": view(machine_set(replicas=1), [PRESERVED, healthy("h1"), healthy("h2")])},
            Outcome.PRESERVED,
            id="scale-down-takes-unpreserved-machines-first",
        ),
        pytest.param(
            two_kept[0],
            {"machine_set": view(machine_set(replicas=1), [*two_kept, healthy("h1")])},
            Outcome.MACHINE_SET_SURPLUS,
            id="scale-down-beyond-the-unpreserved-machines-takes-the-first-in-mcms-order",
        ),
        pytest.param(
            two_kept[1],
            {"machine_set": view(machine_set(replicas=1), [*two_kept, healthy("h1")])},
            Outcome.PRESERVED,
            id="scale-down-beyond-the-unpreserved-machines-keeps-the-rest",
        ),
        pytest.param(
            PRESERVED,
            {
                "machine_set": view(
                    machine_set(replicas=1),
                    [PRESERVED, machine("gone", preserved=ACTIVE, deleting=True, node="ng")],
                )
            },
            Outcome.PRESERVED,
            id="machines-being-deleted-do-not-count",
        ),
        pytest.param(
            PRESERVED,
            {
                "machine_set": view(
                    machine_set(replicas=1), [PRESERVED, machine("t", phase="Terminating", preserved=ACTIVE, node="nt")]
                )
            },
            Outcome.PRESERVED,
            id="terminating-machines-do-not-count",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": view(machine_set(replicas=3), [PRESERVED], deployments=[deployment(replicas=0)])},
            Outcome.MACHINE_DEPLOYMENT_SURPLUS,
            id="the-machine-deployment-scaled-to-zero-before-its-set",
        ),
        pytest.param(
            PRESERVED,
            {
                "machine_set": view(
                    machine_set("ms", replicas=1),
                    [PRESERVED, machine("b", owner="ms-b", preserved=ACTIVE, priority=5, node="nb")],
                    siblings=[machine_set("ms", replicas=1), machine_set("ms-b", replicas=1)],
                    deployments=[deployment(replicas=1)],
                )
            },
            Outcome.MACHINE_DEPLOYMENT_SURPLUS,
            id="the-machine-deployment-counts-all-its-sets",
        ),
        pytest.param(
            PRESERVED,
            {
                "machine_set": view(
                    machine_set("ms", replicas=1),
                    [PRESERVED, healthy("n", owner="ms-new")],
                    siblings=[machine_set("ms", replicas=1), machine_set("ms-new", replicas=1)],
                    deployments=[deployment(replicas=1)],
                )
            },
            Outcome.PRESERVED,
            id="a-rollout-surge-is-no-scale-down",
        ),
        # The Shoot.
        pytest.param(
            PRESERVED,
            {"machine_set": PRESERVED_SET, "cluster": gardener(hibernated=True)},
            Outcome.SHOOT_GOING_AWAY,
            id="shoot-hibernated",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": PRESERVED_SET, "cluster": gardener(deleted=True)},
            Outcome.SHOOT_GOING_AWAY,
            id="shoot-deleted",
        ),
        pytest.param(
            machine(annotations={P: "now"}),
            {"cluster": gardener(migrated=True)},
            Outcome.SHOOT_GOING_AWAY,
            id="shoot-migrated",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": PRESERVED_SET, "cluster": gardener()},
            Outcome.PRESERVED,
            id="a-shoot-going-nowhere",
        ),
    ]


@pytest.mark.parametrize(("candidate", "context", "expected"), _rows())
def test_every_reason_to_pass_or_deny(candidate: Machine, context: dict[str, Any], expected: Outcome) -> None:
    assessment = assess(candidate, **context)
    assert assessment.outcome == expected
    assert assessment.allowed == (expected not in DENIALS)
    verdict = assessment.verdict()
    assert verdict.allowed == assessment.allowed
    if not verdict.allowed:
        assert verdict.code == 403
        phase = f"{candidate.phase} and " if candidate.phase else ""
        assert f'machine "{candidate.metadata.name}" is {phase}' in verdict.message
        assert f"to release it, annotate the machine (or its node) with {P}=false" in verdict.message


def test_a_preserved_denial_names_the_capped_expiry() -> None:
    message = assess(PRESERVED).message
    assert message.startswith('machine "m1" is Failed and preserved until 2026-11-21T14:00:00Z; ')
    far = machine(preserved=(NOW - dt.timedelta(days=1), NOW + dt.timedelta(days=3650)))
    assert "preserved until 2026-12-20T12:00:00Z" in assess(far).message  # since + 30 days


def test_a_denial_with_replica_counts_says_the_delete_would_only_replace_it() -> None:
    message = assess(PRESERVED, machine_set=PRESERVED_SET).message
    assert 'its MachineSet "ms" wants 3 machine(s) and keeps it among them, so deleting it would only replace it' in (
        message
    )


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({P: "auto-preserved"}, '"auto-preserved" from its machine'),  # upstream's spelling, as on the object
        ({P: "auto-preserve"}, '"auto-preserve" from its machine'),
        ({P: "auto-preserved", v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "when-failed"}, '"when-failed" from its node'),
    ],
)
def test_pending_denials_name_the_value_as_written(annotations: dict[str, str], named: str) -> None:
    assert f"about to be preserved (preserve value {named})" in assess(machine(annotations=annotations)).message


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [
        (None, "kept for the configured machinePreserveTimeout from the start"),
        ("48h", "kept for 48h0m0s from the start of its preservation"),
        ("1y", "kept for the configured machinePreserveTimeout from the start"),
        ("9000h", "kept for 720h0m0s (the maximum preserve timeout) from the start"),
    ],
)
def test_pending_denials_say_how_long_the_machine_will_be_kept(timeout: str | None, shown: str) -> None:
    message = assess(machine(annotations={P: "now"}, timeout=timeout)).message
    assert 'about to be preserved (preserve value "now" from its machine)' in message
    assert shown in message


def test_budget_denials_name_the_machine_set() -> None:
    message = assess(machine(), machine_set=view(machine_set(max_=1), [machine()])).message
    assert 'is Failed and about to be auto-preserved (MachineSet "ms" has room in its autoPreserve' in message


POOL = [{"name": "p", "zones": ["a"], "machineControllerManager": {"autoPreserveFailedMachineMax": 1}}]


def v061(machines: list[Machine], *, replicas: int = 3) -> MachineSetView:
    """A namespace as MCM v0.61 leaves it: neither the MachineSet nor the MachineDeployment carries the max."""
    return view(
        machine_set(replicas=replicas, max_=None), machines, deployments=[deployment(replicas=replicas, pool="p")]
    )


def test_the_budget_comes_from_the_shoot_where_mcms_objects_do_not_carry_it() -> None:
    namespace = v061([machine(), healthy("h1")])
    assert assess(machine(), machine_set=namespace).outcome == Outcome.NOT_KEPT
    with_shoot = assess(machine(), machine_set=namespace, cluster=gardener(workers=POOL))
    assert with_shoot.outcome == Outcome.PENDING_BY_BUDGET
    # Spread over zones as Gardener does: 1 over 2 zones leaves the second zone none; an unknown zone gets the
    # smallest share.
    two_zones = [{**POOL[0], "zones": ["a", "b"]}]
    assert assess(machine(), machine_set=namespace, cluster=gardener(workers=two_zones)).outcome == Outcome.NOT_KEPT
    # A max the MachineSet carries wins over the Shoot's.
    carried = view(machine_set(max_=0), [machine()], deployments=[deployment(pool="p")])
    assert assess(machine(), machine_set=carried, cluster=gardener(workers=POOL)).outcome == Outcome.NOT_KEPT


def test_a_denial_announces_the_pools_timeout() -> None:
    pending = machine(annotations={P: "now"})
    timed = [{"name": "p", "machineControllerManager": {"machinePreserveTimeout": "48h"}}]
    message = assess(pending, machine_set=v061([pending]), cluster=gardener(workers=timed)).message
    assert "kept for 48h0m0s from the start of its preservation" in message
    own = machine(annotations={P: "now"}, timeout="2h")  # the machine's own timeout comes first
    assert (
        "kept for 2h0m0s from the start"
        in assess(own, machine_set=v061([own]), cluster=gardener(workers=timed)).message
    )


@pytest.mark.parametrize(
    ("candidate", "context", "read"),
    [
        pytest.param(PRESERVED, {"username": "alice"}, False, id="a-users-delete"),
        pytest.param(PRESERVED, {"machine_set": PRESERVED_SET}, True, id="a-denial-the-shoot-may-lift"),
        pytest.param(
            PRESERVED, {"machine_set": view(machine_set(replicas=0), [PRESERVED])}, False, id="already-allowed"
        ),
        pytest.param(machine(annotations={P: "now"}), {}, True, id="a-pending-denial"),
        pytest.param(machine(), {"machine_set": v061([machine()])}, True, id="a-budget-only-the-shoot-knows"),
        pytest.param(
            machine(), {"machine_set": view(machine_set(max_=0), [machine()])}, False, id="a-budget-the-set-carries"
        ),
        pytest.param(
            machine(),
            {"machine_set": view(machine_set(max_=None), [machine()], deployments=[deployment()])},
            False,
            id="no-pool-label-no-shoot-pool",
        ),
        pytest.param(machine(annotations={P: "false"}), {"machine_set": v061([machine()])}, False, id="opted-out"),
        pytest.param(machine(), {}, False, id="no-machine-set-no-budget"),
    ],
)
def test_the_cluster_is_read_only_when_it_can_change_the_answer(
    candidate: Machine, context: dict[str, Any], read: bool
) -> None:
    username = context.pop("username", MCM)
    found = next_need(candidate, username=username, machine_set=context.get("machine_set"))
    assert (found == ReadCluster(NAMESPACE)) is read


def test_releases_of_kept_machines_say_why() -> None:
    scaled = assess(PRESERVED, machine_set=view(machine_set(replicas=0), [PRESERVED]))
    assert scaled.message == 'machine "m1": its MachineSet "ms" wants 0 machine(s), fewer than it keeps'
    hibernated = assess(PRESERVED, cluster=gardener(hibernated=True))
    assert hibernated.message == 'machine "m1": Shoot "s" is being hibernated'


def test_reads_are_only_made_when_the_machine_alone_does_not_decide() -> None:
    def read(m: Machine, username: str = MCM, settings_: AdmissionSettings = SETTINGS) -> str:
        need = next_need(m, username=username, settings_=settings_)
        return need.name if isinstance(need, ReadMachineSet) else ""

    assert read(machine()) == "ms"  # the budget
    assert read(PRESERVED) == "ms"  # the replica counts
    assert read(machine(annotations={P: "now"})) == "ms"
    assert read(PRESERVED, "alice") == ""
    assert read(machine(phase="Running", annotations={P: "now"})) == ""
    assert read(machine(phase="Running", preserved=ACTIVE)) == "ms"  # a preserved healthy machine is kept too
    assert read(machine(annotations={P: "now"}), settings_=NATIVE) == ""
    assert read(PRESERVED, settings_=NATIVE) == "ms"
    assert read(machine(preserved=ACTIVE, labels={FORCE_DELETION_LABEL: "True"})) == ""
    assert read(machine(preserved=(NOW - dt.timedelta(hours=2), NOW - dt.timedelta(hours=1)))) == ""
    assert read(machine(owner="")) == ""


def test_a_machine_missing_from_the_listing_is_counted_as_the_request_shows_it() -> None:
    # The list may lag behind: the judged machine counts even when it is not listed yet.
    assert assess(PRESERVED, machine_set=view(machine_set(replicas=0), [])).outcome == Outcome.MACHINE_SET_SURPLUS
    assert assess(PRESERVED, machine_set=view(machine_set(replicas=1), [])).outcome == Outcome.PRESERVED


def test_the_cluster_resource_is_read_as_gardener_writes_it() -> None:
    def cluster(shoot: Any) -> dict[str, Any]:
        return {"apiVersion": "extensions.gardener.cloud/v1alpha1", "kind": "Cluster", "spec": {"shoot": shoot}}

    assert shoot_lifecycle(cluster({"metadata": {"name": "s"}, "spec": {"hibernation": {"enabled": True}}})) == (
        ShootLifecycle(name="s", hibernated=True)
    )
    assert shoot_lifecycle(
        cluster({"spec": {"hibernation": {"enabled": False}}, "status": {"isHibernated": True}})
    ) == (
        ShootLifecycle()  # waking up: the machines are wanted again
    )
    assert shoot_lifecycle(cluster({"metadata": {"deletionTimestamp": "2026-11-21T11:00:00Z"}})).deleted
    assert shoot_lifecycle(cluster({"status": {"lastOperation": {"type": "Migrate", "state": "Processing"}}})).migrated
    assert not shoot_lifecycle(cluster({"status": {"lastOperation": {"type": "Restore"}}})).migrated
    for malformed in ({}, {"spec": []}, cluster("raw"), cluster({"spec": {"hibernation": {"enabled": "true"}}})):
        assert shoot_lifecycle(malformed) == ShootLifecycle()


def test_the_last_known_node_carries_the_last_applied_value() -> None:
    known = last_known_node(machine(annotations={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now"}))
    assert known is not None
    assert known.metadata.name == "n1"
    assert known.metadata.annotations == {P: "now"}
    empty = last_known_node(machine())
    assert empty is not None
    assert empty.metadata.annotations == {}
    assert last_known_node(machine(node="")) is None


# --- Properties -----------------------------------------------------------------------------------------------

_PHASES = ["Failed", "Running", "Unknown", "Pending", "Terminating", "CrashLoopBackOff"]
_VALUES = [None, "", "now", "when-failed", "false", "auto-preserve", "garbage"]


@st.composite
def machines(draw: st.DrawFn, name: str, *, phase: str | None = None) -> Machine:
    since = NOW - dt.timedelta(hours=draw(st.integers(0, 24 * 40)))
    kind = draw(st.sampled_from(["none", "active", "expired"]))
    preserved = None
    if kind == "active":
        preserved = (since, NOW + dt.timedelta(hours=draw(st.integers(1, 24 * 400))))
    elif kind == "expired":
        preserved = (since, since + dt.timedelta(minutes=draw(st.integers(0, 60))))
    value = draw(st.sampled_from(_VALUES))
    return machine(
        name,
        phase=phase or draw(st.sampled_from(_PHASES)),
        preserved=preserved,
        annotations={P: value} if value is not None else {},
        labels={FORCE_DELETION_LABEL: "True"} if draw(st.integers(0, 9)) == 0 else {},
        created=NOW - dt.timedelta(minutes=draw(st.integers(1, 10_000))),
        node=f"node-{name}",
        priority=draw(st.none() | st.integers(1, 6)),
        deleting=draw(st.integers(0, 9)) == 0,
    )


@st.composite
def namespaces(draw: st.DrawFn) -> MachineSetView:
    count = draw(st.integers(1, 6))
    members = [draw(machines(f"m{i}")) for i in range(count)]
    own = machine_set(replicas=draw(st.integers(0, count + 1)), max_=draw(st.none() | st.integers(0, 2)))
    pool = draw(st.sampled_from([None, "p", "q"]))
    return view(own, members, deployments=[deployment(replicas=draw(st.integers(0, count + 1)), pool=pool)])


_WORKERS = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["p", "q"]),
            "zones": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True),
            "machineControllerManager": st.fixed_dictionaries(
                {"autoPreserveFailedMachineMax": st.integers(0, 3), "machinePreserveTimeout": st.just("48h")}
            ),
        }
    ),
    max_size=2,
)
_CLUSTERS = st.none() | st.builds(
    gardener, hibernated=st.booleans(), deleted=st.booleans(), migrated=st.booleans(), workers=_WORKERS
)


@given(namespace=namespaces(), cluster=_CLUSTERS, username=st.sampled_from(["alice", CONTROLLER, "system:admin"]))
def test_a_users_delete_always_passes(namespace: MachineSetView, cluster: dict[str, Any] | None, username: str) -> None:
    for candidate in namespace.machines:
        assert assess(candidate, username=username, machine_set=namespace, cluster=cluster).allowed


@given(namespace=namespaces(), native=st.booleans())
def test_mcm_may_delete_whatever_a_shoot_going_away_has(namespace: MachineSetView, native: bool) -> None:
    going = gardener(hibernated=True)
    for candidate in namespace.machines:
        chosen = NATIVE if native else SETTINGS
        assert assess(candidate, machine_set=namespace, cluster=going, settings_=chosen).allowed


@given(namespace=namespaces())
def test_scale_to_zero_lets_mcm_delete_every_machine(namespace: MachineSetView) -> None:
    emptied = view(
        machine_set(replicas=0, max_=namespace.machine_set.spec.auto_preserve_failed_machine_max),
        list(namespace.machines),
    )
    for candidate in namespace.machines:
        assert assess(candidate, machine_set=emptied).allowed


@settings(max_examples=200)
@given(
    kept=st.integers(0, 5),
    others=st.integers(0, 4),
    replicas=st.integers(0, 10),
    data=st.data(),
)
def test_the_replica_target_decides_how_many_kept_machines_may_go(
    kept: int, others: int, replicas: int, data: st.DataObject
) -> None:
    """Whenever the MachineSet needs kept machines gone to reach spec.replicas, exactly that many deletes pass
    (whichever order MCM asks in), and none while the machines we do not keep are enough."""

    def kept_machine(i: int) -> Machine:
        # A kept machine has a running record or a value that asks for preservation.
        by_record = data.draw(st.booleans())
        return machine(
            f"k{i}",
            preserved=ACTIVE if by_record else None,
            annotations={} if by_record else {P: data.draw(st.sampled_from(["now", "when-failed", "auto-preserve"]))},
            created=NOW - dt.timedelta(minutes=data.draw(st.integers(1, 1000))),
            priority=data.draw(st.none() | st.integers(1, 6)),
            node=f"node-k{i}",
        )

    kept_machines = [kept_machine(i) for i in range(kept)]
    other_machines = [
        data.draw(st.sampled_from([healthy(f"o{i}"), machine(f"o{i}", annotations={P: "false"}, node=f"node-o{i}")]))
        for i in range(others)
    ]
    listed = data.draw(st.permutations(kept_machines + other_machines))
    namespace = view(machine_set(replicas=replicas, deployment=None), listed, deployments=[])
    passing = [m.metadata.name for m in kept_machines if assess(m, machine_set=namespace).allowed]
    assert len(passing) == max(0, kept - replicas)
    for m in other_machines:
        assert assess(m, machine_set=namespace).allowed


@given(namespace=namespaces())
def test_without_our_record_native_mcm_is_never_stopped(namespace: MachineSetView) -> None:
    for candidate in namespace.machines:
        if v.PRESERVED_SINCE_ANNOTATION not in candidate.metadata.annotations:
            assert not isinstance(next_need(candidate, settings_=NATIVE), ReadMachineSet)
            assert assess(candidate, machine_set=namespace, settings_=NATIVE).allowed


@given(namespace=namespaces(), cluster=_CLUSTERS)
def test_every_denial_names_the_machine_and_how_to_release_it(
    namespace: MachineSetView, cluster: dict[str, Any] | None
) -> None:
    for candidate in namespace.machines:
        assessment = assess(candidate, machine_set=namespace, cluster=cluster)
        if not assessment.allowed:
            phase = f"{candidate.phase} and " if candidate.phase else ""
            assert assessment.message.startswith(f'machine "{candidate.metadata.name}" is {phase}')
            assert assessment.message.endswith(f"{P}=false; a user's delete is not blocked")


@given(namespace=namespaces(), cluster=_CLUSTERS, native=st.booleans())
def test_the_cluster_is_left_unread_only_where_it_changes_nothing(
    namespace: MachineSetView, cluster: dict[str, Any] | None, native: bool
) -> None:
    chosen = NATIVE if native else SETTINGS
    for candidate in namespace.machines:
        if next_need(candidate, settings_=chosen, machine_set=namespace) != ReadCluster(NAMESPACE):
            without = assess(candidate, machine_set=namespace, settings_=chosen)
            assert (
                assess(candidate, machine_set=namespace, cluster=cluster, settings_=chosen).allowed == without.allowed
            )


_PROVIDER_CONFIGS = st.sampled_from(
    [
        None,
        {"apiVersion": "machine-preservation.extensions.gardener.cloud/v1alpha1", "kind": "PreservationConfig"},
        "not a config",
    ]
)


@given(namespace=namespaces(), cluster=_CLUSTERS, provider_config=_PROVIDER_CONFIGS, as_string=st.booleans())
def test_the_guard_judges_the_same_from_the_cluster_as_cached(
    namespace: MachineSetView, cluster: dict[str, Any] | None, provider_config: Any, as_string: bool
) -> None:
    """The webhook's cache keeps only `cluster_as_read` of each Cluster; the guard must answer the same from it."""
    if cluster is None:
        return
    shoot = cluster["spec"]["shoot"]
    shoot["metadata"]["managedFields"] = [{"manager": "gardenlet"}]
    shoot["spec"]["extensions"] = [{"type": "machine-preservation", "providerConfig": provider_config}]
    cluster["spec"]["seed"] = {"spec": {"provider": {"type": "aws"}}}
    if as_string:
        cluster["spec"]["shoot"] = json.dumps(shoot)
    cached = cluster_as_read(cluster)
    assert set(cached["spec"]) == {"shoot"}
    assert read_cluster(cached) == read_cluster(cluster)
    for candidate in namespace.machines:
        full = assess(candidate, machine_set=namespace, cluster=cluster)
        assert assess(candidate, machine_set=namespace, cluster=cached) == full


def test_a_cluster_as_cached_keeps_what_does_not_parse_as_it_is() -> None:
    for spec in ({}, {"shoot": "{not json"}, {"shoot": []}, {"shoot": {"spec": "x", "metadata": 1}}, []):
        raw = {"metadata": {"name": "shoot--p--s"}, "spec": spec}
        assert read_cluster(cluster_as_read(raw)) == read_cluster(raw)
        assert shoot_lifecycle(cluster_as_read(raw)) == shoot_lifecycle(raw)


# --- Gardener's extension mode: the shoot's Extension ------------------------------------------------------------


def extension(*, deleting: bool = False, last: tuple[str, str] | None = ("Reconcile", "Succeeded")) -> dict[str, Any]:
    """The shoot namespace's Extension of type machine-preservation as the API serves it; `last`: the last
    operation's (type, state)."""
    metadata: dict[str, Any] = {"name": "machine-preservation", "namespace": "shoot--p--s", "generation": 1}
    if deleting:
        metadata["deletionTimestamp"] = NOW.isoformat()
        metadata["finalizers"] = ["extensions.gardener.cloud/machine-preservation"]
    status: dict[str, Any] = {}
    if last is not None:
        status["lastOperation"] = {"type": last[0], "state": last[1], "progress": 100}
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Extension",
        "metadata": metadata,
        "spec": {"type": "machine-preservation"},
        "status": status,
    }


ENABLED = ShootExtension.read(extension())
ABSENT = ShootExtension.read(None)
WHEN_FAILED = machine(annotations={P: "when-failed"})


def _extension_rows() -> list[Any]:
    budget = view(machine_set(replicas=2, max_=1), [machine(), healthy("h1")])
    released = Outcome.EXTENSION_RELEASED
    return [
        # Unknown (not the extension, or no Extension kind): today's answer.
        pytest.param(PRESERVED, {"machine_set": PRESERVED_SET}, None, Outcome.PRESERVED, id="unknown-preserved"),
        pytest.param(WHEN_FAILED, {}, None, Outcome.PENDING_BY_VALUE, id="unknown-pending"),
        # Enabled: the guard as ever, also in the middle of a migration or after a restore.
        pytest.param(PRESERVED, {"machine_set": PRESERVED_SET}, ENABLED, Outcome.PRESERVED, id="enabled"),
        pytest.param(WHEN_FAILED, {}, ENABLED, Outcome.PENDING_BY_VALUE, id="enabled-pending"),
        pytest.param(
            WHEN_FAILED, {}, ShootExtension.read(extension(last=None)), Outcome.PENDING_BY_VALUE, id="created-not-yet"
        ),
        pytest.param(
            PRESERVED,
            {},
            ShootExtension.read(extension(last=("Migrate", "Processing"))),
            Outcome.PRESERVED,
            id="migration-under-way",
        ),
        pytest.param(
            PRESERVED,
            {},
            ShootExtension.read(extension(last=("Migrate", "Error"))),
            Outcome.PRESERVED,
            id="migration-failed",
        ),
        pytest.param(
            PRESERVED,
            {},
            ShootExtension.read(extension(last=("Restore", "Succeeded"))),
            Outcome.PRESERVED,
            id="restored-here",
        ),
        # Disabled, being disabled, migrated away: every delete passes.
        pytest.param(PRESERVED, {"machine_set": PRESERVED_SET}, ABSENT, released, id="gone-preserved"),
        pytest.param(WHEN_FAILED, {}, ABSENT, released, id="gone-leftover-when-failed"),
        pytest.param(machine(annotations={P: "now"}), {}, ABSENT, released, id="gone-leftover-now"),
        pytest.param(machine(), {"machine_set": budget}, ABSENT, released, id="gone-budget"),
        pytest.param(
            WHEN_FAILED, {}, ShootExtension.read(extension(deleting=True)), released, id="being-deleted-pending"
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": PRESERVED_SET},
            ShootExtension.read(extension(deleting=True)),
            released,
            id="being-deleted-preserved",
        ),
        pytest.param(
            PRESERVED,
            {"machine_set": PRESERVED_SET},
            ShootExtension.read(extension(last=("Migrate", "Succeeded"))),
            released,
            id="migrated-away",
        ),
        # What passed without it passes with it, whatever it says.
        pytest.param(PRESERVED, {"username": "alice"}, ENABLED, Outcome.NOT_GUARDED, id="a-user"),
        pytest.param(machine(), {}, ENABLED, Outcome.NOT_KEPT, id="not-kept"),
        pytest.param(machine(), {}, ABSENT, Outcome.NOT_KEPT, id="not-kept-gone"),
        pytest.param(
            PRESERVED, {"cluster": gardener(hibernated=True)}, ABSENT, Outcome.SHOOT_GOING_AWAY, id="shoot-first"
        ),
    ]


@pytest.mark.parametrize(("candidate", "context", "shoot_extension", "expected"), _extension_rows())
def test_a_disabled_or_migrated_extension_lets_every_delete_pass(
    candidate: Machine, context: dict[str, Any], shoot_extension: ShootExtension | None, expected: Outcome
) -> None:
    username = context.pop("username", MCM)
    assessment = assess(candidate, username=username, extension=shoot_extension, **context)
    assert assessment.outcome == expected
    assert assessment.allowed == (expected not in DENIALS)
    verdict = assessment.verdict()
    assert (verdict.allowed, verdict.message) == (assessment.allowed, "" if assessment.allowed else assessment.message)


def test_the_release_by_the_extension_says_why() -> None:
    def why(shoot_extension: ShootExtension) -> str:
        return assess(WHEN_FAILED, extension=shoot_extension).message

    assert why(ABSENT) == (
        'machine "m1": the extension is disabled for the Shoot (its Extension "machine-preservation" is gone)'
    )
    assert why(ShootExtension.read(extension(deleting=True))) == (
        'machine "m1": the extension is being disabled for the Shoot '
        '(its Extension "machine-preservation" is being deleted)'
    )
    assert why(ShootExtension.read(extension(last=("Migrate", "Succeeded")))) == (
        'machine "m1": the Shoot has been migrated to another seed (its Extension "machine-preservation" was migrated)'
    )
    assert ENABLED.released() == ""


def test_the_extension_is_read_as_gardener_writes_it() -> None:
    assert ShootExtension(present=False) == ABSENT
    assert ShootExtension() == ENABLED
    assert ShootExtension.read({}) == ShootExtension()  # nothing said: it is there, so enabled
    assert ShootExtension.read({"metadata": None, "status": None}) == ShootExtension()
    assert ShootExtension.read(extension(deleting=True)) == ShootExtension(deleting=True)
    assert ShootExtension.read(extension(last=("Migrate", "Succeeded"))) == ShootExtension(migrated=True)
    for not_yet in (("Migrate", "Processing"), ("Migrate", "Error"), ("Delete", "Succeeded")):
        assert ShootExtension.read(extension(last=not_yet)) == ShootExtension()
    with pytest.raises(ValidationError):
        ShootExtension.read({"metadata": "raw"})


@pytest.mark.parametrize(
    ("candidate", "context", "read"),
    [
        pytest.param(PRESERVED, {"username": "alice"}, False, id="a-users-delete"),
        pytest.param(PRESERVED, {"machine_set": PRESERVED_SET}, True, id="a-denial"),
        pytest.param(WHEN_FAILED, {}, True, id="a-pending-denial"),
        pytest.param(PRESERVED, {"machine_set": view(machine_set(replicas=0), [PRESERVED])}, False, id="scaled-down"),
        pytest.param(PRESERVED, {"cluster": gardener(hibernated=True)}, False, id="the-shoot-lifted-it"),
        pytest.param(machine(), {}, False, id="not-kept"),
    ],
)
def test_the_extension_is_read_only_for_a_denial(candidate: Machine, context: dict[str, Any], read: bool) -> None:
    username = context.pop("username", MCM)
    reads = {"machine_set": None, "cluster": None, **context}
    assert (next_need(candidate, username=username, **reads) == ReadExtension(NAMESPACE)) is read


_EXTENSIONS = st.none() | st.builds(
    ShootExtension, present=st.booleans(), deleting=st.booleans(), migrated=st.booleans()
)


@given(namespace=namespaces(), cluster=_CLUSTERS, shoot_extension=_EXTENSIONS, native=st.booleans())
def test_the_extension_only_ever_lifts_a_denial(
    namespace: MachineSetView, cluster: dict[str, Any] | None, shoot_extension: ShootExtension | None, native: bool
) -> None:
    """Released: every delete passes. Otherwise (or unknown) the answer is the one without it. Unread (no denial to
    lift), it would change nothing."""
    chosen = NATIVE if native else SETTINGS
    for candidate in namespace.machines:
        common: dict[str, Any] = {"settings_": chosen, "machine_set": namespace, "cluster": cluster}
        without = assess(candidate, **common)
        withit = assess(candidate, **common, extension=shoot_extension)
        if shoot_extension is not None and shoot_extension.released():
            assert withit.allowed
        else:
            assert withit == without
        if next_need(candidate, **common) != ReadExtension(NAMESPACE):
            assert withit == without


# --- What the guard asks to read: one loop in the shell ----------------------------------------------------------


@dataclass(frozen=True)
class World:
    """What a read of each kind finds (None: there is none)."""

    machine_set: MachineSetView | None = None
    cluster: dict[str, Any] | None = None
    extension: ShootExtension | None = None


def run_loop(m: Machine, world: World, *, username: str = MCM, settings_: AdmissionSettings = SETTINGS) -> Any:
    """The shell's loop, over `world`: ask, read what is needed, ask again. Returns the verdict and the needs in
    the order they were asked for; fails if a kind is asked for twice or the verdict takes more reads than kinds."""
    deletion = request(m, username=username, settings_=settings_)
    reads, needs = Reads(), []
    step = assess_machine_deletion(deletion, reads)
    while not isinstance(step, Assessment):
        assert type(step) not in {type(n) for n in needs}, f"{step} asked for again after {needs}"
        assert len(needs) < len(NEEDS)
        needs.append(step)
        if isinstance(step, ReadMachineSet):
            assert step == ReadMachineSet(NAMESPACE, "ms")
            reads = replace(reads, machine_set=world.machine_set)
        elif isinstance(step, ReadCluster):
            assert step == ReadCluster(NAMESPACE)
            reads = replace(reads, cluster=world.cluster)
        else:
            assert step == ReadExtension(NAMESPACE, "machine-preservation")
            reads = replace(reads, extension=world.extension)
        step = assess_machine_deletion(deletion, reads)
    return step, needs


MS, CLUSTER, EXTENSION = ReadMachineSet(NAMESPACE, "ms"), ReadCluster(NAMESPACE), ReadExtension(NAMESPACE)


@pytest.mark.parametrize(
    ("candidate", "world", "username", "needs", "expected"),
    [
        pytest.param(PRESERVED, World(PRESERVED_SET), "alice", [], Outcome.NOT_GUARDED, id="a-user-reads-nothing"),
        pytest.param(
            machine(preserved=ACTIVE, labels={FORCE_DELETION_LABEL: "True"}),
            World(PRESERVED_SET),
            MCM,
            [],
            Outcome.FORCE_DELETION,
            id="forced-deletion-reads-nothing",
        ),
        pytest.param(
            PRESERVED,
            World(PRESERVED_SET, gardener(), ENABLED),
            MCM,
            [MS, CLUSTER, EXTENSION],
            Outcome.PRESERVED,
            id="a-denial-reads-all-three",
        ),
        pytest.param(
            PRESERVED,
            World(view(machine_set(replicas=0), [PRESERVED]), gardener(), ENABLED),
            MCM,
            [MS],
            Outcome.MACHINE_SET_SURPLUS,
            id="the-counts-release-after-one-read",
        ),
        pytest.param(
            PRESERVED,
            World(PRESERVED_SET, gardener(hibernated=True), ENABLED),
            MCM,
            [MS, CLUSTER],
            Outcome.SHOOT_GOING_AWAY,
            id="the-shoot-releases-after-two-reads",
        ),
        pytest.param(
            PRESERVED,
            World(PRESERVED_SET, gardener(), ABSENT),
            MCM,
            [MS, CLUSTER, EXTENSION],
            Outcome.EXTENSION_RELEASED,
            id="the-extension-releases-after-three-reads",
        ),
        pytest.param(
            machine(),
            World(v061([machine()]), gardener(workers=POOL), ENABLED),
            MCM,
            [MS, CLUSTER, EXTENSION],
            Outcome.PENDING_BY_BUDGET,
            id="a-budget-only-the-shoot-knows",
        ),
        pytest.param(
            machine(),
            World(view(machine_set(max_=0), [machine()]), gardener(workers=POOL), ENABLED),
            MCM,
            [MS],
            Outcome.NOT_KEPT,
            id="a-budget-the-set-carries",
        ),
        pytest.param(
            machine(owner=""),
            World(None, gardener(), ENABLED),
            MCM,
            [],
            Outcome.NOT_KEPT,
            id="no-machine-set-no-budget",
        ),
        pytest.param(
            machine(owner="", annotations={P: "now"}),
            World(None, gardener(), ENABLED),
            MCM,
            [CLUSTER, EXTENSION],
            Outcome.PENDING_BY_VALUE,
            id="no-machine-set-still-denied",
        ),
        pytest.param(
            WHEN_FAILED,
            World(None, None, None),
            MCM,
            [MS, CLUSTER, EXTENSION],
            Outcome.PENDING_BY_VALUE,
            id="the-machine-set-is-gone",
        ),
    ],
)
def test_the_guard_asks_for_each_object_in_order_and_once(
    candidate: Machine, world: World, username: str, needs: list[Need], expected: Outcome
) -> None:
    verdict, asked = run_loop(candidate, world, username=username)
    assert asked == needs
    assert verdict.outcome == expected


_CANDIDATES = [
    PRESERVED,
    WHEN_FAILED,
    machine(),
    machine(annotations={P: "false"}),
    machine(annotations={P: "auto-preserve"}),
    machine(phase="Running", preserved=ACTIVE),
    machine(phase="Running", annotations={P: "now"}),
    machine(preserved=(NOW - dt.timedelta(hours=3), NOW)),
    machine(preserved=ACTIVE, labels={FORCE_DELETION_LABEL: "True"}),
    machine(preserved=ACTIVE, deleting=True),
    machine(owner=""),
    machine(owner="", preserved=ACTIVE),
]
# Each lists the judged machine ("m1") as the request shows it, beside these.
_MACHINE_SETS = [
    None,
    view(machine_set(replicas=3), [healthy("h1"), healthy("h2")]),
    view(machine_set(replicas=0), [machine("m2", preserved=ACTIVE, node="n2")]),
    view(machine_set(replicas=2, max_=1), [machine("m2", node="n2"), healthy("h1")]),
    v061([machine("m2", preserved=ACTIVE, node="n2"), healthy("h1")]),
]
_WORLD_CLUSTERS = [None, gardener(), gardener(hibernated=True), gardener(workers=POOL)]
_WORLD_EXTENSIONS = [None, ENABLED, ABSENT, ShootExtension(deleting=True)]


def _listing(namespace: MachineSetView | None, candidate: Machine) -> MachineSetView | None:
    """`namespace` as a read finds it when judging `candidate`: listing the candidate as the request shows it;
    None when the candidate has no MachineSet to read."""
    if namespace is None or not candidate.metadata.controller_name("MachineSet"):
        return None
    others = [m for m in namespace.machines if m.metadata.name != candidate.metadata.name]
    return replace(namespace, machines=[candidate, *others])


def _check_loop(candidate: Machine, world: World, username: str, settings_: AdmissionSettings) -> None:
    world = replace(world, machine_set=_listing(world.machine_set, candidate))
    verdict, needs = run_loop(candidate, world, username=username, settings_=settings_)
    # In the order of NEEDS, each kind once at most (run_loop fails on a repeat).
    assert [type(n) for n in needs] == [kind for kind in NEEDS if kind in {type(n) for n in needs}]
    everything = assess(
        candidate,
        username=username,
        settings_=settings_,
        machine_set=world.machine_set,
        cluster=world.cluster,
        extension=world.extension,
    )
    # What is left unread would not change whether the delete passes.
    assert verdict.allowed == everything.allowed
    if not verdict.allowed:
        assert needs[-1] == EXTENSION  # a denial has asked for everything that might lift it
        assert verdict == everything


def test_the_loop_never_reads_a_kind_twice_exhaustively() -> None:
    for candidate in _CANDIDATES:
        for username in (MCM, "alice", CONTROLLER):
            for settings_ in (SETTINGS, NATIVE):
                for machine_set_ in _MACHINE_SETS:
                    for cluster in _WORLD_CLUSTERS:
                        for shoot_extension in _WORLD_EXTENSIONS:
                            world = World(machine_set_, cluster, shoot_extension)
                            _check_loop(candidate, world, username, settings_)


@given(
    namespace=namespaces(),
    gone=st.booleans(),
    cluster=_CLUSTERS,
    shoot_extension=_EXTENSIONS,
    native=st.booleans(),
    username=st.sampled_from([MCM, "alice"]),
)
def test_the_loop_never_reads_a_kind_twice(
    namespace: MachineSetView,
    gone: bool,
    cluster: dict[str, Any] | None,
    shoot_extension: ShootExtension | None,
    native: bool,
    username: str,
) -> None:
    world = World(None if gone else namespace, cluster, shoot_extension)
    for candidate in namespace.machines:
        _check_loop(candidate, world, username, NATIVE if native else SETTINGS)


def test_a_need_is_never_for_a_kind_already_read() -> None:
    """Whatever has been read, in whichever combination, the guard asks only for a kind still unread."""
    found = {"machine_set": PRESERVED_SET, "cluster": gardener(), "extension": ENABLED}
    kinds = {"machine_set": ReadMachineSet, "cluster": ReadCluster, "extension": ReadExtension}
    for candidate in _CANDIDATES:
        for read in itertools.product([False, True], repeat=3):
            given_ = {name: found[name] for name, done in zip(found, read, strict=True) if done}
            need = next_need(candidate, **given_)
            if need is not None:
                assert type(need) not in {kinds[name] for name in given_}
