"""Turning the API server's MachineSet, Machine and MachineDeployment lists into the deletion guard's view."""

from __future__ import annotations

import pytest

from machine_preservation.webhook.machine_sets import SourceUnavailable, view_from_lists
from tests.webhook.reviews import machine, machine_set


def test_the_named_machine_set_with_all_machines_and_siblings() -> None:
    view = view_from_lists(
        name="ms",
        machine_sets=[machine_set("other"), machine_set("ms", max_=2)],
        machines=[machine("m1"), machine("m2")],
        machine_deployments=[{"metadata": {"name": "md"}, "spec": {"replicas": 4}}],
    )
    assert view is not None
    assert view.machine_set.metadata.name == "ms"
    assert view.machine_set.spec.auto_preserve_failed_machine_max == 2
    assert [m.metadata.name for m in view.machines] == ["m1", "m2"]
    assert [s.metadata.name for s in view.siblings] == ["other", "ms"]
    assert [(d.metadata.name, d.spec.replicas) for d in view.machine_deployments] == [("md", 4)]


def test_a_missing_machine_set_gives_no_view() -> None:
    assert view_from_lists(name="gone", machine_sets=[machine_set("ms")], machines=[]) is None


def test_objects_that_do_not_fit_the_models_are_reported_not_raised() -> None:
    broken = machine_set("ms")
    broken["spec"]["autoPreserveFailedMachineMax"] = "many"
    with pytest.raises(SourceUnavailable, match="unexpected object from the API server"):
        view_from_lists(name="ms", machine_sets=[broken], machines=[])
    with pytest.raises(SourceUnavailable, match="unexpected object from the API server"):
        view_from_lists(
            name="ms", machine_sets=[machine_set("ms")], machines=[], machine_deployments=[{"spec": {"replicas": "x"}}]
        )
