"""Leader election against an API server that accepts connections and never answers: every Lease request gives up
after its timeout and counts as a failed attempt, so the elector keeps campaigning (client-go's behaviour) instead
of hanging in one request, or ending the election with an exception."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from aiohttp import web

from machine_preservation.controller.machinery.leader import LeaderElector, LeadershipLost, WriteFence, _LeaseLock
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


async def test_leadership_ends_at_the_renew_deadline_of_the_last_renewal_sent() -> None:
    """The fence: `lost` once the renew deadline has passed since the last successful renewal was sent, however
    long the library would go on retrying; each renewal moves it on."""
    elector = LeaderElector(
        api_client=None,  # type: ignore[arg-type]  # the fence reads only the lock's last renewal
        namespace="ns",
        name="lease",
        identity="me",
        lease_duration=1,
        renew_deadline=0.3,
    )
    loop = asyncio.get_running_loop()
    lock = _LeaseLock("lease", "ns", "me", None)
    lock.renewed_at = loop.time()
    elector.leading.set()
    fence = asyncio.create_task(elector._fence(lock))
    for _ in range(4):  # renewals every 0.1 s keep it leading
        await asyncio.sleep(0.1)
        lock.renewed_at = loop.time()
        assert not elector.lost.is_set()
    stopped_renewing = lock.renewed_at
    await asyncio.wait_for(fence, 5)
    assert elector.lost.is_set()
    assert loop.time() >= stopped_renewing + elector.renew_deadline


def test_the_renew_deadline_is_shorter_than_the_lease() -> None:
    with pytest.raises(ValueError, match="shorter than the lease"):
        LeaderElector(api_client=None, namespace="ns", name="lease", identity="me", lease_duration=10)  # type: ignore[arg-type]


async def test_no_write_is_sent_past_the_renew_deadline_even_before_lost_is_set() -> None:
    """A stalled event loop may run a worker before the fence's timer: the client itself refuses to send."""
    received: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(request.method)
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    elector = LeaderElector(api_client=None, namespace="ns", name="lease", identity="me", renew_deadline=0.3)  # type: ignore[arg-type]
    fence = WriteFence(elector=elector)
    url = f"http://127.0.0.1:{port}/api/v1/namespaces/ns/pods/p/eviction"
    try:
        async with aiohttp.ClientSession(trace_configs=[fence.trace_config()]) as session:
            async with session.post(url) as response:
                assert response.status == 200, "before leading: the campaign writes"
            lock = elector._lock = _LeaseLock("lease", "ns", "me", None)
            lock.renewed_at = asyncio.get_running_loop().time()
            elector.leading.set()
            async with session.post(url) as response:
                assert response.status == 200, "within the renew deadline"
            await asyncio.sleep(0.4)
            assert not elector.lost.is_set()  # the fence's timer has not run (there is none here)
            with pytest.raises(LeadershipLost):
                await session.post(url)
            async with session.get(url) as response:
                assert response.status == 200, "reads go on"
        assert received == ["POST", "POST", "GET"]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("request_name", ["get", "update"])
async def test_a_stop_that_meets_a_lease_answer_still_stops(request_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled just as a Lease request was answered, a lock request still ends in CancelledError. (Python 3.11's
    `asyncio.wait_for` returned the answer instead: an elector cancelled that way went on renewing, and stopping it
    hung; it happened under a one-core CPU hog.)"""
    answered = asyncio.Event()

    async def answer(*_args: object) -> tuple[bool, None]:
        await answered.wait()
        return True, None

    monkeypatch.setattr(_LeaseLock.__mro__[1], request_name, answer)  # the library's lock, below the timeout
    lock = _LeaseLock("lease", "ns", "me", None)
    args = ("lease", "ns") if request_name == "get" else ("lease", "ns", None)
    request = asyncio.create_task(getattr(lock, request_name)(*args))
    await asyncio.sleep(0)  # the request waits for its answer
    answered.set()  # the answer and the stop in one turn of the loop
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
