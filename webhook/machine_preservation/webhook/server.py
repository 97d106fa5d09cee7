"""The HTTPS server: the app behind a bounded TLS listener whose certificate reloads without a restart.

`routes` (`--routes`) picks the admission routes it serves. In a seed, the seed's fail-closed Machine webhooks
(`seed`) and every shoot's node webhooks (`shoots`, which every shoot's kube-apiserver and anything in a shoot
namespace can reach) run as two processes: then a flood on the shoots' port takes neither the seed's connection
slots nor its event loop's time (benchmarks/webhook_isolation.py).
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
    """Start with `async with WebhookServer(...) as server:`; `server.port` is the bound port."""

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
        routes: Routes = "all",
        clock: Clock = system_clock,
    ) -> None:
        self.host = host
        self.metrics = WebhookMetrics()
        self.certificates = CertificateStore(cert_dir=cert_dir, metrics=self.metrics, clock=clock)
        self.app = build_app(
            WebhookConfig(
                settings=settings,
                machine_sets=machine_sets,
                native=native,
                ready=self.ready,
                metrics=self.metrics,
                max_body_bytes=max_body_bytes,
                clock=clock,
            ),
            routes=routes,
        )
        self.routes = routes
        self.machine_sets = machine_sets
        self._requested_port = port
        self._poll_interval = cert_poll_interval
        self.limits = limits or ConnectionLimits()
        self._runner: web.AppRunner | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def guards_machines(self) -> bool:
        """Whether it serves the Machine deletion guard (not on the shoots' routes)."""
        return self.routes != "shoots"

    def ready(self) -> bool:
        """A valid serving certificate, and the deletion guard's caches synced where it serves the guard."""
        return self.certificates.ready() and (not self.guards_machines or self.machine_sets.synced())

    async def start(self) -> None:
        if self.guards_machines:
            await self.machine_sets.start()
        self.certificates.reload()
        self._watcher = asyncio.create_task(self.certificates.watch(interval=self._poll_interval))
        # No access log: one line per admission request is noise at node-update rates and costs latency.
        # aiohttp's keep-alive timeout is our idle timeout: it closes a connection that has not sent its next
        # request in time after a response.
        self._runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=5.0, keepalive_timeout=self.limits.idle_timeout
        )
        await self._runner.setup()
        site = TLSSite(
            self._runner,
            self.host,
            self._requested_port,
            ssl_context=self.certificates.listener_context,
            limits=self.limits,
            metrics=self.metrics,
            listener=self.routes,
        )
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> WebhookServer:
        await self.start()
        return self

    async def __aexit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.stop()
