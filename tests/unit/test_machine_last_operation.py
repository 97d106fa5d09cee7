"""A cached Machine keeps MCM's last operation only while it is Failed (the evidence of its failure reads it),
bounded, and a malformed one never fails the Machine's parsing."""

from __future__ import annotations

from typing import Any

import pytest

from machine_preservation.core.models import CACHED_VALUE_LIMIT, Machine

OPERATION = {
    "description": "Machine m failed health check",
    "state": "Failed",
    "type": "HealthCheck",
    "lastUpdateTime": "2026-11-29T09:51:00Z",
}


def parsed(phase: str, operation: Any) -> Machine:
    return Machine.model_validate({"status": {"currentStatus": {"phase": phase}, "lastOperation": operation}})


def test_a_failed_machine_keeps_its_last_operation() -> None:
    assert parsed("Failed", OPERATION | {"other": "dropped"}).status.last_operation == OPERATION


@pytest.mark.parametrize("phase", ["Running", "Pending", "Terminating", ""])
def test_another_machine_keeps_none(phase: str) -> None:
    assert parsed(phase, OPERATION).status.last_operation == {}


def test_the_last_operation_is_bounded() -> None:
    kept = parsed("Failed", OPERATION | {"description": "d" * 100_000}).status.last_operation
    assert kept["description"] == "d" * CACHED_VALUE_LIMIT


@pytest.mark.parametrize("operation", ["Failed", None, [], {"description": 5, "state": ["x"], "type": None}])
def test_a_malformed_last_operation_is_left_out(operation: Any) -> None:
    machine = parsed("Failed", operation)
    assert machine.phase == "Failed"
    assert machine.status.last_operation == {}
