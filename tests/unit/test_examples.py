"""The examples in example/ are what the product accepts: the Shoot passes the garden admission with its settings
read where the controller reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import validate_shoot
from machine_preservation.core.gardener.provider_config import PreservationConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "example"


def _shoot() -> dict[str, Any]:
    shoot: dict[str, Any] = yaml.safe_load((EXAMPLES / "shoot.yaml").read_text())
    return shoot


def test_the_example_shoot_passes_the_garden_admission() -> None:
    verdict = validate_shoot(shoot=_shoot(), old_shoot=None, settings=AdmissionSettings())
    assert verdict.allowed, verdict.message


def test_the_example_shoots_provider_config_decodes_and_names_its_pools() -> None:
    shoot = _shoot()
    extension = next(e for e in shoot["spec"]["extensions"] if e["type"] == "machine-preservation")
    config = PreservationConfig.model_validate(extension["providerConfig"])
    pools = {w["name"] for w in shoot["spec"]["provider"]["workers"]}
    assert {w.name for w in config.workers} <= pools
    gpu = config.worker("gpu-worker")
    assert gpu is not None
    assert gpu.machine_preserve_timeout == "96h"


def test_a_setting_in_both_places_that_differs_is_denied() -> None:
    shoot = _shoot()
    shoot["spec"]["extensions"][0]["providerConfig"]["workers"].append(
        {"name": "cpu-worker", "machinePreserveTimeout": "12h"}
    )
    verdict = validate_shoot(shoot=shoot, old_shoot=None, settings=AdmissionSettings())
    assert not verdict.allowed
    assert verdict.message.startswith("spec.extensions[0].providerConfig.workers[1].machinePreserveTimeout: ")
    assert "differs from spec.provider.workers[0].machineControllerManager.machinePreserveTimeout" in verdict.message
