"""The MachineSet plan and the machine plans together: they settle, and never undo each other."""

from __future__ import annotations

import dataclasses
import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.auto_preservation import plan_machine_set
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.lifecycle import labelled_node
from machine_preservation.core.models import Machine, MachineSet, Node
from machine_preservation.core.preserve_value import is_auto_value
from machine_preservation.core.priority import parse_priority, unpreserved_priority_ceiling

from .lifecycle_helpers import CONFIG, execute, plan
from .plan_simulator import apply_machine_set_plan
from .preservation_objects import ABSENT, HOUR, NOW, machine, machine_set, node

VALUES = [ABSENT, ABSENT, ABSENT, "", "now", "when-failed", "false", "auto-preserve"]
MIRROR = dataclasses.replace(CONFIG, mirror_status=True)
World = tuple[MachineSet, list[Machine], dict[str, Node]]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    machines, nodes = [], {}
    for index in range(draw(st.integers(1, 6))):
        name = f"m{index}"
        machines.append(
            machine(
                name=name,
                node=f"node-{name}",
                phase=draw(st.sampled_from(["Failed", "Failed", "Running", "Unknown"])),
                preserve=draw(st.sampled_from(VALUES)),
                priority=draw(st.sampled_from([ABSENT, "1", "3", "6"])),
                created=NOW - dt.timedelta(hours=draw(st.integers(1, 50))),
                failed_at=NOW - dt.timedelta(minutes=draw(st.integers(1, 500))),
            )
        )
        if draw(st.integers(0, 5)) > 0:
            nodes[f"node-{name}"] = node(
                name=f"node-{name}",
                preserve=draw(st.sampled_from(VALUES)),
                ready=draw(st.sampled_from(["True", "False"])),
            )
    return machine_set(max_auto=draw(st.integers(0, 3))), machines, nodes


def one_round(world: World, config: PreservationConfig = CONFIG) -> tuple[World, bool]:
    """The MachineSet reconcile, then every machine's reconcile; whether anything was written."""
    ms, machines, nodes = world
    ms_plan = plan_machine_set(
        machine_set=ms, machines=machines, nodes=nodes, being_replaced=False, config=config, now=NOW
    )
    changed = bool(ms_plan.machine_annotations) or ms_plan.status is not None
    ms, machines = apply_machine_set_plan(machine_set=ms, machines=machines, plan=ms_plan)
    settled = []
    for m in machines:
        n = nodes.get(m.node_name)
        ceiling = unpreserved_priority_ceiling(machine=m, machine_set_machines=machines, now=NOW)
        result = plan(m, labelled_node(machine=m, found=n), ceiling=ceiling, config=config)
        changed |= bool(result.steps)
        m, n = execute(m, n, result)
        if n is not None:
            nodes[n.metadata.name] = n
        settled.append(m)
    return (ms, settled, nodes), changed


@settings(max_examples=150, deadline=None)
@given(worlds(), st.sampled_from([CONFIG, MIRROR]))
def test_machine_set_and_machines_settle_without_undoing_each_other(world: World, config: PreservationConfig) -> None:
    # A Failed machine whose node is healthy may be granted the auto value and then recovered to Running
    # (which releases it) - once per machine, so settling takes at most a few rounds more than machines.
    rounds = len(world[1]) + 3
    for _ in range(rounds):
        world, changed = one_round(world, config)
        if not changed:
            break
    else:
        raise AssertionError(f"still writing after {rounds} rounds")
    ms, machines, _ = world
    live = [m for m in machines if m.metadata.deletion_timestamp is None]
    auto = [m for m in live if is_auto_value(m.metadata.annotations.get(v.PRESERVE_ANNOTATION))]
    assert len(auto) <= ms.spec.auto_preserve_failed_machine_max
    # the counter is mirrored where the CRD keeps it, else never written
    assert ms.status.auto_preserve_failed_machine_count == (len(auto) if config.mirror_status else 0)
    # every auto value settled into a preserved Failed machine
    assert all(m.phase == v.MachinePhase.FAILED and m.preservation is not None for m in auto)
    # scale-down order: every preserved machine (not deletion-marked) ranks above every unpreserved one
    preserved = [
        m
        for m in live
        if m.preservation is not None and not m.preservation.expired(now=NOW, max_timeout=config.max_preserve_timeout)
    ]
    unpreserved = [m for m in live if m not in preserved]
    for high in preserved:
        own = parse_priority(high.metadata.annotations.get(v.MACHINE_PRIORITY_ANNOTATION))
        if own >= v.DEFAULT_MACHINE_PRIORITY:
            assert all(
                own > parse_priority(low.metadata.annotations.get(v.MACHINE_PRIORITY_ANNOTATION)) for low in unpreserved
            )


def test_expired_auto_preservation_is_not_granted_again() -> None:
    # The stop deletes the Failed machine instead of leaving it for the budget to grant again.
    m = machine(name="m0", node="node-m0", phase="Failed", preserve="auto-preserve", expiry=NOW - HOUR)
    world: World = (machine_set(max_auto=1, count=1), [m], {"node-m0": node(name="node-m0")})
    world, _ = one_round(world, MIRROR)
    _, machines, _ = world
    assert machines[0].metadata.deletion_timestamp is not None
    ms, machines, nodes = world
    again = plan_machine_set(
        machine_set=ms, machines=machines, nodes=nodes, being_replaced=False, config=MIRROR, now=NOW
    )
    assert again.machine_annotations == {}  # not granted again
    assert again.status is not None
    assert again.status.auto_preserve_failed_machine_count == 0  # the slot is free for the next failure
