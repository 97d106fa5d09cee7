"""Run the whole controller in the test's event loop against the real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from machine_preservation.controller.manager import Controller, ControllerOptions
from machine_preservation.controller.metrics import Metrics
from machine_preservation.core.mcm_generation import NativePreservationMode
from tests.polling import eventually_async


@dataclasses.dataclass
class Running:
    controller: Controller
    stop: asyncio.Event
    task: asyncio.Task[int]

    async def shutdown(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, 60)


@contextlib.asynccontextmanager
async def running_controller(
    *, kubeconfig: Path, namespace: str, metrics: Metrics | None = None, **options: Any
) -> AsyncIterator[Running]:
    """The controller with `options` (ControllerOptions' fields); `metrics` may hook into its API clients."""
    # Not native by default: the test control plane's CRDs carry v0.62's preservation fields, which `auto` would
    # take for an MCM that preserves itself, and these tests exercise the controller's own lifecycle.
    settings: dict[str, Any] = {
        "leader_elect": False,
        "metrics_port": 0,
        "resync_period": 600.0,
        "native_preservation": NativePreservationMode.FALSE,
    }
    settings.update(options)
    controller = Controller(
        options=ControllerOptions(
            namespace=namespace, control_kubeconfig=kubeconfig, target_kubeconfig=kubeconfig, **settings
        ),
        metrics=metrics or Metrics(),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    running = Running(controller=controller, stop=stop, task=task)
    try:
        if not settings["leader_elect"]:
            await eventually_async(
                lambda: task.done() or (controller.caches is not None and controller.caches.synced())
            )
            if task.done():
                task.result()  # surface a startup failure
        yield running
    finally:
        if not task.done():
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)
