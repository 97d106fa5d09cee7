"""The real machine-controller-manager (MCM) for tests and the playground: its binaries and its CRDs.

- Binaries: localcluster/go/mcm/build.sh builds, per MCM version, MCM's controller-manager and a provider machine
  controller with our in-memory driver (provider `fake`) into a cache directory keyed by version, go.mod/go.sum
  and the driver source; a warm cache makes this instant.
- CRDs: MCM's own, unchanged, from its Go module (`go mod download` puts the module in Go's module cache),
  and Gardener's `Cluster` CRD from the Gardener module the same way.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from machine_preservation.localcluster.toolchain import ToolchainError, configured_bin_dir, run_build_script

MCM_MODULE = "github.com/gardener/machine-controller-manager"
# The generation without native preservation, the one the product exists for.
DEFAULT_MCM_VERSION = "v0.61.3"
GARDENER_MODULE = "github.com/gardener/gardener"
# The Gardener release the seed CRDs and gardener-resource-manager come from (localcluster/go/gardener-resource-manager
# builds GRM from the same version).
GARDENER_VERSION = "v1.150.0"
CLUSTER_CRD_PATH = "example/seed-crds/10-crd-extensions.gardener.cloud_clusters.yaml"

MCM_BINARIES = ("machine-controller-manager", "machine-controller")


def _tools_dir() -> Path | None:
    # localcluster/machine_preservation/localcluster/mcm.py -> repository root
    directory = Path(__file__).resolve().parents[3] / "localcluster" / "go" / "mcm"
    return directory if (directory / "build.sh").is_file() else None


def mcm_versions() -> tuple[str, ...]:
    """The MCM versions localcluster/go/mcm builds (localcluster/go/mcm/versions.env), the default first."""
    tools = _tools_dir()
    if tools is None:
        return (DEFAULT_MCM_VERSION,)
    match = re.search(r'^MCM_VERSIONS="([^"]*)"', (tools / "versions.env").read_text(), re.MULTILINE)
    if match is None:
        raise ToolchainError(f"{tools / 'versions.env'} has no MCM_VERSIONS line")
    return tuple(match.group(1).split())


def ensure_mcm_binaries(version: str = DEFAULT_MCM_VERSION) -> Path:
    """The directory holding `machine-controller-manager` and `machine-controller` for `version`, building
    them if needed (MACHINE_PRESERVATION_MCM_BIN=<dir> overrides, for installs without the source tree)."""
    configured = configured_bin_dir("MACHINE_PRESERVATION_MCM_BIN", MCM_BINARIES)
    if configured is not None:
        return configured
    tools = _tools_dir()
    if tools is None:
        raise ToolchainError(
            "machine-controller-manager not found: set MACHINE_PRESERVATION_MCM_BIN to a directory holding "
            f"{' and '.join(MCM_BINARIES)}, or run from a source checkout "
            "(localcluster/go/mcm/build.sh builds them with Go)"
        )
    if version not in mcm_versions():
        raise ToolchainError(f"MCM version {version!r} is not built here; known versions: {', '.join(mcm_versions())}")
    return run_build_script(tools / "build.sh", version)


@functools.cache
def go_module_dir(module: str, version: str) -> Path:
    """Where Go's module cache holds `module@version`, downloading it through the module proxy if needed."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    # Outside any module, so no go.mod or go.work around us takes part.
    with tempfile.TemporaryDirectory() as scratch:
        try:
            result = subprocess.run(
                ["go", "mod", "download", "-json", f"{module}@{version}"],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
        except FileNotFoundError as error:
            raise ToolchainError(f"Go is needed to fetch {module}@{version} from the module proxy") from error
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError as error:
        raise ToolchainError(f"go mod download {module}@{version} failed: {result.stderr.strip()}") from error
    if result.returncode != 0 or "Dir" not in answer:
        raise ToolchainError(f"go mod download {module}@{version} failed: {answer.get('Error') or result.stderr}")
    return Path(answer["Dir"])


def mcm_crds(version: str = DEFAULT_MCM_VERSION) -> Path:
    """The directory of MCM's own CRDs (MachineClass, Machine, MachineSet, MachineDeployment) at `version`."""
    directory = go_module_dir(MCM_MODULE, version) / "kubernetes" / "crds"
    if not any(directory.glob("*.yaml")):
        raise ToolchainError(f"{MCM_MODULE}@{version} has no CRDs under kubernetes/crds")
    return directory


def gardener_cluster_crd(version: str = GARDENER_VERSION) -> Path:
    """Gardener's `Cluster` CRD (extensions.gardener.cloud/v1alpha1) from the Gardener module."""
    path = go_module_dir(GARDENER_MODULE, version) / CLUSTER_CRD_PATH
    if not path.is_file():
        raise ToolchainError(f"{GARDENER_MODULE}@{version} has no {CLUSTER_CRD_PATH}")
    return path
