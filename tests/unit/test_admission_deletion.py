"""The deletion guard: MCM may not delete Failed machines that are, or are about to be, preserved."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import (
    MachineSetView,
    judge_machine_deletion,
    last_known_node,
    machine_set_to_read,
)
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import Verdict
from machine_preservation.core.models import Machine, MachineSet

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
CONTROLLER = "system:serviceaccount:mp:controller"
SETTINGS = AdmissionSettings(controller_username=CONTROLLER, mcm_usernames=frozenset({MCM}))


def machine(
    name: str = "m1",
    *,
    phase: str = "Failed",
    expiry: dt.datetime | None = None,
    annotations: dict[str, str] | None = None,
    owner: str = "ms",
    created: dt.datetime = NOW - dt.timedelta(hours=1),
    node: str = "n1",
) -> Machine:
    status: dict[str, Any] = {"phase": phase}
    if expiry is not None:
        status["preserveExpiryTime"] = expiry.isoformat()
    return Machine.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "shoot--p--s",
                "annotations": annotations or {},
                "labels": {"node": node} if node else {},
                "creationTimestamp": created.isoformat(),
                "ownerReferences": [{"kind": "MachineSet", "name": owner, "uid": f"uid-{owner}", "controller": True}]
                if owner
                else [],
            },
            "status": {"currentStatus": status},
        }
    )


def machine_set(name: str = "ms", *, max_: int = 1, created: dt.datetime = NOW - dt.timedelta(days=1)) -> MachineSet:
    return MachineSet.model_validate(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "creationTimestamp": created.isoformat(),
                "ownerReferences": [{"kind": "MachineDeployment", "name": "md", "uid": "uid-md", "controller": True}],
            },
            "spec": {"autoPreserveFailedMachineMax": max_},
        }
    )


def judge(m: Machine, username: str = MCM, view: MachineSetView | None = None) -> Verdict:
    return judge_machine_deletion(machine=m, username=username, settings=SETTINGS, now=NOW, machine_set=view)


def test_mcm_may_not_delete_an_actively_preserved_failed_machine() -> None:
    verdict = judge(machine(expiry=NOW + dt.timedelta(hours=2)))
    assert not verdict.allowed
    assert verdict.code == 403
    assert verdict.message.startswith('machine "m1" is Failed and preserved until 2026-11-21T14:00:00Z; ')
    assert f"{v.PRESERVE_ANNOTATION}=false" in verdict.message


@pytest.mark.parametrize("username", ["alice", CONTROLLER, "system:serviceaccount:other:machine-controller-manager"])
def test_everyone_else_may_delete(username: str) -> None:
    assert judge(machine(expiry=NOW + dt.timedelta(hours=2)), username).allowed
    assert judge(machine(annotations={v.PRESERVE_ANNOTATION: "now"}), username).allowed


@pytest.mark.parametrize(
    "candidate",
    [
        machine(expiry=NOW),  # expired exactly now
        machine(expiry=NOW - dt.timedelta(seconds=1)),
        machine(phase="Running", expiry=NOW + dt.timedelta(hours=1)),  # preserved but healthy: MCM's business
        machine(phase="Terminating", annotations={v.PRESERVE_ANNOTATION: "now"}),
        machine(annotations={v.PRESERVE_ANNOTATION: "false"}),
        machine(annotations={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "false", v.PRESERVE_ANNOTATION: "now"}),
        machine(annotations={v.PRESERVE_ANNOTATION: "garbage"}, owner=""),  # invalid counts as absent, no budget
    ],
)
def test_mcm_may_delete_machines_that_are_not_guarded(candidate: Machine) -> None:
    assert judge(candidate).allowed


@pytest.mark.parametrize(
    ("annotations", "value", "source"),
    [
        ({v.PRESERVE_ANNOTATION: "now"}, "now", "machine"),
        ({v.PRESERVE_ANNOTATION: "when-failed"}, "when-failed", "machine"),
        ({v.PRESERVE_ANNOTATION: "auto-preserved"}, "auto-preserve", "machine"),
        ({v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "when-failed"}, "when-failed", "node"),
        ({v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now", v.PRESERVE_ANNOTATION: "false"}, "now", "node"),
    ],
)
def test_pending_preservation_by_value_is_guarded(annotations: dict[str, str], value: str, source: str) -> None:
    verdict = judge(machine(annotations=annotations))
    assert not verdict.allowed
    assert f'about to be preserved (preserve value "{value}" from its {source})' in verdict.message


def test_only_budget_decisions_need_a_read() -> None:
    def read(m: Machine, username: str = MCM) -> str:
        return machine_set_to_read(machine=m, username=username, settings=SETTINGS)

    assert read(machine()) == "ms"
    assert read(machine(), "alice") == ""
    assert read(machine(phase="Running")) == ""
    assert read(machine(expiry=NOW + dt.timedelta(hours=1))) == ""
    assert read(machine(annotations={v.PRESERVE_ANNOTATION: "now"})) == ""
    assert read(machine(annotations={v.PRESERVE_ANNOTATION: "false"})) == ""
    assert read(machine(owner="")) == ""


def test_pending_denials_say_how_long_the_machine_will_be_kept() -> None:
    pending = machine(annotations={v.PRESERVE_ANNOTATION: "now"})
    assert "kept for the configured machinePreserveTimeout from the start" in judge(pending).message
    timed = Machine.model_validate({**pending.model_dump(by_alias=True), "spec": {"machinePreserveTimeout": "48h"}})
    assert "kept for 48h from the start of its preservation" in judge(timed).message


def test_room_in_the_budget_makes_a_failed_machine_pending() -> None:
    candidate = machine()
    view = MachineSetView(machine_set=machine_set(max_=1), machines=[candidate], siblings=[machine_set(max_=1)])
    verdict = judge(candidate, view=view)
    assert not verdict.allowed
    assert 'about to be auto-preserved (MachineSet "ms" has room' in verdict.message


def test_a_full_budget_lets_mcm_delete() -> None:
    holder = machine("m0", annotations={v.PRESERVE_ANNOTATION: "auto-preserve"}, expiry=NOW + dt.timedelta(hours=1))
    candidate = machine()
    view = MachineSetView(machine_set=machine_set(max_=1), machines=[holder, candidate], siblings=[machine_set()])
    assert judge(candidate, view=view).allowed


def test_newest_failures_get_the_last_slot_first() -> None:
    older = machine("old", created=NOW - dt.timedelta(hours=5))
    newer = machine("new", created=NOW - dt.timedelta(hours=1))
    view = MachineSetView(machine_set=machine_set(max_=1), machines=[older, newer], siblings=[machine_set()])
    assert judge(older, view=view).allowed
    assert not judge(newer, view=view).allowed


def test_a_machine_set_being_replaced_by_a_rollout_auto_preserves_nothing() -> None:
    old_set, new_set = machine_set("ms"), machine_set("ms-new", created=NOW - dt.timedelta(minutes=5))
    candidate = machine()
    view = MachineSetView(machine_set=old_set, machines=[candidate], siblings=[old_set, new_set])
    assert judge(candidate, view=view).allowed


def test_a_node_value_of_false_recorded_as_last_applied_keeps_the_machine_out_of_the_budget() -> None:
    candidate = machine(annotations={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "false"})
    assert machine_set_to_read(machine=candidate, username=MCM, settings=SETTINGS) == ""
    assert judge(candidate).allowed


def test_machines_of_other_machine_sets_do_not_use_the_budget() -> None:
    stranger = machine("s", owner="other", annotations={v.PRESERVE_ANNOTATION: "auto-preserve"})
    candidate = machine()
    view = MachineSetView(machine_set=machine_set(max_=1), machines=[stranger], siblings=[machine_set()])
    assert not judge(candidate, view=view).allowed


def test_the_last_known_node_carries_the_last_applied_value() -> None:
    known = last_known_node(machine(annotations={v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now"}))
    assert known is not None
    assert known.metadata.name == "n1"
    assert known.metadata.annotations == {v.PRESERVE_ANNOTATION: "now"}
    empty = last_known_node(machine())
    assert empty is not None
    assert empty.metadata.annotations == {}
    assert last_known_node(machine(node="")) is None
