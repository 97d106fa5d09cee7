"""The probe that tells a slow shoot API server (`shoots.ApiServerProbe`), against the real kube-apiserver behind a
proxy that passes its answers on late."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from machine_preservation.controller.gardener.shoots import ApiServerProbe
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.support import aio_client
from tests.controller.tcpproxy import TcpProxy


@pytest.fixture
async def proxy(control_plane: ControlPlane) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(upstream_port=control_plane.apiserver_port)
    await proxy.start()
    yield proxy
    await proxy.cut()


async def test_a_late_answer_or_none_is_slow_and_one_in_time_clears_it(
    control_plane: ControlPlane, proxy: TcpProxy, tmp_path: Path
) -> None:
    target = await aio_client(proxy.kubeconfig(source=control_plane.kubeconfig, target=tmp_path / "proxied"))
    probe = ApiServerProbe(slow_answer=0.5, timeout=2.0)
    try:
        assert await probe.verdict(target) == ""
        proxy.delay = 1.0
        late = await probe.verdict(target)
        assert late is not None
        assert late.startswith("GET /version took ")
        assert float(late.split()[-2]) >= 1.0
        proxy.delay = 3.0
        assert await probe.verdict(target) == "no answer to GET /version within 2 s"
        proxy.delay = 0.0
        assert await probe.verdict(target) == ""
        await proxy.cut()
        assert await probe.verdict(target) is None, "no answer at all is the watches' to report"
    finally:
        await target.close()
