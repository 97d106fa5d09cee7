"""What /proc says about a local process: its memory and CPU time (for benchmarks; Linux only)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from machine_preservation.localcluster.controlplane import STATE_FILE, ControlPlane


def process_memory_mib(pid: int) -> dict[str, float]:
    """`VmHWM` (peak resident) and `VmRSS` of a process in MiB; empty once it is gone."""
    result: dict[str, float] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return result
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            result[key] = int(value.split()[0]) / 1024
    return result


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (NaN once it is gone)."""
    try:
        # The command name in parentheses may hold spaces: the fields follow the last ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def control_plane_pids(plane: ControlPlane) -> dict[str, int]:
    """The pids of a started control plane's processes by binary name (etcd only if the plane runs its own)."""
    try:
        state = json.loads((plane.directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {name: int(entry["pid"]) for name, entry in (state.get("processes") or {}).items()}
