"""The playground's pure pieces: the landscape it seeds, the timeline's diff, the summary table."""

from __future__ import annotations

import datetime as dt

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import validate_shoot
from machine_preservation.playground import landscape
from machine_preservation.playground.timeline import diff
from machine_preservation.playground.walkthrough import StepResult, summary_table


def test_machine_deployments_spread_the_pool_max_over_zones() -> None:
    deployments = landscape.machine_deployments(preserve_timeout=dt.timedelta(seconds=90))
    by_name = {d["metadata"]["name"]: d["spec"] for d in deployments}
    assert by_name["shoot--dev--playground-edge-z1"]["autoPreserveFailedMachineMax"] == 1
    assert by_name["shoot--dev--playground-edge-z2"]["autoPreserveFailedMachineMax"] == 1
    assert by_name["shoot--dev--playground-core-z1"]["autoPreserveFailedMachineMax"] == 0
    assert {s["template"]["spec"]["machinePreserveTimeout"] for s in by_name.values()} == {"1m30s"}


def test_machine_set_is_owned_by_its_deployment() -> None:
    deployment = landscape.machine_deployments(preserve_timeout=dt.timedelta(minutes=1))[0]
    machine_set = landscape.machine_set(deployment, deployment_uid="uid-1")
    (owner,) = machine_set["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("MachineDeployment", "uid-1", True)
    assert machine_set["spec"]["autoPreserveFailedMachineMax"] == deployment["spec"]["autoPreserveFailedMachineMax"]


def test_the_seeded_shoot_is_valid() -> None:
    verdict = validate_shoot(
        shoot=landscape.shoot(preserve_timeout=dt.timedelta(seconds=90)), old_shoot=None, settings=AdmissionSettings()
    )
    assert verdict.allowed, verdict


def test_diff_reports_created_deleted_and_changed_fields_in_order() -> None:
    before = {"a": {"phase": "Running", "preserve": "-"}, "gone": {"phase": "Failed"}}
    after = {"a": {"phase": "Failed", "preserve": "now"}, "new": {"phase": "-", "preserve": "now"}}
    assert diff("machine", before, after) == [
        "machine new created: preserve=now",
        "machine gone deleted",
        "machine a: phase Running → Failed; preserve - → now",
    ]
    assert diff("machine", after, after) == []


def test_summary_table_lists_every_step_and_marks_the_ones_not_run() -> None:
    results = [StepResult(1, "first", True, "ok", 1.2), StepResult(2, "second", False, "bad", 30.0)]
    table = summary_table(results, total_steps=3).splitlines()
    assert table[0].split() == ["#", "use", "case", "result", "time"]
    assert table[2].split() == ["1", "first", "passed", "1s"]
    assert table[3].split() == ["2", "second", "FAILED", "30s"]
    assert table[4].split() == ["3", "(not", "run)", "skipped", "-"]
