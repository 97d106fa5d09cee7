"""`machine-preservation webhook` as a process: self-signed certificates, serving, stopping on SIGTERM."""

from __future__ import annotations

import datetime as dt
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509

from machine_preservation.cli.main import build_parser
from machine_preservation.core.admission.settings import DEFAULT_CONTROLLER_USERNAME, DEFAULT_MCM_USERNAMES
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.webhook.commands import run, settings_from, write_self_signed


def test_self_signed_writes_a_ca_and_a_serving_cert_it_signs(tmp_path: Path) -> None:
    target = tmp_path / "certs"
    assert write_self_signed(cert_dir=target, names=("webhook.example", "127.0.0.1"), now=dt.datetime.now(dt.UTC))
    ca = x509.load_pem_x509_certificate((target / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((target / "tls.crt").read_bytes())
    assert cert.issuer == ca.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["webhook.example"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert (target / "tls.key").stat().st_mode & 0o777 == 0o600
    assert not (target / "ca.key").exists()


def test_self_signed_leaves_a_populated_directory_alone(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("mine")
    assert not write_self_signed(cert_dir=tmp_path, names=("localhost",), now=dt.datetime.now(dt.UTC))
    assert (tmp_path / "tls.crt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt"]


def test_flags_and_defaults() -> None:
    args = build_parser().parse_args(
        ["webhook", "--cert-dir", "/x", "--mcm-username", "a", "--mcm-username", "b", "--max-preserve-timeout", "48h"]
    )
    assert args.mcm_username == ["a", "b"]
    assert args.max_preserve_timeout == dt.timedelta(hours=48)
    assert args.max_body_bytes == 3 * 1024 * 1024
    assert args.port == 9443
    defaults = build_parser().parse_args(["webhook", "--cert-dir", "/x"])
    assert defaults.max_preserve_timeout == dt.timedelta(hours=720)
    assert defaults.controller_username.startswith("system:serviceaccount:")
    assert defaults.mcm_native_preservation == NativePreservationMode.AUTO
    assert defaults.control_namespace is None


def test_a_zero_max_preserve_timeout_is_accepted() -> None:
    args = build_parser().parse_args(["webhook", "--cert-dir", "/x", "--max-preserve-timeout", "0s"])
    assert args.max_preserve_timeout == dt.timedelta(0)


@pytest.mark.parametrize("mode", ["auto", "true", "false"])
def test_the_native_preservation_mode(mode: str) -> None:
    args = build_parser().parse_args(
        ["webhook", "--cert-dir", "/x", f"--mcm-native-preservation={mode}", "--control-namespace", "shoot--p--s"]
    )
    assert args.mcm_native_preservation == NativePreservationMode(mode)
    assert args.control_namespace == "shoot--p--s"


def test_a_bad_native_preservation_mode_lists_the_allowed_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["webhook", "--cert-dir", "/x", "--mcm-native-preservation=yes"])
    err = capsys.readouterr().err
    assert "--mcm-native-preservation: invalid choice: 'yes' (choose from " in err
    assert all(mode in err for mode in ("auto", "true", "false"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-preserve-timeout", "3d"], 'time: unknown unit "d"'),
        (["--max-preserve-timeout=-1h"], "must not be negative: -1h"),
        (["--max-preserve-timeout=-1ns"], "must not be negative: -1ns"),
        (["--max-body-bytes", "0"], "must be positive: 0"),
        (["--mcm-native-preservation", "yes"], "invalid choice: 'yes'"),
    ],
)
def test_bad_flags_are_refused(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["webhook", "--cert-dir", "/x", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_one_controller_username_is_the_controller_as_before() -> None:
    args = build_parser().parse_args(["webhook", "--cert-dir", "/x", "--controller-username", "c1"])
    assert args.controller_username == "c1"
    settings = settings_from(args, native=False)
    assert (settings.controller_username, settings.more_controller_usernames) == ("c1", frozenset())
    defaults = settings_from(build_parser().parse_args(["webhook", "--cert-dir", "/x"]), native=True)
    assert defaults.controller_username == DEFAULT_CONTROLLER_USERNAME
    assert defaults.more_controller_usernames == frozenset()
    assert defaults.mcm_usernames == frozenset(DEFAULT_MCM_USERNAMES)
    assert defaults.mcm_service_accounts == frozenset()
    assert defaults.mcm_native_preservation is True


def test_the_gardener_identities() -> None:
    args = build_parser().parse_args(
        [
            "webhook",
            "--cert-dir=/x",
            "--controller-username=system:serviceaccount:extension-mp:gardener-extension-machine-preservation",
            "--controller-username=system:serviceaccount:kube-system:machine-preservation",
            "--mcm-service-account=machine-controller-manager",
            "--mcm-service-account=mcm.v2",
            "--mcm-native-preservation-per-namespace",
            "--native-preservation-ttl=30",
        ]
    )
    settings = settings_from(args, native=False)
    assert settings.controller_username == "system:serviceaccount:extension-mp:gardener-extension-machine-preservation"
    assert settings.more_controller_usernames == {"system:serviceaccount:kube-system:machine-preservation"}
    assert settings.mcm_service_accounts == {"machine-controller-manager", "mcm.v2"}
    assert settings.mcm_usernames == frozenset(DEFAULT_MCM_USERNAMES)  # the shoots' MCM, on nodes
    assert settings.is_mcm("system:serviceaccount:shoot--p--a:machine-controller-manager", namespace="shoot--p--a")
    assert args.mcm_native_preservation_per_namespace is True
    assert args.native_preservation_ttl == 30.0
    plain = build_parser().parse_args(["webhook", "--cert-dir=/x"])
    assert plain.mcm_native_preservation_per_namespace is False
    assert plain.native_preservation_ttl == 60.0


@pytest.mark.parametrize("name", ["", "MCM", "kube-system:mcm", "-mcm", "mcm-", "a/b", "a" * 254])
def test_a_bad_service_account_name_is_refused(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["webhook", "--cert-dir", "/x", f"--mcm-service-account={name}"])
    assert exited.value.code == 2
    assert "not a ServiceAccount name (a DNS-1123 subdomain)" in capsys.readouterr().err


@pytest.mark.parametrize("ttl", ["0", "-1", "soon"])
def test_a_bad_ttl_is_refused(ttl: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["webhook", "--cert-dir", "/x", f"--native-preservation-ttl={ttl}"])


@pytest.mark.parametrize("mode", ["true", "false"])
def test_per_namespace_needs_auto(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(
        ["webhook", "--cert-dir=/x", f"--mcm-native-preservation={mode}", "--mcm-native-preservation-per-namespace"]
    )
    assert run(args) == 2
    assert "needs --mcm-native-preservation=auto" in caplog.text


def test_the_command_serves_until_sigterm(tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "machine_preservation.cli",
            "webhook",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--cert-dir",
            str(cert_dir),
            "--self-signed",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        port = 0
        deadline = time.monotonic() + 60
        while not port and time.monotonic() < deadline:
            line = process.stderr.readline()
            if match := re.search(r"webhook serving on https://127\.0\.0\.1:(\d+) \(ready: True\)", line):
                port = int(match.group(1))
        assert port, "the server did not report its port"
        context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=10) as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
