"""Auto-preservation per MachineSet: candidates, budget, release order, rollouts, status counters."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.auto_preservation import (
    AutoPreservationPlan,
    is_being_replaced,
    plan_auto_preservation,
    plan_machine_deployment,
    plan_machine_set,
    preserved_failed_replicas,
)
from machine_preservation.core.config import PreservationConfig
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet, Node
from machine_preservation.core.plan import PatchMachineAnnotations, PatchMachineDeploymentStatus, PatchMachineSetStatus
from machine_preservation.core.preserve_value import effective_preserve_value, is_auto_value

from .plan_simulator import apply_machine_set_plan
from .preservation_objects import ABSENT, HOUR, NOW, machine, machine_set, node

FAILED, RUNNING = v.MachinePhase.FAILED, v.MachinePhase.RUNNING
KEPT = NOW + 5 * HOUR
CONFIG = PreservationConfig()
# MCM's CRDs keep the MachineSet counters (v0.62's): only then are they written.
MIRROR = PreservationConfig(mirror_status=True)


def failed(name: str, *, failed_hours_ago: float = 1, created_hours_ago: float = 100, **kwargs: object) -> Machine:
    return machine(
        name=name,
        node=f"node-{name}",
        phase=FAILED,
        failed_at=NOW - dt.timedelta(hours=failed_hours_ago),
        created=NOW - dt.timedelta(hours=created_hours_ago),
        **kwargs,  # type: ignore[arg-type]
    )


def auto_plan(
    machines: list[Machine], *, max_auto: int, nodes: dict[str, Node] | None = None, being_replaced: bool = False
) -> AutoPreservationPlan:
    return plan_auto_preservation(
        machine_set=machine_set(max_auto=max_auto),
        machines=machines,
        nodes=nodes or {},
        being_replaced=being_replaced,
        now=NOW,
    )


# --- granting ------------------------------------------------------------------------------------------


def test_newest_failures_are_granted_first_within_the_budget() -> None:
    machines = [failed("old", failed_hours_ago=5), failed("new", failed_hours_ago=1), failed("mid", failed_hours_ago=3)]
    assert auto_plan(machines, max_auto=2) == AutoPreservationPlan(annotate=("new", "mid"), release=(), count=2)


def test_failure_time_falls_back_to_creation_and_ties_are_broken_by_name() -> None:
    machines = [
        machine(name="b", phase=FAILED, created=NOW - HOUR),
        machine(name="a", phase=FAILED, created=NOW - HOUR),
        machine(name="c", phase=FAILED, created=NOW - 2 * HOUR),
    ]
    assert auto_plan(machines, max_auto=2).annotate == ("b", "a")


def test_existing_auto_values_use_up_the_budget() -> None:
    machines = [failed("held", preserve="auto-preserved", expiry=KEPT), failed("x"), failed("y", failed_hours_ago=2)]
    assert auto_plan(machines, max_auto=2) == AutoPreservationPlan(annotate=("x",), release=(), count=2)


def test_manual_preservations_neither_count_nor_are_candidates() -> None:
    machines = [
        failed("manual-now", preserve="now", expiry=KEPT),
        failed("manual-when-failed", preserve="when-failed"),
        failed("candidate"),
    ]
    assert auto_plan(machines, max_auto=1) == AutoPreservationPlan(annotate=("candidate",), release=(), count=1)


@pytest.mark.parametrize(
    ("machine_value", "node_value", "candidate"),
    [
        (ABSENT, ABSENT, True),
        ("", ABSENT, True),  # "" = no preference
        ("yes", ABSENT, True),  # invalid = absent: overwritten with the auto value
        ("false", ABSENT, False),  # opted out
        (ABSENT, "false", False),
        (ABSENT, "now", False),  # the node decides: no grant for the machine plan to take back
        ("now", "", True),  # the node's "" overrides the machine's now: no preference
        (ABSENT, "yes", True),
    ],
)
def test_candidates_have_no_effective_preference(machine_value: object, node_value: object, candidate: bool) -> None:
    nodes = {"node-m": node(name="node-m", preserve=node_value)}
    result = auto_plan([failed("m", preserve=machine_value)], max_auto=1, nodes=nodes)
    assert result.annotate == (("m",) if candidate else ())


def test_missing_node_means_the_machine_value_decides() -> None:
    assert auto_plan([failed("m", last_applied="now")], max_auto=1, nodes={}).annotate == ("m",)


@pytest.mark.parametrize(
    "m",
    [
        machine(name="running", phase=RUNNING),
        machine(name="unknown", phase=v.MachinePhase.UNKNOWN),
        failed("stopping", expiry=KEPT),  # preservation ending: wait until the stop is done
        failed("expired", expiry=NOW - HOUR),  # the machine plan deletes it: a grant would preserve it again
        failed("deleting", deleting=True),
    ],
)
def test_not_candidates(m: Machine) -> None:
    assert auto_plan([m], max_auto=5) == AutoPreservationPlan(annotate=(), release=(), count=0)


# --- releasing -----------------------------------------------------------------------------------------


def test_lowering_the_max_releases_the_oldest_first_and_counts_live() -> None:
    machines = [
        failed("young", preserve="auto-preserve", expiry=KEPT, created_hours_ago=1),
        failed("oldest", preserve="auto-preserve", expiry=KEPT, created_hours_ago=30),
        failed("older", preserve="auto-preserved", expiry=KEPT, created_hours_ago=20),
        failed("manual", preserve="now", expiry=KEPT, created_hours_ago=99),
    ]
    # exactly max - new: never one too many (upstream MCM may release one more)
    assert auto_plan(machines, max_auto=1) == AutoPreservationPlan(annotate=(), release=("oldest", "older"), count=1)
    assert auto_plan(machines, max_auto=0).release == ("oldest", "older", "young")
    assert auto_plan(machines, max_auto=-3).release == ("oldest", "older", "young")  # negative counts as 0


def test_the_auto_value_on_a_machine_that_is_not_failed_is_released() -> None:
    stale = machine(name="stale", phase=RUNNING, preserve="auto-preserve")  # upstream MCM keeps it, holding a slot
    recovered = machine(name="recovered", phase=RUNNING, preserve="auto-preserve", expiry=KEPT)  # stop pending
    result = auto_plan([stale, recovered, failed("f")], max_auto=2)
    assert result == AutoPreservationPlan(annotate=("f",), release=("stale",), count=2)


def test_a_machine_set_being_replaced_grants_nothing_new_but_keeps_what_it_granted() -> None:
    machines = [failed("held", preserve="auto-preserve", expiry=KEPT), failed("new")]
    assert auto_plan(machines, max_auto=3, being_replaced=True) == AutoPreservationPlan(
        annotate=(), release=(), count=1
    )
    assert auto_plan(machines, max_auto=0, being_replaced=True).release == ("held",)


# --- rollouts ------------------------------------------------------------------------------------------


def test_is_being_replaced_by_a_newer_machine_set_of_the_same_deployment() -> None:
    old = machine_set(name="old", created=NOW - 10 * HOUR)
    new = machine_set(name="new", created=NOW - HOUR)
    assert is_being_replaced(old, [old, new])
    assert not is_being_replaced(new, [old, new])


def test_revision_wins_over_creation_time_so_a_rollback_is_seen() -> None:
    rolled_back_to = machine_set(name="first", revision="3", created=NOW - 10 * HOUR)
    abandoned = machine_set(name="second", revision="2", created=NOW - HOUR)
    assert is_being_replaced(abandoned, [rolled_back_to, abandoned])
    assert not is_being_replaced(rolled_back_to, [rolled_back_to, abandoned])


@pytest.mark.parametrize(
    "sibling",
    [
        machine_set(name="other-md", deployment="md2", created=NOW),
        machine_set(name="orphan", deployment=None, created=NOW),
        machine_set(name="deleting", created=NOW, deleting=True),
        machine_set(name="older", created=NOW - 300 * HOUR),
        machine_set(name="bad-revision", revision="x", created=NOW - 300 * HOUR),
    ],
)
def test_is_not_replaced_by(sibling: MachineSet) -> None:
    mine = machine_set(name="mine", created=NOW - 10 * HOUR)
    assert not is_being_replaced(mine, [mine, sibling])


def test_machine_set_without_deployment_is_never_replaced() -> None:
    lone = machine_set(name="lone", deployment=None)
    assert not is_being_replaced(lone, [lone, machine_set(name="x", deployment=None, created=NOW)])


# --- the MachineSet plan -------------------------------------------------------------------------------


def test_machine_set_plan_writes_the_auto_value_and_releases_with_events() -> None:
    ms = machine_set(max_auto=1, count=0)
    machines = [failed("f"), machine(name="stale", phase=RUNNING, preserve="auto-preserved")]
    result = plan_machine_set(machine_set=ms, machines=machines, nodes={}, being_replaced=False, config=CONFIG, now=NOW)
    assert result.machine_annotations == {
        "f": PatchMachineAnnotations(set={v.PRESERVE_ANNOTATION: "auto-preserve"}),
        "stale": PatchMachineAnnotations(remove=(v.PRESERVE_ANNOTATION,)),
    }
    assert [(e.name, e.reason) for e in result.events] == [
        ("f", v.EventReason.AUTO_PRESERVATION_GRANTED),
        ("stale", v.EventReason.AUTO_PRESERVATION_RELEASED),
    ]
    assert result.events[1].message == 'Released by MachineSet "ms1": the machine is not Failed.'
    assert result.status is None  # v0.61's CRDs prune the counters: nothing to mirror them into
    mirrored = plan_machine_set(
        machine_set=ms, machines=machines, nodes={}, being_replaced=False, config=MIRROR, now=NOW
    )
    assert (mirrored.machine_annotations, mirrored.events) == (result.machine_annotations, result.events)
    assert mirrored.status == PatchMachineSetStatus(auto_preserve_failed_machine_count=1, preserved_failed_replicas=0)


def test_budget_release_event_says_why() -> None:
    ms = machine_set(max_auto=0, count=1)
    machines = [failed("held", preserve="auto-preserve", expiry=KEPT)]
    result = plan_machine_set(machine_set=ms, machines=machines, nodes={}, being_replaced=False, config=CONFIG, now=NOW)
    assert result.events[0].message == (
        'Released by MachineSet "ms1": its autoPreserveFailedMachineMax (0) is exceeded '
        "(the oldest machines are released first)."
    )


def test_machine_set_plan_writes_the_configured_auto_value() -> None:
    config = PreservationConfig(auto_value="auto-preserved")
    result = plan_machine_set(
        machine_set=machine_set(max_auto=1),
        machines=[failed("f")],
        nodes={},
        being_replaced=False,
        config=config,
        now=NOW,
    )
    assert result.machine_annotations["f"].set == {v.PRESERVE_ANNOTATION: "auto-preserved"}


def test_preserved_failed_replicas_counts_failed_with_a_record_including_expired() -> None:
    machines = [
        failed("a", preserve="now", expiry=KEPT),
        failed("b", preserve="false", expiry=NOW - HOUR),
        failed("c", mirrored=KEPT),  # a mirrored expiry without a record is not a preservation
        machine(name="d", phase=RUNNING, preserve="now", expiry=KEPT),
        failed("e", preserve="now", expiry=KEPT, deleting=True),
    ]
    assert preserved_failed_replicas(machines=machines) == 2
    ms = machine_set(max_auto=0, preserved_failed=2)
    result = plan_machine_set(machine_set=ms, machines=machines, nodes={}, being_replaced=False, config=MIRROR, now=NOW)
    assert result.status is None  # already 2: no write


def test_machine_set_status_is_written_only_when_it_changes() -> None:
    machines = [failed("a", preserve="auto-preserve", expiry=KEPT)]
    current = machine_set(max_auto=1, count=1, preserved_failed=1)
    steady = plan_machine_set(
        machine_set=current, machines=machines, nodes={}, being_replaced=False, config=MIRROR, now=NOW
    )
    assert (steady.machine_annotations, steady.status, steady.events) == ({}, None, ())
    stale = machine_set(max_auto=1, count=0, preserved_failed=1)
    assert plan_machine_set(
        machine_set=stale, machines=machines, nodes={}, being_replaced=False, config=MIRROR, now=NOW
    ).status == PatchMachineSetStatus(auto_preserve_failed_machine_count=1, preserved_failed_replicas=1)
    # without the mirror a stale counter is left alone: the CRD would prune the write anyway
    assert (
        plan_machine_set(
            machine_set=stale, machines=machines, nodes={}, being_replaced=False, config=CONFIG, now=NOW
        ).status
        is None
    )


@pytest.mark.parametrize(
    ("spec_max", "limit", "granted"),
    [
        (0, 2, ("new", "mid")),  # the Shoot's value where the MachineSet's CRD has no field (v0.61)
        (3, 1, ("new",)),  # a limit given wins over the spec
        (2, None, ("new", "mid")),  # no limit given: the spec's
        (2, 0, ()),
    ],
)
def test_a_limit_from_elsewhere_replaces_the_machine_sets_own(
    spec_max: int, limit: int | None, granted: tuple[str, ...]
) -> None:
    machines = [failed("old", failed_hours_ago=5), failed("new", failed_hours_ago=1), failed("mid", failed_hours_ago=3)]
    result = plan_machine_set(
        machine_set=machine_set(max_auto=spec_max),
        machines=machines,
        nodes={},
        being_replaced=False,
        config=MIRROR,
        now=NOW,
        limit=limit,
    )
    assert tuple(name for name, patch in result.machine_annotations.items() if patch.set) == granted
    counters = PatchMachineSetStatus(auto_preserve_failed_machine_count=len(granted), preserved_failed_replicas=0)
    assert result.status == (counters if granted else None)  # the counters start at 0


def test_a_capped_expiry_ends_an_auto_claim_on_a_machine_that_is_not_failed() -> None:
    # until is far ahead, but since + max has passed: not actively preserved, so the stale claim goes
    capped = machine(
        name="capped", phase=RUNNING, preserve="auto-preserve", expiry=NOW + 1000 * HOUR, since=NOW - 721 * HOUR
    )
    active = machine(name="active", phase=RUNNING, preserve="auto-preserve", expiry=NOW + 1000 * HOUR, since=NOW - HOUR)
    result = plan_auto_preservation(
        machine_set=machine_set(max_auto=5),
        machines=[capped, active],
        nodes={},
        being_replaced=False,
        now=NOW,
        max_timeout=720 * HOUR,
    )
    assert result == AutoPreservationPlan(annotate=(), release=("capped",), count=1)


def test_machine_deployment_sums_its_machine_sets() -> None:
    deployment = MachineDeployment.model_validate({"status": {"preservedFailedReplicas": 1}})
    sets = [machine_set(name="a", preserved_failed=2), machine_set(name="b", preserved_failed=1)]
    assert plan_machine_deployment(machine_deployment=deployment, machine_sets=sets) == PatchMachineDeploymentStatus(
        preserved_failed_replicas=3
    )
    assert plan_machine_deployment(machine_deployment=deployment, machine_sets=sets[1:]) is None


# --- properties ----------------------------------------------------------------------------------------

VALUES = [ABSENT, ABSENT, ABSENT, "", "now", "when-failed", "false", "auto-preserve", "auto-preserved", "bad"]


@st.composite
def machine_set_snapshots(draw: st.DrawFn) -> tuple[MachineSet, list[Machine], dict[str, Node], bool]:
    count = draw(st.integers(0, 10))
    machines, nodes = [], {}
    for index in range(count):
        name = f"m{index}"
        expiry = draw(st.sampled_from([None, None, KEPT, NOW - HOUR]))
        machines.append(
            machine(
                name=name,
                node=f"node-{name}",
                phase=draw(st.sampled_from([FAILED, FAILED, RUNNING, v.MachinePhase.UNKNOWN])),
                preserve=draw(st.sampled_from(VALUES)),
                expiry=expiry,
                created=NOW - dt.timedelta(hours=draw(st.integers(1, 50))),
                failed_at=NOW - dt.timedelta(minutes=draw(st.integers(1, 500))),
                deleting=draw(st.integers(0, 9)) == 0,
            )
        )
        if draw(st.booleans()):
            nodes[f"node-{name}"] = node(name=f"node-{name}", preserve=draw(st.sampled_from(VALUES)))
    ms = machine_set(max_auto=draw(st.integers(-1, 5)), count=draw(st.integers(0, 5)))
    return ms, machines, nodes, draw(st.booleans())


def carries_auto(m: Machine) -> bool:
    return m.metadata.deletion_timestamp is None and is_auto_value(m.metadata.annotations.get(v.PRESERVE_ANNOTATION))


@settings(max_examples=300, deadline=None)
@given(machine_set_snapshots(), st.sampled_from([CONFIG, MIRROR]))
def test_budget_order_and_convergence(
    snapshot: tuple[MachineSet, list[Machine], dict[str, Node], bool], config: PreservationConfig
) -> None:
    ms, machines, nodes, replaced = snapshot
    result = plan_machine_set(
        machine_set=ms, machines=machines, nodes=nodes, being_replaced=replaced, config=config, now=NOW
    )
    by_name = {m.metadata.name: m for m in machines}
    applied_ms, applied = apply_machine_set_plan(machine_set=ms, machines=machines, plan=result)
    holders_before = [m for m in machines if carries_auto(m)]
    holders_after = [m for m in applied if carries_auto(m)]
    limit = max(ms.spec.auto_preserve_failed_machine_max, 0)

    # the budget is never exceeded, and the counter (where it is mirrored) says how many carry the value
    assert len(holders_after) <= limit
    if config.mirror_status:
        assert applied_ms.status.auto_preserve_failed_machine_count == len(holders_after)
        assert applied_ms.status.preserved_failed_replicas == preserved_failed_replicas(machines=applied)
    else:
        assert result.status is None
    # only the auto value is ever granted or released, and only where no one else decides
    for name, patch in result.machine_annotations.items():
        m = by_name[name]
        if patch.remove:
            assert carries_auto(m)
        else:
            assert effective_preserve_value(machine=m, node=nodes.get(m.node_name)).value == v.PreserveValue.NONE
            assert m.phase == FAILED
            assert not replaced
    # budget releases take the oldest first
    released = {n for n, p in result.machine_annotations.items() if p.remove and by_name[n].phase == FAILED}
    kept = [m for m in holders_before if m.metadata.name not in result.machine_annotations]
    for name in released:
        assert all(by_name[name].metadata.creation_timestamp <= k.metadata.creation_timestamp for k in kept)  # type: ignore[operator]
    # grants take the newest failures first
    granted = [by_name[n] for n, p in result.machine_annotations.items() if p.set]
    passed_over = [
        m
        for m in machines
        if m.metadata.name not in result.machine_annotations
        and m.metadata.deletion_timestamp is None
        and m.phase == FAILED
        and m.preservation is None
        and effective_preserve_value(machine=m, node=nodes.get(m.node_name)).value == v.PreserveValue.NONE
    ]
    for g in granted:
        assert all(
            (g.status.current_status.last_update_time or NOW) >= (p.status.current_status.last_update_time or NOW)
            for p in passed_over
        )
    # converged: planning again changes nothing
    again = plan_machine_set(
        machine_set=applied_ms, machines=applied, nodes=nodes, being_replaced=replaced, config=config, now=NOW
    )
    assert (again.machine_annotations, again.status) == ({}, None)
