"""Every aiohttp request of a Python process, timed, into `$MP_TRACE.<pid>` (a developer tool, not the product).

Put this folder on PYTHONPATH with MP_TRACE set, and every Python process started so (a benchmark and the
product processes it spawns) writes one line per request: start time, duration, method, port, path, and whether
the connection was new (its connect + TLS time) or reused. Watches are left out. `timeline.py` reads the lines.

    PYTHONPATH=benchmarks/request_trace MP_TRACE=/tmp/trace/req .venv/bin/python benchmarks/seed_scale.py ...
"""

from __future__ import annotations

import os
import time
import types
from typing import Any, TextIO

if os.environ.get("MP_TRACE"):
    import aiohttp

    _out: TextIO | None = None
    _original_init = aiohttp.ClientSession.__init__

    def _file() -> TextIO:
        global _out
        if _out is None:
            _out = open(f"{os.environ['MP_TRACE']}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115
        return _out

    def _trace_config() -> aiohttp.TraceConfig:
        trace = aiohttp.TraceConfig()

        async def started(_session: Any, context: types.SimpleNamespace, _params: Any) -> None:
            context.started, context.connection = time.time(), None

        async def connecting(_session: Any, context: types.SimpleNamespace, _params: Any) -> None:
            context.connecting = time.time()

        async def connected(_session: Any, context: types.SimpleNamespace, _params: Any) -> None:
            context.connection = f"{(time.time() - context.connecting) * 1000:.1f}ms"

        async def reused(_session: Any, context: types.SimpleNamespace, _params: Any) -> None:
            context.connection = "reuse"

        async def ended(_session: Any, context: types.SimpleNamespace, params: aiohttp.TraceRequestEndParams) -> None:
            if "watch=" in params.url.query_string:
                return
            _file().write(
                f"{context.started:.4f} {time.time() - context.started:.4f} {params.method} {params.url.port} "
                f"{params.url.path} conn={context.connection}\n"
            )

        trace.on_request_start.append(started)
        trace.on_connection_create_start.append(connecting)
        trace.on_connection_create_end.append(connected)
        trace.on_connection_reuseconn.append(reused)
        trace.on_request_end.append(ended)
        return trace

    def _traced_init(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or []), _trace_config()]
        _original_init(self, *args, **kwargs)

    aiohttp.ClientSession.__init__ = _traced_init  # type: ignore[method-assign]
