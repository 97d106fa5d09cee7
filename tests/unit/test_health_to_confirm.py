"""health_to_confirm: the shell reads a Node afresh before every plan that would move a Failed machine back to
Running on the strength of its (possibly late) cached Node."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.lifecycle import health_to_confirm
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.plan import SetMachinePhase

from .lifecycle_helpers import CONFIG, of_type
from .preservation_objects import machine, node
from .test_lifecycle_properties import replan, snapshots


@pytest.mark.parametrize(
    ("phase", "the_node", "confirm"),
    [
        (v.MachinePhase.FAILED, node(ready="True"), True),
        (v.MachinePhase.FAILED, node(ready="False"), False),
        (v.MachinePhase.FAILED, node(ready="Unknown"), False),
        (
            v.MachinePhase.FAILED,
            node(ready="True", extra_conditions=({"type": "DiskPressure", "status": "True"},)),
            False,
        ),
        (v.MachinePhase.FAILED, None, False),
        (v.MachinePhase.RUNNING, node(ready="True"), False),
        (v.MachinePhase.UNKNOWN, node(ready="True"), False),
    ],
)
def test_only_a_failed_machine_with_a_healthy_looking_node_is_confirmed(
    phase: str, the_node: Node | None, confirm: bool
) -> None:
    assert health_to_confirm(machine=machine(phase=phase), node=the_node, config=CONFIG) is confirm


def failed(m: Machine) -> Machine:
    current = m.status.current_status.model_copy(update={"phase": v.MachinePhase.FAILED})
    return m.model_copy(update={"status": m.status.model_copy(update={"current_status": current})})


@settings(max_examples=500, deadline=None)
@given(snapshot=snapshots(), fail=st.booleans())
def test_every_plan_that_moves_a_machine_back_to_running_was_confirmed(snapshot: dict[str, Any], fail: bool) -> None:
    # Failed in half the examples (the snapshots' phases rarely are), where recoveries are planned.
    m = failed(snapshot["machine"]) if fail else snapshot["machine"]
    plan = replan(snapshot, m, snapshot["node"])
    recovers = any(step.phase == v.MachinePhase.RUNNING for step in of_type(plan, SetMachinePhase))

    if recovers:
        assert health_to_confirm(machine=m, node=snapshot["node"], config=snapshot["config"])
