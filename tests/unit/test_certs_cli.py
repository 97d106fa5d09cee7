"""`machine-preservation certs run` argument handling (no cluster needed for these paths)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from machine_preservation.certs import commands
from machine_preservation.certs.manager import WebhookConfigurationRef, WebhookKind
from machine_preservation.cli.main import build_parser

BASE = ["certs", "run", "--secret=ns/certs", "--cert-dir=/certs", "--service=svc", "--namespace=ns"]


def test_settings_follow_the_flags() -> None:
    args = build_parser().parse_args(
        [
            *BASE,
            "--extra-name=webhook.example.com",
            "--extra-name=127.0.0.1",
            "--webhook-configuration=validating/v",
            "--webhook-configuration=mutating/m@/k/config",
            "--ca-overlap=2h",
            "--serving-validity=48h",
        ]
    )
    settings = commands.settings_from(args)
    assert (settings.secret_namespace, settings.secret_name, settings.cert_dir) == ("ns", "certs", Path("/certs"))
    assert settings.identity.dns_names == (
        "svc",
        "svc.ns",
        "svc.ns.svc",
        "svc.ns.svc.cluster.local",
        "webhook.example.com",
    )
    assert settings.identity.ip_addresses == ("127.0.0.1",), "always included, and only once"
    assert settings.configurations == (
        WebhookConfigurationRef(kind=WebhookKind.VALIDATING, name="v"),
        WebhookConfigurationRef(kind=WebhookKind.MUTATING, name="m", kubeconfig=Path("/k/config")),
    )
    assert settings.policy.ca_overlap == dt.timedelta(hours=2)
    assert settings.policy.serving_validity == dt.timedelta(hours=48)
    assert settings.ca_common_name == "svc.ns-ca"


def test_an_inconsistent_policy_exits_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args([*BASE, "--propagation-delay=48h"])
    assert commands.run(args) == 2
    assert "propagation_delay must be shorter than ca_overlap" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--secret=certs", "expected NAMESPACE/NAME"),
        ("--webhook-configuration=webhook/x", "expected validating/NAME or mutating/NAME"),
        ("--ca-validity=1y", "--ca-validity"),
    ],
)
def test_malformed_flags_are_usage_errors(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*BASE, flag])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_serving_secret_flag_and_the_cert_dir_is_optional() -> None:
    args = build_parser().parse_args(
        ["certs", "run", "--secret=ns/certs", "--serving-secret=ns/tls", "--service=svc", "--namespace=ns"]
    )
    settings = commands.settings_from(args)
    assert settings.serving_secret == ("ns", "tls")
    assert settings.cert_dir is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "needs a destination: a cert dir or a serving Secret"),
        (["--serving-secret=ns/certs"], "must not be the Secret holding the CA key"),
    ],
)
def test_the_serving_certificate_needs_a_destination_other_than_the_ca_secret(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(["certs", "run", "--secret=ns/certs", "--service=svc", "--namespace=ns", *flags])
    assert commands.run(args) == 2
    assert message in capsys.readouterr().err
