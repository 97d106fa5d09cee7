"""The Gardener Extension contract (core.extension): which operation, the metadata steps around it, the status
patches, readiness as gardenlet judges it, the ControlPlaneHealthy condition and the heartbeat Lease."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.gardener import extension as e
from machine_preservation.core.gardener.extension import (
    FINALIZER,
    ConditionStatus,
    ErrorCode,
    Extension,
    OperationType,
    decide,
)
from machine_preservation.localcluster.gardener import extension_ready

NOW = dt.datetime(2026, 11, 26, 18, 30, 15, 250000, tzinfo=dt.UTC)
STAMP = "2026-11-26T18:30:15Z"
DELETED = "2026-11-26T18:00:00Z"
OTHER = "other.example.com/finalizer"

C, R, D, M, S = (
    OperationType.CREATE,
    OperationType.RECONCILE,
    OperationType.DELETE,
    OperationType.MIGRATE,
    OperationType.RESTORE,
)


def ext(
    *,
    annotation: str | None = None,
    deleting: bool = False,
    last: tuple[str, str] | None = None,
    finalizers: tuple[str, ...] = (FINALIZER,),
    generation: int = 1,
    observed: int = 1,
    timestamp: str | None = None,
    last_update: str = STAMP,
    last_error: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> Extension:
    annotations = {} if annotation is None else {e.OPERATION_ANNOTATION: annotation}
    if timestamp is not None:
        annotations[e.TIMESTAMP_ANNOTATION] = timestamp
    status: dict[str, Any] = {"observedGeneration": observed}
    if last is not None:
        status["lastOperation"] = {
            "type": last[0],
            "state": last[1],
            "progress": 100,
            "description": "x",
            "lastUpdateTime": last_update,
        }
    if last_error is not None:
        status["lastError"] = {"description": last_error, "codes": None}
    if conditions is not None:
        status["conditions"] = conditions
    return Extension.model_validate(
        {
            "apiVersion": e.API_VERSION,
            "kind": e.KIND,
            "metadata": {
                "name": "machine-preservation",
                "namespace": "shoot--p--s",
                "generation": generation,
                "resourceVersion": "7",
                "annotations": annotations,
                "finalizers": list(finalizers),
                **({"deletionTimestamp": DELETED} if deleting else {}),
            },
            "spec": {"type": "machine-preservation", "providerConfig": {"workers": []}},
            "status": status,
        }
    )


# --- §4 item 1 and 2: whether to act and which operation --------------------------------------------------------

OPERATION_TABLE: list[tuple[str | None, bool, tuple[str, str] | None, OperationType | None]] = [
    # annotation, deleting, lastOperation (type, state) → operation (None: nothing to do)
    (None, False, None, C),
    (None, False, ("Create", "Processing"), C),
    (None, False, ("Create", "Error"), C),
    (None, False, ("Create", "Succeeded"), None),
    (None, False, ("Reconcile", "Succeeded"), None),
    (None, False, ("Reconcile", "Error"), R),
    (None, False, ("Reconcile", "Processing"), R),
    (None, False, ("Migrate", "Error"), M),
    (None, False, ("Restore", "Error"), S),
    (None, False, ("Restore", "Processing"), S),
    (None, False, ("Delete", "Error"), R),
    (None, False, ("Restore", "Succeeded"), None),
    ("reconcile", False, None, C),
    ("reconcile", False, ("Create", "Error"), C),
    ("reconcile", False, ("Create", "Succeeded"), R),
    ("reconcile", False, ("Reconcile", "Succeeded"), R),
    ("reconcile", False, ("Migrate", "Error"), M),
    ("reconcile", False, ("Restore", "Error"), S),
    ("migrate", False, None, M),
    ("migrate", False, ("Reconcile", "Succeeded"), M),
    ("migrate", True, ("Reconcile", "Succeeded"), M),
    ("migrate", False, ("Migrate", "Succeeded"), M),
    ("restore", False, None, S),
    ("restore", False, ("Reconcile", "Succeeded"), S),
    ("restore", False, ("Migrate", "Succeeded"), S),
    ("restore", True, ("Reconcile", "Succeeded"), D),
    (None, True, ("Reconcile", "Succeeded"), D),
    (None, True, None, D),
    ("reconcile", True, ("Reconcile", "Succeeded"), D),
    (None, True, ("Delete", "Error"), D),
    # already migrated: only migrate and restore act
    (None, False, ("Migrate", "Succeeded"), None),
    ("reconcile", False, ("Migrate", "Succeeded"), None),
    (None, True, ("Migrate", "Succeeded"), None),
    # wait-for-state: hands off, whatever else holds
    ("wait-for-state", False, None, None),
    ("wait-for-state", True, ("Reconcile", "Error"), None),
    ("wait-for-state", False, ("Restore", "Error"), None),
    # annotations that are not for extensions act like none
    ("keepalive", False, ("Reconcile", "Succeeded"), None),
    ("renew-kubeconfig", False, ("Reconcile", "Error"), R),
]


@pytest.mark.parametrize(("annotation", "deleting", "last", "expected"), OPERATION_TABLE)
def test_operation_table(
    annotation: str | None, deleting: bool, last: tuple[str, str] | None, expected: OperationType | None
) -> None:
    action = decide(ext(annotation=annotation, deleting=deleting, last=last), shoot_failed=False)
    assert (action.type if action else None) == expected


# --- §4 item 3: skips ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("annotation", "deleting", "last", "expected"), OPERATION_TABLE)
def test_failed_shoot_is_never_acted_on(
    annotation: str | None, deleting: bool, last: tuple[str, str] | None, expected: OperationType | None
) -> None:
    assert decide(ext(annotation=annotation, deleting=deleting, last=last), shoot_failed=True) is None


def test_delete_without_our_finalizer_is_a_no_op() -> None:
    assert decide(ext(deleting=True, finalizers=(OTHER,)), shoot_failed=False) is None
    assert decide(ext(deleting=True, finalizers=()), shoot_failed=False) is None


@pytest.mark.parametrize(
    ("cluster", "failed"),
    [
        (None, False),
        ({}, False),
        ({"spec": {"shoot": None}}, False),
        ({"spec": {"shoot": {"status": {}}}}, False),
        ({"spec": {"shoot": {"status": {"lastOperation": {"state": "Succeeded"}}}}}, False),
        ({"spec": {"shoot": {"status": {"lastOperation": {"state": "Error"}}}}}, False),
        ({"spec": {"shoot": {"status": {"lastOperation": {"state": "Failed"}}}}}, True),
        ({"spec": "garbage"}, False),
    ],
)
def test_shoot_failed_reads_the_cluster(cluster: Any, failed: bool) -> None:
    assert e.shoot_failed(cluster) is failed


# --- §4 items 4-7: the steps around each operation ----------------------------------------------------------------


STEPS_TABLE: list[tuple[Extension, tuple[OperationType, bool, bool, bool, bool, bool]]] = [
    # type, remove_annotation_first, add_finalizer, remove_finalizer, remove_all_finalizers, remove_annotation_after
    (ext(finalizers=()), (C, False, True, False, False, False)),
    (ext(last=("Create", "Error")), (C, False, False, False, False, False)),
    (ext(annotation="reconcile", last=("Reconcile", "Succeeded")), (R, True, False, False, False, False)),
    (ext(annotation="reconcile", last=("Reconcile", "Succeeded"), finalizers=()), (R, True, True, False, False, False)),
    (ext(deleting=True, last=("Reconcile", "Succeeded")), (D, False, False, True, False, False)),
    (ext(annotation="reconcile", deleting=True, last=("Reconcile", "Succeeded")), (D, True, False, True, False, False)),
    (ext(annotation="migrate", last=("Reconcile", "Succeeded")), (M, False, False, False, True, True)),
    (ext(annotation="migrate", finalizers=()), (M, False, False, False, True, True)),
    (ext(annotation="restore", finalizers=()), (S, False, True, False, False, True)),
    (ext(annotation="restore", last=("Migrate", "Succeeded")), (S, False, False, False, False, True)),
    (ext(annotation="reconcile", last=("Restore", "Error")), (S, True, False, False, False, False)),
    (ext(last=("Restore", "Error")), (S, False, False, False, False, True)),
]


@pytest.mark.parametrize(("extension", "steps"), STEPS_TABLE)
def test_steps_around_the_operation(
    extension: Extension, steps: tuple[OperationType, bool, bool, bool, bool, bool]
) -> None:
    action = decide(extension, shoot_failed=False)
    assert action is not None
    assert (
        action.type,
        action.remove_annotation_first,
        action.add_finalizer,
        action.remove_finalizer,
        action.remove_all_finalizers,
        action.remove_annotation_after,
    ) == steps


@pytest.mark.parametrize("kind", list(OperationType))
def test_every_operation_has_descriptions(kind: OperationType) -> None:
    action = e.Action(kind, False, False, False, False, False)
    texts = {action.processing_description, action.succeeded_description, action.error_description}
    assert len(texts) == 3
    assert all(texts)


# --- properties ---------------------------------------------------------------------------------------------------

ANNOTATIONS = st.sampled_from([None, "reconcile", "migrate", "restore", "wait-for-state", "keepalive", ""])
LAST_OPS = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from(["Create", "Reconcile", "Delete", "Migrate", "Restore", "LiveMigrate", ""]),
        st.sampled_from(["Processing", "Succeeded", "Error", "Failed", "Pending", "Aborted", ""]),
    ),
)
FINALIZERS = st.sampled_from([(), (FINALIZER,), (OTHER,), (OTHER, FINALIZER)])


@st.composite
def extensions(draw: st.DrawFn) -> Extension:
    return ext(
        annotation=draw(ANNOTATIONS),
        deleting=draw(st.booleans()),
        last=draw(LAST_OPS),
        finalizers=draw(FINALIZERS),
    )


@given(extensions(), st.booleans())
def test_wait_for_state_never_acts(extension: Extension, failed: bool) -> None:
    if extension.operation_annotation == "wait-for-state":
        assert decide(extension, shoot_failed=failed) is None


@given(extensions())
def test_migrate_wins_over_everything(extension: Extension) -> None:
    action = decide(extension, shoot_failed=False)
    if extension.operation_annotation == "migrate":
        assert action is not None
        assert action.type == OperationType.MIGRATE


@given(extensions())
def test_delete_wins_over_restore(extension: Extension) -> None:
    action = decide(extension, shoot_failed=False)
    if extension.deleting and extension.operation_annotation != "migrate" and action is not None:
        assert action.type == OperationType.DELETE


@given(extensions())
def test_work_without_finalizer_adds_it_first(extension: Extension) -> None:
    action = decide(extension, shoot_failed=False)
    if action is not None and action.type in (C, R, S):
        assert action.add_finalizer == (FINALIZER not in extension.metadata.finalizers)
    if action is not None and action.type in (D, M):
        assert not action.add_finalizer


@given(extensions())
def test_reconcile_annotation_goes_first_and_only_it(extension: Extension) -> None:
    action = decide(extension, shoot_failed=False)
    if action is not None:
        assert action.remove_annotation_first == (extension.operation_annotation == "reconcile")
        assert not (action.remove_annotation_first and action.remove_annotation_after)
        if extension.operation_annotation in ("migrate", "restore") and action.type in (M, S):
            assert action.remove_annotation_after


@given(extensions())
def test_succeeded_without_request_is_left_alone(extension: Extension) -> None:
    last = extension.status.last_operation
    requested = extension.operation_annotation in ("reconcile", "migrate", "restore")
    if last is not None and last.state == "Succeeded" and not requested and not extension.deleting:
        assert decide(extension, shoot_failed=False) is None


@given(extensions())
def test_decide_is_idempotent_on_snapshots(extension: Extension) -> None:
    assert decide(extension, shoot_failed=False) == decide(extension, shoot_failed=False)


# --- metadata patches ---------------------------------------------------------------------------------------------


def test_remove_operation_annotation_keeps_the_timestamp() -> None:
    assert e.remove_operation_annotation_patch() == {"metadata": {"annotations": {e.OPERATION_ANNOTATION: None}}}
    assert e.remove_operation_annotation_patch("9")["metadata"]["resourceVersion"] == "9"


def test_finalizer_patches() -> None:
    assert e.finalizers_patch(ext(finalizers=(OTHER,)), add=True) == {
        "metadata": {"finalizers": [OTHER, FINALIZER], "resourceVersion": "7"}
    }
    assert e.finalizers_patch(ext(finalizers=(FINALIZER,)), add=True) is None
    assert e.finalizers_patch(ext(finalizers=(OTHER, FINALIZER)), remove=True) == {
        "metadata": {"finalizers": [OTHER], "resourceVersion": "7"}
    }
    assert e.finalizers_patch(ext(finalizers=(OTHER,)), remove=True) is None
    assert e.finalizers_patch(ext(finalizers=(OTHER, FINALIZER)), clear=True) == {
        "metadata": {"finalizers": [], "resourceVersion": "7"}
    }
    assert e.finalizers_patch(ext(finalizers=()), clear=True) is None


# --- status patches -----------------------------------------------------------------------------------------------


def test_processing_patch() -> None:
    assert e.processing(R, NOW, "Reconciling the Extension") == {
        "status": {
            "lastOperation": {
                "type": "Reconcile",
                "state": "Processing",
                "progress": 1,
                "description": "Reconciling the Extension",
                "lastUpdateTime": STAMP,
            }
        }
    }


def test_succeeded_patch_clears_the_error_and_observes_the_generation() -> None:
    patch = e.succeeded(C, NOW, generation=4, description="done")
    assert patch == {
        "status": {
            "lastOperation": {
                "type": "Create",
                "state": "Succeeded",
                "progress": 100,
                "description": "done",
                "lastUpdateTime": STAMP,
            },
            "lastError": None,
            "observedGeneration": 4,
        }
    }
    assert e.succeeded(M, NOW, generation=4, description="done", state={"records": []})["status"]["state"] == {
        "records": []
    }


def test_error_patch() -> None:
    text = e.error_text("error reconciling the Extension", "providerConfig.workers[0].name: Not found")
    assert text == "Error reconciling the Extension: providerConfig.workers[0].name: Not found"
    patch = e.error(R, NOW, generation=3, description=text, codes=[ErrorCode.CONFIGURATION_PROBLEM])
    assert patch == {
        "status": {
            "lastOperation": {
                "type": "Reconcile",
                "state": "Error",
                "progress": 50,
                "description": text,
                "lastUpdateTime": STAMP,
            },
            "lastError": {
                "description": text,
                "codes": ["ERR_CONFIGURATION_PROBLEM"],
                "taskID": None,
                "lastUpdateTime": STAMP,
            },
            "observedGeneration": 3,
        }
    }
    assert e.error(R, NOW, generation=3, description="x")["status"]["lastError"]["codes"] is None


# --- §4 item 8: our patches against readiness as gardenlet judges it -----------------------------------------------


@pytest.mark.parametrize(
    ("extension", "problem"),
    [
        (ext(last=("Reconcile", "Succeeded")), None),
        (ext(last=("Reconcile", "Succeeded"), timestamp=STAMP), None),
        # the timestamp counts in whole seconds
        (ext(last=("Reconcile", "Succeeded"), timestamp="2026-11-26T18:30:15.999999Z"), None),
        (ext(last=("Reconcile", "Succeeded"), timestamp="2026-11-26T18:30:16Z"), "not reconciled yet"),
        (ext(last=("Reconcile", "Succeeded"), timestamp="yesterday"), "cannot parse"),
        (ext(last=("Reconcile", "Succeeded"), last_error="boom"), "error during reconciliation: boom"),
        (ext(last=("Reconcile", "Succeeded"), generation=2), "observed generation outdated (1/2)"),
        (ext(last=("Reconcile", "Succeeded"), annotation="reconcile"), "not yet picked up"),
        (ext(last=("Reconcile", "Succeeded"), annotation="wait-for-state"), "not yet picked up"),
        (ext(), "did not record a last operation"),
        (ext(last=("Reconcile", "Processing")), "not succeeded but Processing"),
        (ext(last=("Reconcile", "Error")), "not succeeded but Error"),
    ],
)
def test_readiness(extension: Extension, problem: str | None) -> None:
    # Judged by the gardenlet stand-in the tests and the playground use (gardenlet's CheckExtensionObject).
    found = extension_ready(extension.model_dump(by_alias=True))
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_a_succeeded_patch_makes_the_object_ready() -> None:
    before = ext(annotation="reconcile", generation=5, observed=4, last=("Reconcile", "Error"), last_error="x")
    after = before.model_dump(by_alias=True)
    del after["metadata"]["annotations"][e.OPERATION_ANNOTATION]
    after["metadata"]["annotations"][e.TIMESTAMP_ANNOTATION] = STAMP
    after["status"].update(e.succeeded(R, NOW, generation=5, description="ok")["status"])
    assert extension_ready(after) is None


# --- the ControlPlaneHealthy condition ------------------------------------------------------------------------------


def test_condition_times_move_only_on_change() -> None:
    first = e.control_plane_healthy(ext(), status=ConditionStatus.TRUE, reason="Healthy", message="ok", now=NOW)
    assert first is not None
    (condition,) = first["status"]["conditions"]
    assert condition == {
        "type": "ControlPlaneHealthy",
        "status": "True",
        "reason": "Healthy",
        "message": "ok",
        "lastTransitionTime": STAMP,
        "lastUpdateTime": STAMP,
    }
    later = NOW + dt.timedelta(minutes=5)
    again = ext(conditions=[condition])
    assert (
        e.control_plane_healthy(again, status=ConditionStatus.TRUE, reason="Healthy", message="ok", now=later) is None
    )

    reworded = e.control_plane_healthy(again, status=ConditionStatus.TRUE, reason="Healthy", message="fine", now=later)
    assert reworded is not None
    assert reworded["status"]["conditions"][0]["lastTransitionTime"] == STAMP
    assert reworded["status"]["conditions"][0]["lastUpdateTime"] == "2026-11-26T18:35:15Z"

    flipped = e.control_plane_healthy(
        again,
        status=ConditionStatus.FALSE,
        reason="ShootUnreachable",
        message="no route",
        now=later,
        codes=[ErrorCode.INFRA_DEPENDENCIES],
    )
    assert flipped is not None
    assert flipped["status"]["conditions"][0] == {
        "type": "ControlPlaneHealthy",
        "status": "False",
        "reason": "ShootUnreachable",
        "message": "no route",
        "codes": ["ERR_INFRA_DEPENDENCIES"],
        "lastTransitionTime": "2026-11-26T18:35:15Z",
        "lastUpdateTime": "2026-11-26T18:35:15Z",
    }


def test_other_conditions_are_kept() -> None:
    other = {
        "type": "SystemComponentsHealthy",
        "status": "True",
        "reason": "r",
        "message": "m",
        "lastTransitionTime": STAMP,
        "lastUpdateTime": STAMP,
    }
    patch = e.control_plane_healthy(
        ext(conditions=[other]), status=ConditionStatus.UNKNOWN, reason="Checking", message="", now=NOW
    )
    assert patch is not None
    conditions = patch["status"]["conditions"]
    assert conditions[0] == other
    assert conditions[1]["type"] == "ControlPlaneHealthy"
    assert conditions[1]["message"]  # never empty


@given(
    st.sampled_from(list(ConditionStatus)),
    st.sampled_from(list(ConditionStatus)),
    st.text(max_size=5),
    st.text(max_size=5),
)
def test_transition_time_moves_exactly_when_the_status_does(
    first: ConditionStatus, second: ConditionStatus, message1: str, message2: str
) -> None:
    one = e.updated_condition(None, condition_type="X", status=first, reason="r", message=message1, now=NOW)
    later = NOW + dt.timedelta(seconds=30)
    two = e.updated_condition(
        e.Condition.model_validate(one), condition_type="X", status=second, reason="r", message=message2, now=later
    )
    assert (two["lastTransitionTime"] == one["lastTransitionTime"]) == (first == second)
    assert (two["lastUpdateTime"] == one["lastUpdateTime"]) == (one["message"] == two["message"])


# --- the heartbeat ---------------------------------------------------------------------------------------------------


def test_heartbeat_lease() -> None:
    assert e.heartbeat_lease("extension-machine-preservation-abc", NOW) == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gardener-extension-heartbeat", "namespace": "extension-machine-preservation-abc"},
        "spec": {
            "holderIdentity": "machine-preservation",
            "leaseDurationSeconds": 30,
            "renewTime": "2026-11-26T18:30:15.250000Z",
        },
    }


# --- reading objects -------------------------------------------------------------------------------------------


def test_tolerant_reading() -> None:
    extension = Extension.model_validate(
        {
            "metadata": {"name": "machine-preservation", "annotations": None, "finalizers": None, "extra": 1},
            "spec": None,
            "status": {"conditions": None, "lastError": {"description": "d", "codes": None}, "unknown": True},
        }
    )
    assert extension.metadata.annotations == {}
    assert extension.metadata.finalizers == []
    assert extension.status.conditions == []
    assert extension.status.last_error is not None
    assert extension.status.last_error.codes == []
    assert decide(Extension.model_validate({}), shoot_failed=False) is not None


# --- which updates start work (Gardener's extension predicates) ------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "work"),
    [
        # gardenlet's triggers
        (ext(last=("Reconcile", "Succeeded")), ext(annotation="reconcile", last=("Reconcile", "Succeeded")), True),
        (ext(annotation="wait-for-state"), ext(annotation="restore"), True),
        (ext(timestamp=STAMP), ext(timestamp="2026-11-26T18:31:00Z"), True),
        (ext(generation=1), ext(generation=2), True),
        (ext(), ext(deleting=True), True),
        # our own writes: the annotation removed, status, finalizers
        (ext(annotation="reconcile"), ext(), False),
        (ext(annotation="migrate"), ext(), False),
        (ext(last=("Create", "Processing")), ext(last=("Create", "Error"), last_error="boom"), False),
        (ext(finalizers=()), ext(), False),
        (ext(timestamp=STAMP, annotation="reconcile"), ext(timestamp=STAMP), False),
    ],
)
def test_which_updates_ask_for_work(old: Extension, new: Extension, work: bool) -> None:
    assert e.asks_for_work(old, new) is work


@given(st.sampled_from(["reconcile", "migrate", "restore", "wait-for-state"]))
def test_removing_the_operation_annotation_never_asks_for_work(operation: str) -> None:
    assert not e.asks_for_work(ext(annotation=operation), ext())


@pytest.mark.parametrize(
    ("spec", "ours"),
    [
        ({"type": "machine-preservation"}, True),
        ({"type": "machine-preservation", "class": None}, True),
        ({"type": "machine-preservation", "class": "shoot"}, True),
        ({"type": "machine-preservation", "class": "garden"}, False),
        ({"type": "machine-preservation", "class": "seed"}, False),
        ({"type": "shoot-dns-service"}, False),
        ({}, False),
    ],
)
def test_only_our_type_of_the_shoot_class_is_ours(spec: dict[str, Any], ours: bool) -> None:
    # As Gardener's predicates select Extensions for a controller: HasType and HasClass (absent means shoot).
    extension = Extension.model_validate({"metadata": {"name": "machine-preservation"}, "spec": spec})
    assert extension.ours is ours
