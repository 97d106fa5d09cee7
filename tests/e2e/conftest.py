"""End-to-end fixtures: a control plane per MCM version (with that version's own CRDs), and real MCM per test.

`real_mcm` runs MCM v0.61.3 unless the test asks for other versions:

    @pytest.mark.parametrize("mcm_version", ALL_MCM_VERSIONS, indirect=True)
    async def test_something(real_mcm: RealMcm) -> None: ...

Tests of one version share that version's control plane (pytest groups them); each test gets its own
namespace and its own MCM processes, whose logs are printed when the test fails.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes.aio import client

from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.gardener_landscape import seed_client
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION
from machine_preservation.localcluster.mcm_pool import FakeKubelets
from machine_preservation.localcluster.mcm_runner import McmRunner, McmSettings
from machine_preservation.localcluster.toolchain import Toolchain
from tests.e2e.harness import MachineRecorder, RealMcm
from tests.e2e.product import Product, mcm_control_plane


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Lets fixtures see whether their test failed (to print MCM's logs then).
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session", params=[DEFAULT_MCM_VERSION])
def mcm_version(request: pytest.FixtureRequest) -> str:
    version: str = request.param
    return version


@pytest.fixture(scope="session")
def mcm_plane(
    mcm_version: str, toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane with MCM's own CRDs of `mcm_version` (plus the Shoot and Gardener Cluster CRDs)."""
    directory = tmp_path_factory.mktemp(f"mcm-{mcm_version}-plane")
    with mcm_control_plane(directory=directory, bin_dir=toolchain.bin_dir, mcm_version=mcm_version) as plane:
        yield plane


@pytest.fixture
async def seed(mcm_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An administrator's client of `mcm_plane` as a Gardener seed (Gardener's seed CRDs installed)."""
    async with seed_client(mcm_plane) as api:
        yield api


@pytest.fixture
def mcm_settings() -> McmSettings:
    """MCM's flags; override this fixture in a test module to change them."""
    return McmSettings()


@pytest.fixture
async def real_mcm(
    request: pytest.FixtureRequest,
    mcm_plane: ControlPlane,
    mcm_version: str,
    mcm_settings: McmSettings,
    tmp_path: Path,
) -> AsyncIterator[RealMcm]:
    """Real MCM for a fresh namespace, with fake kubelets running; everything goes when the test ends."""
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    api = await new_api_client(kubeconfig=mcm_plane.kubeconfig)
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    runner = McmRunner(
        plane=mcm_plane, namespace=namespace, directory=tmp_path / "mcm", version=mcm_version, settings=mcm_settings
    )
    harness = RealMcm(
        version=mcm_version,
        namespace=namespace,
        plane=mcm_plane,
        api=api,
        runner=runner,
        kubelets=FakeKubelets(api, namespace),
        recorder=MachineRecorder(api, namespace),
    )
    try:
        await asyncio.to_thread(runner.start)
        async with harness.recorder.running(), harness.kubelets.running():
            yield harness
    finally:
        failed = getattr(request.node, "report_call", None)
        if failed is not None and failed.failed:
            print(f"MCM {mcm_version} logs: {runner.logs_dir}\n{runner.log_tail(80)}")
        await harness.tear_down()
        await client.CoreV1Api(api).delete_namespace(namespace)
        await api.close()


@pytest.fixture
async def product(
    request: pytest.FixtureRequest, real_mcm: RealMcm, toolchain: Toolchain, tmp_path: Path
) -> AsyncIterator[Product]:
    """Our webhook and controller for `real_mcm`'s namespace, started by `await product.start(...)`; both
    processes are stopped and everything outside the namespace is removed when the test ends."""
    found = Product(
        plane=real_mcm.plane,
        toolchain=toolchain,
        namespace=real_mcm.namespace,
        directory=tmp_path / "product",
        api=real_mcm.api,
    )
    try:
        yield found
    finally:
        failed = getattr(request.node, "report_call", None)
        if failed is not None and failed.failed:
            print(f"our logs:\n{found.log_tail(80)}")
        await found.tear_down()
