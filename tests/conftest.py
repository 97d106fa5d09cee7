"""Shared fixtures: one real control plane per test session, one namespace per test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from machine_preservation.localcluster import hosts
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.crds import install_crds
from machine_preservation.localcluster.hosts import HostsError
from machine_preservation.localcluster.toolchain import Toolchain, ensure_toolchain


def pytest_configure(config: pytest.Config) -> None:
    # Shoot API servers are reached by their Service names, as in a seed (localcluster.hosts): through a private
    # copy of /etc/hosts, which a process can only set up while it has one thread. Where that is not possible (not
    # root), the tests that start a shoot say why.
    with contextlib.suppress(HostsError):
        hosts.make_private()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(f"tests/{d}/" in item.nodeid or item.nodeid.startswith(f"{d}/") for d in ("integration", "e2e")):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    return ensure_toolchain()


@pytest.fixture(scope="session")
def control_plane(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, with our CRDs installed."""
    plane = ControlPlane(directory=tmp_path_factory.mktemp("control-plane"), bin_dir=toolchain.bin_dir)
    plane.start()
    try:
        install_crds(plane.kubeconfig)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    with api_client:
        yield api_client


@pytest.fixture
def namespace(kube_client: client.ApiClient) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (the namespace controller finishes the job)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture
def kubeconfig_for(control_plane: ControlPlane, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a kubeconfig for another identity (client certificate with CN=user, O=groups)."""

    def make(user: str, groups: tuple[str, ...] = ()) -> Path:
        return control_plane.write_kubeconfig(
            tmp_path / f"{user.replace(':', '_')}.kubeconfig", user=user, groups=groups
        )

    return make
