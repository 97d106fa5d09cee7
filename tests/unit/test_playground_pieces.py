"""The playground's pure pieces: the landscape it seeds, the timeline's diff, the summary table."""

from __future__ import annotations

import datetime as dt

import pytest

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import validate_shoot
from machine_preservation.core.gardener.cluster import WORKER_POOL_LABEL, ZONE_LABEL, read_cluster
from machine_preservation.core.models import MachineDeployment
from machine_preservation.core.pool_settings import PoolDefaults, SettingOrigin
from machine_preservation.playground import landscape
from machine_preservation.playground.commands import build_parser
from machine_preservation.playground.timeline import diff
from machine_preservation.playground.walkthrough import StepResult, summary_table

from .pool_settings_helpers import PoolSettings, resolve_pool_settings


def _settings(deployment: landscape.Deployment, preserve_timeout: dt.timedelta) -> PoolSettings:
    """The pool settings as the controller reads them for the seeded MachineDeployment, with MCM v0.61.3's
    CRDs: the MachineDeployment carries neither setting, the Shoot in the Cluster resource does."""
    _, _, raw = landscape.pool_objects(deployment)
    shoot = landscape.shoot(preserve_timeout=preserve_timeout)
    return resolve_pool_settings(
        machine_set=None,
        machine_deployment=MachineDeployment.model_validate(raw),
        cluster=read_cluster(landscape.cluster(shoot)),
        defaults=PoolDefaults(preserve_timeout=dt.timedelta(hours=72)),
    )


def test_the_shoot_in_the_cluster_gives_each_zone_its_share_and_the_pools_timeout() -> None:
    shares = {}
    for deployment in landscape.deployments():
        settings = _settings(deployment, dt.timedelta(seconds=90))
        assert settings.notes == ()
        assert settings.preserve_timeout.source == SettingOrigin.SHOOT
        assert settings.preserve_timeout.value == dt.timedelta(seconds=90)
        assert settings.auto_preserve_failed_machine_max.source == SettingOrigin.SHOOT
        shares[deployment.name] = settings.auto_preserve_failed_machine_max.value
        assert shares[deployment.name] == deployment.auto_preserve_share
    assert shares == {
        "shoot--dev--playground-edge-z1": 1,
        "shoot--dev--playground-edge-z2": 1,
        "shoot--dev--playground-core-z1": 0,
    }


def test_machine_deployments_carry_the_pool_label_real_mcm_and_the_controller_need() -> None:
    for deployment in landscape.deployments():
        secret, machine_class, raw = landscape.pool_objects(deployment)
        labels = raw["metadata"]["labels"]
        assert labels[WORKER_POOL_LABEL] == deployment.pool.name
        assert labels[ZONE_LABEL] == deployment.zone
        template = raw["spec"]["template"]
        assert template["spec"]["class"] == {"kind": "MachineClass", "name": machine_class["metadata"]["name"]}
        assert template["spec"]["nodeTemplate"]["metadata"]["labels"][WORKER_POOL_LABEL] == deployment.pool.name
        assert machine_class["secretRef"]["name"] == secret["metadata"]["name"]
        assert raw["spec"]["replicas"] == deployment.pool.machines_per_zone


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


def test_the_preserve_timeout_is_a_go_duration() -> None:
    assert build_parser().parse_args(["--preserve-timeout", "2m"]).preserve_timeout == dt.timedelta(minutes=2)


@pytest.mark.parametrize("value", ["0s", "1ns", "-90s"])
def test_a_preserve_timeout_that_is_not_positive_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([f"--preserve-timeout={value}"])
    assert exited.value.code == 2
    assert f"must be positive: {value}" in capsys.readouterr().err
