"""Leader election against an API server that accepts connections and never answers: every Lease request gives up
after its timeout and counts as a failed attempt, so the elector keeps campaigning (client-go's behaviour) instead
of hanging in one request, or ending the election with an exception."""

from __future__ import annotations

import asyncio
import contextlib

from machine_preservation.controller.leader import LeaderElector
from tests.controller.silent import silent_api_server


async def test_unanswered_lease_requests_are_failed_attempts_retried_each_period() -> None:
    async with silent_api_server() as silent:
        elector = LeaderElector(
            api_client=silent.api, namespace="ns", name="lease", identity="me", renew_deadline=2.5, retry_period=1.1
        )
        running = asyncio.create_task(elector.run())
        await asyncio.sleep(5)
        assert not running.done(), "still campaigning: an unanswered request is not the end of the election"
        assert not elector.leading.is_set()
        assert not elector.lost.is_set()
        # Each attempt's request gave up after 1.25 s (half the renew deadline); the next asked on a new connection.
        assert len(silent.connections) >= 2, len(silent.connections)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
