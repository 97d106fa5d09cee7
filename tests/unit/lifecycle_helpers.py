"""Running the machine plan in tests: plan, pick steps by type, apply and plan again."""

from __future__ import annotations

import datetime as dt
from typing import TypeVar

from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.lifecycle import MachineContext, plan_after_drain, plan_machine
from machine_preservation.core.models import Machine, Node, NoNode
from machine_preservation.core.plan import DrainNode, MachinePlan, MachineStep, RecordEvent

from .plan_simulator import apply_machine_plan
from .preservation_objects import NOW

CONFIG = PreservationConfig()
StepT = TypeVar("StepT")


def plan(
    machine: Machine,
    node: Node | NoNode = NoNode.NO_LABEL,
    *,
    now: dt.datetime = NOW,
    ceiling: int = 3,
    config: PreservationConfig = CONFIG,
    pool_timeout: dt.timedelta | None = None,
    pods_to_evict: tuple[str, ...] = (),
    released: bool = False,
) -> MachinePlan:
    return plan_machine(
        MachineContext(
            machine=machine,
            node=node,
            config=config,
            now=now,
            unpreserved_priority_ceiling=ceiling,
            pool_timeout=pool_timeout,
            pods_to_evict=pods_to_evict,
            released=released,
        )
    )


def sequence(plan: MachinePlan) -> list[MachineStep | DrainNode]:
    """The plan as the shell runs it: its steps, its drain, then the steps written alongside the drain."""
    if plan.drain is None:
        return list(plan.steps)
    return [*plan.steps, plan.drain, *plan.drain.alongside]


def interrupted(plan: MachinePlan, done: int) -> MachinePlan:
    """The plan as far as a crash after `done` writes (or a conflict on the next) lets it go: its first `done`
    steps, counting those written alongside the drain after the plan's own; never the drain's outcome."""
    written = [*plan.steps, *(plan.drain.alongside if plan.drain is not None else ())]
    return MachinePlan(steps=tuple(written[:done]))


def of_type(plan: MachinePlan, kind: type[StepT]) -> list[StepT]:
    return [step for step in sequence(plan) if isinstance(step, kind)]


def only(plan: MachinePlan, kind: type[StepT]) -> StepT:
    found = of_type(plan, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {sequence(plan)}"
    return found[0]


def writes(plan: MachinePlan) -> list[MachineStep | DrainNode]:
    """The API writes of a plan (its drain too), without Events."""
    return [step for step in sequence(plan) if not isinstance(step, RecordEvent)]


def write_kinds(plan: MachinePlan) -> list[str]:
    return [type(step).__name__ for step in writes(plan)]


def event_reasons(plan: MachinePlan) -> list[tuple[str, str]]:
    return [(event.kind, event.reason) for event in of_type(plan, RecordEvent)]


def execute(
    machine: Machine,
    node: Node | None,
    plan: MachinePlan,
    *,
    now: dt.datetime = NOW,
    drained: bool = True,
    blocking_pods: tuple[str, ...] = (),
) -> tuple[Machine, Node | None]:
    """Apply the plan as the shell would, its drain ending with the given outcome."""
    machine, node = apply_machine_plan(machine=machine, node=node, plan=plan, now=now)
    if plan.drain is not None:
        assert node is not None
        outcome = plan_after_drain(
            machine=machine, node=node, drain=plan.drain, drained=drained, blocking_pods=blocking_pods, now=now
        )
        machine, node = apply_machine_plan(machine=machine, node=node, plan=outcome, now=now)
    return machine, node


def changing_steps(
    plan: MachinePlan,
    machine: Machine,
    node: Node | None,
    *,
    now: dt.datetime = NOW,
    drained: bool = True,
    blocking_pods: tuple[str, ...] = (),
) -> tuple[MachineStep, ...]:
    """The plan's steps that would change something. Once evictions are given up a plan keeps a look at the
    node (DrainNode with evict False) to notice it becoming empty; a look whose outcome writes nothing is a
    no-op, as in the controller."""
    return tuple(
        step
        for step in sequence(plan)
        if not (
            isinstance(step, DrainNode)
            and not step.evict
            and node is not None
            and not plan_after_drain(
                machine=machine, node=node, drain=step, drained=drained, blocking_pods=blocking_pods, now=now
            ).steps
        )
    )
