"""What the machine reconciler logs of a plan: its steps by kind, then the drain and what goes alongside it."""

from __future__ import annotations

from machine_preservation.controller.preservation.reconcile import _describe
from machine_preservation.core import plan as p


def test_a_plan_is_logged_with_its_drain_and_what_goes_alongside() -> None:
    condition = p.SetPreservedCondition(status="False", reason="r", message="m", last_transition_time=None)  # type: ignore[arg-type]
    plan = p.MachinePlan(
        steps=(p.PatchMachineAnnotations(set={"a": "b"}), p.SetPreservedTaint(present=True)),
        drain=p.DrainNode(alongside=(condition,)),
    )
    assert _describe(plan) == "PatchMachineAnnotations, SetPreservedTaint, DrainNode (alongside: SetPreservedCondition)"
    assert _describe(p.MachinePlan(drain=p.DrainNode())) == "DrainNode"
    assert _describe(p.MachinePlan(steps=(p.DeleteMachine(),))) == "DeleteMachine"
