"""The README's main job: `python -m machine_preservation.playground`, as a newcomer runs it: by default the Gardener
playground (a seed, two shoots with their own API server, gardener-resource-manager and real machine-controller-manager
v0.61.3, one installation of the extension); `--standalone`, our webhook and controller beside real MCM without
Gardener."""

from __future__ import annotations

import os
import re
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


def test_gardener_walkthrough_passes_every_step_and_cleans_up(toolchain: Toolchain, tmp_path: Path) -> None:
    """`make run`: a seed, two shoots, one installation; every step passes and everything goes afterwards."""
    directory = tmp_path / "playground"
    result = subprocess.run(
        [*CLI, "--dir", str(directory)], capture_output=True, text=True, env=_env(toolchain), timeout=600
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    table = result.stdout.split("#  use case", 1)[1]
    assert table.count("passed") == 7, table
    assert "Every use case behaved as documented." in result.stdout
    out = result.stdout
    # The SRE's view of both shoots and of the failed node, through kubectl's plugin.
    assert out.count("'s SRE) $ kubectl preservation list") == 2, out
    assert "(as shoot b's SRE) $ kubectl preservation show " in out
    assert "| Value:                 when-failed" in out
    # What the operator sees on both shoots once enabled: the Extension as gardenlet judges it, its
    # ControlPlaneHealthy condition, the ManagedResource's conditions.
    for shoot in ("a", "b"):
        assert (
            f"shoot {shoot}: Extension shoot--dev--{shoot}/machine-preservation: Ready (as gardenlet judges it)" in out
        )
    assert out.count("ControlPlaneHealthy: True") >= 2, out
    assert out.count("ResourcesApplied: True") >= 2, out
    assert out.count("ResourcesHealthy: True") >= 2, out
    assert "lastError: none" in out
    # The shoot's own API server denies a bad value; the seed denies MCM's delete of a kept Failed machine.
    assert 'supported values: "", "now", "when-failed", "false"' in out
    assert "is Failed and preserved until" in out
    # Each shoot's pool setting from its own source.
    assert "1h0m0s, from the Extension's providerConfig" in out
    assert "2h0m0s, from the Shoot's worker fields" in out
    # Disabled: shoot a's Extension and ManagedResource are gone.
    assert "shoot a: Extension shoot--dev--a/machine-preservation: not found" in out
    assert "shoot a: ManagedResource shoot--dev--a/extension-machine-preservation-shoot: not found" in out
    assert not directory.exists(), "a successful run leaves nothing behind"
    assert _our_processes(directory) == []


def _run_interactive(args: list[str], directory: Path, toolchain: Toolchain) -> tuple[subprocess.Popen[str], str]:
    """Start the playground with `--interactive`; returns once it says how to try it (its output so far)."""
    process = subprocess.Popen(
        [*CLI, "--dir", str(directory), "--interactive", *args],
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
    return process, "".join(seen)


def _interrupt_and_check_teardown(process: subprocess.Popen[str], directory: Path) -> None:
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 0, rest
    assert "tearing down" in rest
    assert _our_processes(directory) == []
    assert not directory.exists()


def test_gardener_interactive_runs_until_ctrl_c_then_tears_down(toolchain: Toolchain, tmp_path: Path) -> None:
    directory = tmp_path / "interactive"
    process, text = _run_interactive([], directory, toolchain)
    assert "The Gardener playground is running" in text, text
    for kubeconfig in (
        directory / "cluster" / "kubeconfig",
        directory / "shoots" / "a" / "plane" / "kubeconfig",
        directory / "shoots" / "b" / "plane" / "kubeconfig",
    ):
        assert str(kubeconfig) in text
        assert kubeconfig.is_file()
    # How to try the SRE's kubectl plugin: kubectl finds it on PATH, in the virtualenv's scripts.
    assert f"export PATH={Path(sys.executable).parent}:$PATH" in text
    assert "kubectl preservation list --kubeconfig=$SHOOT_B" in text
    binaries = sorted(Path(p.split()[0]).name for p in _our_processes(directory))
    # Per shoot: its kube-apiserver, GRM and MCM (two processes); the seed's etcd, kube-apiserver and
    # kube-controller-manager; and one installation: the webhook Deployment's two containers (the shoots' routes and
    # the seed's) and the extension (Python processes).
    for binary, count in (("machine-controller-manager", 2), ("machine-controller", 2),
                          ("gardener-resource-manager", 2), ("kube-apiserver", 3)):  # fmt: skip
        assert binaries.count(binary) == count, binaries
    commands = [p for p in _our_processes(directory) if " -m machine_preservation.playground" not in p]
    assert sum(" extension " in p for p in commands) == 1, commands
    webhooks = sorted(re.search(r"--routes=(\w+)", p).group(1) for p in commands if " webhook " in p)  # type: ignore[union-attr]
    assert webhooks == ["seed", "shoots"], commands
    _interrupt_and_check_teardown(process, directory)


def test_standalone_playground_starts_seeds_and_tears_down(toolchain: Toolchain, tmp_path: Path) -> None:
    """`--standalone` (the product without Gardener) in its cheapest form: everything started and the landscape
    seeded (every machine Running under real MCM), then torn down on Ctrl-C. Its walk-through's steps are the
    ones `make run --standalone` runs; the step runner they share runs in the Gardener walk-through above."""
    directory = tmp_path / "standalone"
    process, text = _run_interactive(["--standalone"], directory, toolchain)
    assert "machine-controller-manager v0.61.3 running" in text, text
    assert "pods running: a DaemonSet pod per node" in text, "seeded: every machine Running, workloads on them"
    assert "The playground is running" in text, text
    assert f"export KUBECONFIG={directory / 'cluster' / 'kubeconfig'}" in text
    running = _our_processes(directory)
    assert any("machine-controller-manager" in p for p in running), "real MCM runs while interactive"
    assert any(" controller " in p for p in running), running
    assert any(" webhook " in p for p in running), running
    _interrupt_and_check_teardown(process, directory)


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
