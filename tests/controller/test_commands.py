"""`machine-preservation controller` flags: defaults, overrides, and bad durations rejected at parse time."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from machine_preservation.cli.main import build_parser
from machine_preservation.controller.commands import options_from, run, seed_options_from


def test_defaults() -> None:
    options = options_from(build_parser().parse_args(["controller", "--namespace", "shoot--p--s"]))
    assert options.namespace == "shoot--p--s"
    assert options.control_kubeconfig is None
    assert options.target_kubeconfig is None
    assert options.runtime.preservation.default_preserve_timeout == dt.timedelta(hours=72)
    assert options.runtime.preservation.drain_timeout == dt.timedelta(hours=2)
    assert options.runtime.preservation.drain_retry_interval == dt.timedelta(minutes=1)
    assert options.runtime.max_drain_attempt == dt.timedelta(minutes=2)
    assert options.runtime.evidence_grace == dt.timedelta(hours=24)
    assert options.leader_elect is True
    assert options.leader_election_namespace is None
    assert (options.lease_duration, options.renew_deadline, options.retry_period) == (15, 10.0, 2.0)
    assert (options.metrics_host, options.metrics_port) == ("127.0.0.1", 8080)
    assert options.runtime.workers == 4


def test_overrides() -> None:
    args = build_parser().parse_args(
        [
            "controller",
            "--namespace=ns",
            "--control-kubeconfig=/k/control",
            "--target-kubeconfig=/k/target",
            "--machine-preserve-timeout=1h30m",
            "--machine-drain-timeout=10m",
            "--drain-attempt-timeout=30s",
            "--drain-retry-interval=5m",
            "--evidence-grace=0s",
            "--no-leader-elect",
            "--leader-election-namespace=garden",
            "--metrics-port=9090",
            "--metrics-bind-address=0.0.0.0",
            "--workers=8",
        ]
    )
    options = options_from(args)
    assert options.control_kubeconfig == Path("/k/control")
    assert options.target_kubeconfig == Path("/k/target")
    assert options.runtime.preservation.default_preserve_timeout == dt.timedelta(minutes=90)
    assert options.runtime.preservation.drain_timeout == dt.timedelta(minutes=10)
    assert (options.runtime.max_drain_attempt, options.runtime.preservation.drain_retry_interval) == (
        dt.timedelta(seconds=30),
        dt.timedelta(minutes=5),
    )
    assert options.runtime.evidence_grace == dt.timedelta(0)
    assert options.leader_elect is False
    assert options.leader_election_namespace == "garden"
    assert (options.metrics_host, options.metrics_port, options.runtime.workers) == ("0.0.0.0", 9090, 8)


@pytest.mark.parametrize(
    "flag",
    [
        "--machine-preserve-timeout=3d",
        "--machine-drain-timeout=soon",
        "--drain-attempt-timeout=x",
        "--drain-retry-interval=1",
        "--evidence-grace=1 day",
    ],
)
def test_a_bad_duration_is_a_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["controller", "--namespace=ns", flag])
    assert exited.value.code == 2
    assert "time: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--machine-preserve-timeout=-1h", "default_preserve_timeout must not be negative"),
        ("--drain-retry-interval=0s", "drain_retry_interval must be positive"),
        ("--drain-attempt-timeout=0s", "--drain-attempt-timeout must be positive, got 0s"),
    ],
)
def test_a_timeout_out_of_range_is_refused(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(build_parser().parse_args(["controller", "--namespace=ns", flag]))
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_negative_evidence_grace_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["controller", "--namespace=ns", "--evidence-grace=-1h"])
    assert exited.value.code == 2
    assert "must not be negative: -1h" in capsys.readouterr().err


def test_the_extension_takes_the_evidence_grace() -> None:
    args = build_parser().parse_args(
        ["extension", "--namespace=ns", "--webhook-url=https://w", "--ca-secret=ns/ca", "--evidence-grace=90m"]
    )
    assert seed_options_from(args).runtime.evidence_grace == dt.timedelta(minutes=90)
