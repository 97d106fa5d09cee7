"""Running a component as the chart's containers run it: on a read-only root filesystem, with one writable
directory for temporary files.

Root ignores file permissions, so the sandbox is a private mount namespace (`unshare --mount
--map-root-user`, which needs no privilege where unprivileged user namespaces are allowed): every mount is
remounted read-only, a fresh tmpfs stands in for the chart's emptyDir, and the sandbox checks before it
starts the component that no directory Python's tempfile would fall back to is writable.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

CONSOLE_SCRIPT = Path(sys.executable).parent / "machine-preservation"
NO_TEMPORARY_DIRECTORY = "No usable temporary directory found"
SANDBOX_BROKEN = 97

_SCRIPT = r"""
set -eu
writable=$1
shift
# Like readOnlyRootFilesystem: every mount read-only (the kernel's own filesystems aside).
awk '{print $5}' /proc/self/mountinfo | while read -r point; do
  case "$point" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
  mount -o remount,bind,ro "$point" 2>/dev/null || true
done
# The chart's emptyDir.
mount -t tmpfs -o size=8m,mode=0700 tmpfs "$writable"
# Prove the point: nothing Python's tempfile falls back to may be writable.
for dir in /tmp /var/tmp /usr/tmp "$PWD"; do
  if [ -d "$dir" ] && (: > "$dir/.sandbox-probe") 2>/dev/null; then
    echo "sandbox: $dir is still writable" >&2
    exit 97
  fi
done
exec "$@"
"""


def _die_with_parent() -> None:
    # A killed test run never leaves a component behind: SIGTERM when the test process goes.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def sandbox_command(command: Sequence[str], *, writable: Path) -> list[str]:
    return [
        "unshare",
        "--mount",
        "--map-root-user",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        _SCRIPT,
        "sandbox",
        str(writable),
        *command,
    ]


def sandbox_env(*, tmpdir: Path | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without any temporary-directory variable, plus TMPDIR when given."""
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    env.update(extra or {})
    return env


def start(
    command: Sequence[str], *, writable: Path, tmpdir: Path | None, cwd: Path, log: Path
) -> subprocess.Popen[bytes]:
    """Start `command` in the sandbox, output to `log` (read it with `log.read_text()`)."""
    writable.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        return subprocess.Popen(
            sandbox_command(command, writable=writable),
            cwd=cwd,
            env=sandbox_env(tmpdir=tmpdir),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )


def run(
    command: Sequence[str], *, writable: Path, tmpdir: Path | None, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    writable.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        sandbox_command(command, writable=writable),
        cwd=cwd,
        env=sandbox_env(tmpdir=tmpdir),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=_die_with_parent,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


_REMOTE_KUBECONFIG = re.compile(r"/etc/machine-preservation/(\w+)/kubeconfig")


def localise(args: Sequence[str], *, kubeconfigs: Mapping[str, Path], flags: Mapping[str, str]) -> list[str]:
    """The chart's container args for this machine: the mounted kubeconfigs' paths replaced by local files
    (each cluster's own), and the given flags' values replaced (ports, addresses, directories)."""
    localised = []
    for arg in args:
        arg = _REMOTE_KUBECONFIG.sub(lambda match: str(kubeconfigs[match.group(1)]), arg)
        flag = arg.split("=", 1)[0]
        if flag in flags:
            arg = f"{flag}={flags[flag]}"
        localised.append(arg)
    return localised
