"""`localcluster.gardener.extension_ready` judges an Extension as gardenlet's readiness check does: each rule on its
own, in gardenlet's order, and the timestamp compared in whole seconds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from machine_preservation.localcluster.gardener import extension_manifest, extension_ready


def ready_extension() -> dict[str, Any]:
    return {
        "metadata": {"generation": 2, "annotations": {"gardener.cloud/timestamp": "2026-11-26T10:00:00.900000Z"}},
        "status": {
            "observedGeneration": 2,
            "lastError": None,
            "lastOperation": {"type": "Reconcile", "state": "Succeeded", "lastUpdateTime": "2026-11-26T10:00:00Z"},
        },
    }


def changed(**paths: Any) -> dict[str, Any]:
    extension = ready_extension()
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        target = extension
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[leaf]
        else:
            target[leaf] = value
    return extension


def test_a_finished_reconcile_is_ready() -> None:
    assert extension_ready(ready_extension()) is None


def test_the_timestamp_counts_in_whole_seconds() -> None:
    # 10:00:00.9 requested, 10:00:00 last update: gardenlet cuts the request to the second, so this is ready.
    assert extension_ready(ready_extension()) is None
    later = changed(metadata__annotations={"gardener.cloud/timestamp": "2026-11-26T10:00:01.000000001Z"})
    assert extension_ready(later) == (
        "extension is not reconciled yet - reconciliation requested at 2026-11-26T10:00:01Z, "
        "last update time is: 2026-11-26T10:00:00Z"
    )


@pytest.mark.parametrize(
    ("extension", "reason"),
    [
        (
            changed(status__lastError={"description": "boom", "codes": ["ERR_CONFIGURATION_PROBLEM"]}),
            "error during reconciliation: boom",
        ),
        (changed(status__observedGeneration=1), "observed generation outdated (1/2)"),
        (changed(status__observedGeneration=KeyError), "observed generation outdated (0/2)"),
        (
            changed(metadata__annotations={"gardener.cloud/operation": "reconcile"}),
            "gardener operation 'reconcile' is not yet picked up by controller",
        ),
        (changed(status__lastOperation=None), "extension did not record a last operation yet"),
        (
            changed(status__lastOperation={"state": "Processing", "lastUpdateTime": "2026-11-26T11:00:00Z"}),
            "extension state is not succeeded but Processing",
        ),
        (
            changed(status__lastOperation={"state": "Error", "lastUpdateTime": "2026-11-26T11:00:00Z"}),
            "extension state is not succeeded but Error",
        ),
        (
            changed(metadata__annotations={"gardener.cloud/timestamp": "yesterday"}),
            "cannot parse gardener.cloud/timestamp annotation: 'yesterday' is not an RFC 3339 time",
        ),
    ],
)
def test_each_rule_on_its_own(extension: dict[str, Any], reason: str) -> None:
    assert extension_ready(extension) == reason


def test_the_first_failing_rule_is_reported() -> None:
    everything_wrong = changed(
        status__lastError={"description": "boom"},
        status__observedGeneration=1,
        status__lastOperation=None,
        metadata__annotations={"gardener.cloud/operation": "reconcile"},
    )
    assert extension_ready(everything_wrong) == "error during reconciliation: boom"
    without_error = copy.deepcopy(everything_wrong)
    without_error["status"]["lastError"] = None
    assert extension_ready(without_error) == "observed generation outdated (1/2)"


def test_a_fresh_extension_from_the_stand_in_is_not_ready() -> None:
    created = extension_manifest("shoot--p--s")
    created["metadata"]["generation"] = 1
    assert extension_ready(created) == "observed generation outdated (0/1)"
