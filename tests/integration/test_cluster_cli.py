"""`python -m machine_preservation.localcluster up|down` as a user runs it: a detached control plane, then a
clean stop."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from machine_preservation.localcluster.controlplane import ControlPlane, ControlPlaneError, stop_control_plane
from machine_preservation.localcluster.toolchain import Toolchain

CLI = [sys.executable, "-m", "machine_preservation.localcluster"]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def test_help_lists_up_and_down() -> None:
    result = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True)
    assert "up" in result.stdout
    assert "down" in result.stdout


def test_cluster_up_then_down(toolchain: Toolchain, tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    env = {**os.environ, "MACHINE_PRESERVATION_K8S_BIN": str(toolchain.bin_dir)}
    up = subprocess.run([*CLI, "up", "--dir", str(directory)], capture_output=True, text=True, env=env, timeout=300)
    assert up.returncode == 0, up.stderr
    kubeconfig = Path(up.stdout.strip().splitlines()[-1])
    assert kubeconfig == directory / "kubeconfig"
    assert kubeconfig.is_file()

    # The processes outlive the command that started them.
    pids = [entry["pid"] for entry in json.loads((directory / "state.json").read_text())["processes"].values()]
    assert len(pids) == 3
    assert all(_alive(pid) for pid in pids)
    crds = subprocess.run(
        [str(toolchain.kubectl), "--kubeconfig", str(kubeconfig), "get", "crd", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "customresourcedefinition.apiextensions.k8s.io/machines.machine.sapcloud.io" in crds.stdout
    assert "customresourcedefinition.apiextensions.k8s.io/machineclasses.machine.sapcloud.io" in crds.stdout
    assert "customresourcedefinition.apiextensions.k8s.io/clusters.extensions.gardener.cloud" in crds.stdout
    # MCM v0.61.3's own Machine CRD, unchanged: it does not declare the preservation status field.
    schema = subprocess.run(
        [
            str(toolchain.kubectl),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "crd",
            "machines.machine.sapcloud.io",
            "-o",
            "jsonpath={.spec.versions[0].schema.openAPIV3Schema.properties.status.properties.currentStatus}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "phase" in schema.stdout
    assert "preserveExpiryTime" not in schema.stdout

    second = subprocess.run([*CLI, "up", "--dir", str(directory)], capture_output=True, text=True, env=env)
    assert second.returncode == 1
    assert "already holds a control plane" in second.stderr

    down = subprocess.run([*CLI, "down", "--dir", str(directory)], capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert not any(_alive(pid) for pid in pids)
    assert not directory.exists()

    again = subprocess.run([*CLI, "down", "--dir", str(directory)], capture_output=True, text=True)
    assert again.returncode == 1
    assert "no control plane recorded" in again.stderr


def test_a_failing_binary_is_reported_with_its_log_and_nothing_is_left_running(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    etcd = bin_dir / "etcd"
    etcd.write_text("#!/bin/sh\necho 'etcd: cannot start: disk on fire' >&2\nexit 3\n")
    etcd.chmod(0o755)
    plane = ControlPlane(directory=tmp_path / "plane", bin_dir=bin_dir)
    with pytest.raises(ControlPlaneError, match=r"(?s)etcd exited with code 3.*disk on fire"):
        plane.start(timeout=30)
    assert not (plane.directory / "state.json").exists()


def test_stop_never_kills_a_recycled_pid(tmp_path: Path) -> None:
    # A state file whose pid now belongs to another program (here: this test process).
    directory = tmp_path / "stale"
    directory.mkdir()
    state = {"processes": {"etcd": {"pid": os.getpid(), "binary": "/nonexistent/etcd"}}}
    (directory / "state.json").write_text(json.dumps(state))
    assert stop_control_plane(directory) is True
    assert _alive(os.getpid())
    assert not directory.exists()


def test_a_control_plane_runs_with_the_feature_gates_it_is_given(
    control_plane: ControlPlane, toolchain: Toolchain, tmp_path: Path
) -> None:
    plane = ControlPlane(
        directory=tmp_path / "gated",
        bin_dir=toolchain.bin_dir,
        etcd_servers=control_plane.etcd_url,
        etcd_prefix="/gated",
        controller_manager=False,
        feature_gates={"DetectCacheInconsistency": False},
    )
    plane.start()
    try:
        context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
        context.load_cert_chain(plane.pki_dir / "admin.crt", plane.pki_dir / "admin.key")
        url = f"{plane.server}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=30) as response:
            metrics = response.read().decode()
    finally:
        plane.stop()
    gate = [line for line in metrics.splitlines() if line.startswith('kubernetes_feature_enabled{name="DetectCache')]
    assert gate == ['kubernetes_feature_enabled{name="DetectCacheInconsistency",stage="BETA"} 0'], gate
