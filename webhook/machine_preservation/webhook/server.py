"""The HTTPS server: the app behind bounded TLS listeners whose certificate reloads without a restart.

With a `seed_port`, two listeners with a connection budget each: `port` serves only the shoots' node webhooks
(`/shoots/{namespace}/…`, which every shoot's kube-apiserver, and anything in a shoot namespace, can reach), and
`seed_port` the plain paths, the seed's fail-closed Machine webhooks among them. A flood on the shoot-facing
port then takes neither the seed's connection slots nor its routes. Without one, `port` serves everything.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import TracebackType

from aiohttp import web

from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.webhook.app import DEFAULT_MAX_BODY_BYTES, Routes, WebhookConfig, build_app
from machine_preservation.webhook.certificates import CertificateStore
from machine_preservation.webhook.connections import ConnectionLimits, TLSSite
from machine_preservation.webhook.machine_sets import MachineSetSource
from machine_preservation.webhook.mcm_detection import NativeSource
from machine_preservation.webhook.metrics import WebhookMetrics

DEFAULT_CERT_POLL_INTERVAL = 10.0


class WebhookServer:
    """Start with `async with WebhookServer(...) as server:`; `server.port` (and `server.seed_port`, with a
    `seed_port` asked for) are the bound ports."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        cert_dir: Path,
        settings: AdmissionSettings,
        machine_sets: MachineSetSource,
        native: NativeSource | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        cert_poll_interval: float = DEFAULT_CERT_POLL_INTERVAL,
        limits: ConnectionLimits | None = None,
        seed_port: int | None = None,
        seed_limits: ConnectionLimits | None = None,
        clock: Clock = system_clock,
    ) -> None:
        self.host = host
        self.metrics = WebhookMetrics()
        self.certificates = CertificateStore(cert_dir=cert_dir, metrics=self.metrics, clock=clock)
        config = WebhookConfig(
            settings=settings,
            machine_sets=machine_sets,
            native=native,
            ready=self.certificates.ready,
            metrics=self.metrics,
            max_body_bytes=max_body_bytes,
            clock=clock,
        )
        self.limits = limits or ConnectionLimits()
        self.seed_limits = seed_limits or ConnectionLimits()
        # (listener, routes, requested port, limits), the first one's port is `port`.
        self._listeners: list[tuple[str, Routes, int, ConnectionLimits]] = (
            [("all", "all", port, self.limits)]
            if seed_port is None
            else [("shoots", "shoots", port, self.limits), ("seed", "seed", seed_port, self.seed_limits)]
        )
        self.apps = [build_app(config, routes=routes) for _, routes, _, _ in self._listeners]
        self._poll_interval = cert_poll_interval
        self._runners: list[web.AppRunner] = []
        self._watcher: asyncio.Task[None] | None = None
        self.port = 0
        self.seed_port: int | None = None

    async def start(self) -> None:
        self.certificates.reload()
        self._watcher = asyncio.create_task(self.certificates.watch(interval=self._poll_interval))
        # No access log: one line per admission request is noise at node-update rates and costs latency.
        # aiohttp's keep-alive timeout is our idle timeout: it closes a connection that has not sent its next
        # request in time after a response.
        ports = []
        for app, (listener, _, port, limits) in zip(self.apps, self._listeners, strict=True):
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0, keepalive_timeout=limits.idle_timeout)
            await runner.setup()
            self._runners.append(runner)
            site = TLSSite(
                runner,
                self.host,
                port,
                ssl_context=self.certificates.listener_context,
                limits=limits,
                metrics=self.metrics,
                listener=listener,
            )
            await site.start()
            ports.append(int(runner.addresses[0][1]))
        self.port = ports[0]
        self.seed_port = ports[1] if len(ports) > 1 else None

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        # In order, the seed's listener last: its app closes the sources the shoots' requests may still be using.
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []

    async def __aenter__(self) -> WebhookServer:
        await self.start()
        return self

    async def __aexit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.stop()
