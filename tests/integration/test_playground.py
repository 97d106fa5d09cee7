"""The README's main job: `python -m machine_preservation.playground`, as a newcomer runs it: our webhook and controller
against the real machine-controller-manager v0.61.3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from machine_preservation.localcluster.product import render_component_rbac
from machine_preservation.localcluster.toolchain import Toolchain
from machine_preservation.playground.stack import IDENTITIES

CLI = [sys.executable, "-m", "machine_preservation.playground", "--log-level", "WARNING"]


def _env(toolchain: Toolchain) -> dict[str, str]:
    return {**os.environ, "MACHINE_PRESERVATION_K8S_BIN": str(toolchain.bin_dir)}


def _our_processes(directory: Path) -> list[str]:
    """Command lines of live processes that mention the playground directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(directory) in cmdline and str(proc.name) != str(os.getpid()):
                found.append(cmdline)
    return found


def test_walkthrough_passes_every_use_case_and_cleans_up(toolchain: Toolchain, tmp_path: Path) -> None:
    directory = tmp_path / "playground"
    result = subprocess.run(
        [*CLI, "--dir", str(directory), "--preserve-timeout", "60s"],
        capture_output=True,
        text=True,
        env=_env(toolchain),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    table = result.stdout.split("#  use case", 1)[1]
    assert table.count("passed") == 8, table
    assert "Every use case behaved as documented." in result.stdout
    # What users see: the webhook's denial names the allowed values, the CA guard warns.
    assert 'supported values: "", "now", "when-failed", "false"' in result.stdout
    assert 'Warning: cluster-autoscaler.kubernetes.io/scale-down-disabled restored to "true"' in result.stdout
    # MCM's own delete of a kept Failed machine is denied, naming until when it is kept.
    assert "is Failed and preserved until" in result.stdout
    assert "machine-controller-manager v0.61.3 running" in result.stdout
    assert not directory.exists(), "a successful run leaves nothing behind"
    assert _our_processes(directory) == []


def test_interactive_runs_until_ctrl_c_then_tears_down(toolchain: Toolchain, tmp_path: Path) -> None:
    directory = tmp_path / "interactive"
    process = subprocess.Popen(
        [*CLI, "--dir", str(directory), "--interactive"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(toolchain),
    )
    assert process.stdout is not None
    seen = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if "Press Ctrl-C" in line or not line:
            break
    text = "".join(seen)
    assert "The playground is running" in text, text
    assert f"export KUBECONFIG={directory / 'cluster' / 'kubeconfig'}" in text
    assert (directory / "cluster" / "kubeconfig").is_file()
    running = _our_processes(directory)
    assert any("machine-controller-manager" in p for p in running), "real MCM runs while interactive"
    assert any(" controller " in p for p in running), running
    assert any(" webhook " in p for p in running), running

    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 0, rest
    assert "tearing down" in rest
    assert _our_processes(directory) == []
    assert not directory.exists()


def test_components_run_under_the_charts_rbac_not_as_cluster_admin(toolchain: Toolchain) -> None:
    """The playground's client-certificate identities are exactly the chart's ServiceAccount users, so the
    chart's Roles (and nothing more) apply to the webhook and the controller; MCM has a role of its own."""
    manifests = render_component_rbac(helm=toolchain.helm, control_namespace="shoot--dev--play")
    bindings = [m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    users = {
        f"system:serviceaccount:{s['namespace']}:{s['name']}"
        for binding in bindings
        for s in binding["subjects"]
        if s["kind"] == "ServiceAccount"
    }
    assert users == {IDENTITIES["controller"], IDENTITIES["webhook"]}
    assert all(len(user) <= 64 for user in users), "client-certificate common names are at most 64 characters"
    assert not [b for b in bindings if b["roleRef"]["name"] == "cluster-admin"]
    roles = {(m["metadata"].get("namespace"), m["kind"]) for m in manifests if m["kind"] in ("Role", "ClusterRole")}
    assert ("shoot--dev--play", "Role") in roles, "machine permissions only in the control namespace"
