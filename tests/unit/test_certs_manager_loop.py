"""The certificates manager's loop: which failures it retries instead of ending."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs.manager import CertificateManager, ManagerSettings, PassResult
from tests.unit.test_certs_rotation import IDENTITY, POLICY


@pytest.mark.parametrize(
    "failure",
    [
        aiohttp.ServerDisconnectedError(),  # the API server closed a kept-alive connection: ended the loop before
        aiohttp.ClientConnectorError(ConnectionKey("h", 1, False, None, None, None, None), OSError()),
        TimeoutError(),
        ApiException(status=503, reason="Service Unavailable"),
    ],
)
async def test_the_loop_retries_a_pass_that_got_no_answer(
    failure: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ManagerSettings(
        secret_namespace="ns",
        secret_name="ca",
        cert_dir=tmp_path,
        identity=IDENTITY,
        policy=POLICY,
        configurations=(),
        ca_common_name="ca",
        resync=dt.timedelta(milliseconds=1),
    )
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as api:
        manager = CertificateManager(settings=settings, api_client=api, remote_clients={})
        outcomes: list[Exception | None] = [failure, None]

        async def sync_once() -> PassResult:
            if (outcome := outcomes.pop(0)) is not None:
                raise outcome
            return None  # type: ignore[return-value]  # `once` returns before reading the result

        monkeypatch.setattr(manager, "sync_once", sync_once)
        await asyncio.wait_for(manager.run(stop=asyncio.Event(), once=True), timeout=10)
    assert outcomes == []
