"""The process-wide reconcile cap: never more than `limit` at once, slots taken in the order asked for, a drain's
slot free while it waits, and no slot ever given back twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from machine_preservation.controller.machinery.slots import ReconcileSlots


async def test_never_more_than_the_limit_at_once() -> None:
    slots = ReconcileSlots(limit=2)
    running, most = 0, 0

    async def reconcile() -> None:
        nonlocal running, most
        async with slots.held():
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.01)
            running -= 1

    await asyncio.gather(*(reconcile() for _ in range(7)))
    assert most == 2
    assert slots.in_use == 0


async def test_slots_go_in_the_order_they_were_asked_for() -> None:
    """A shoot with a backlog (four workers asking again and again) takes turns with one that asks once."""
    slots = ReconcileSlots(limit=1)
    served: list[str] = []
    gate = asyncio.Event()

    async def worker(shoot: str, keys: int) -> None:
        for _ in range(keys):
            async with slots.held():
                await gate.wait()
                served.append(shoot)
                await asyncio.sleep(0)

    busy = [asyncio.create_task(worker("busy", 10)) for _ in range(4)]
    await asyncio.sleep(0)
    quiet = asyncio.create_task(worker("quiet", 1))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*busy, quiet)
    assert served.index("quiet") <= 4, f"served after at most one turn of each busy worker: {served}"


async def test_a_drain_lends_its_slot_and_takes_one_back_for_its_outcome() -> None:
    slots = ReconcileSlots(limit=1)
    draining, other_ran = asyncio.Event(), asyncio.Event()

    async def drain() -> None:
        async with slots.held():
            async with slots.lent():
                draining.set()
                await other_ran.wait()  # the pods take their time to leave
            assert slots.in_use == 1, "the outcome's writes hold a slot again"

    async def other() -> None:
        await draining.wait()
        async with slots.held():
            other_ran.set()

    await asyncio.wait_for(asyncio.gather(drain(), other()), 5)
    assert slots.in_use == 0


async def test_lending_outside_a_reconcile_frees_nothing() -> None:
    slots = ReconcileSlots(limit=1)
    async with slots.lent():
        assert slots.in_use == 0
    async with slots.held():
        async with slots.lent():
            assert slots.in_use == 0
        assert slots.in_use == 1
    assert slots.in_use == 0
    # Still one slot, not two: a second holder has to wait.
    async with slots.held():
        waiting = asyncio.create_task(_hold_once(slots))
        await asyncio.sleep(0.01)
        assert not waiting.done()
    await asyncio.wait_for(waiting, 1)


async def _hold_once(slots: ReconcileSlots) -> None:
    async with slots.held():
        pass


async def test_cancelled_while_taking_its_slot_back_gives_none_back() -> None:
    slots = ReconcileSlots(limit=1)
    lending = asyncio.Event()

    async def drain() -> None:
        async with slots.held(), slots.lent():
            lending.set()
            await asyncio.sleep(0.05)

    holder_in = asyncio.Event()
    release_holder = asyncio.Event()

    async def holder() -> None:
        await lending.wait()
        async with slots.held():
            holder_in.set()
            await release_holder.wait()

    drain_task = asyncio.create_task(drain())
    holder_task = asyncio.create_task(holder())
    await holder_in.wait()
    await asyncio.sleep(0.1)  # the drain is done lending and waits to take its slot back
    drain_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drain_task
    assert slots.in_use == 1, "only the holder's"
    release_holder.set()
    await holder_task
    assert slots.in_use == 0
    async with slots.held():  # exactly one slot is left: a second holder waits
        second = asyncio.create_task(_hold_once(slots))
        await asyncio.sleep(0.01)
        assert not second.done()
    await asyncio.wait_for(second, 1)


async def test_no_limit_means_no_cap() -> None:
    slots = ReconcileSlots()
    entered = 0

    async def reconcile() -> None:
        nonlocal entered
        async with slots.held():
            entered += 1
            await asyncio.sleep(0.01)

    await asyncio.gather(*(reconcile() for _ in range(50)))
    assert entered == 50
    assert slots.in_use == 0


async def test_a_task_the_holder_starts_never_lends_the_holders_slot() -> None:
    """A task inherits its starter's context; lending there would give back a slot it does not hold (twice, with
    the holder's own lending)."""
    slots = ReconcileSlots(limit=1)

    async def child() -> None:
        async with slots.lent():
            assert slots.in_use == 1, "the child lent nothing"

    async with slots.held():
        await asyncio.create_task(child())
        async with slots.lent():
            assert slots.in_use == 0
    assert slots.in_use == 0


@contextlib.asynccontextmanager
async def hanging_server() -> AsyncIterator[tuple[str, asyncio.Event, asyncio.Event]]:
    """An HTTP server on 127.0.0.1 that tells when a request `arrived` and answers once `answer` is set."""
    answer, arrived = asyncio.Event(), asyncio.Event()

    async def handler(_: web.Request) -> web.Response:
        arrived.set()
        await answer.wait()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/", answer, arrived
    finally:
        answer.set()
        await runner.cleanup()


async def test_a_request_through_the_trace_lends_the_slot_until_answered() -> None:
    slots = ReconcileSlots(limit=1)
    async with (
        hanging_server() as (url, answer, arrived),
        aiohttp.ClientSession(trace_configs=[slots.trace_config()]) as http,
    ):

        async def reconcile() -> int:
            async with slots.held(), http.get(url) as response:
                assert slots.in_use == 1, "taken back once answered"
                return response.status

        asking = asyncio.create_task(reconcile())
        await asyncio.wait_for(arrived.wait(), 5)
        assert slots.in_use == 0, "free while the answer is awaited"
        await asyncio.wait_for(_hold_once(slots), 1)
        answer.set()
        assert await asyncio.wait_for(asking, 5) == 200
        # A request outside a reconcile (an informer's) lends nothing.
        async with http.get(url) as response:
            assert response.status == 200
    assert slots.in_use == 0


async def test_a_request_cancelled_while_lent_gives_none_back() -> None:
    slots = ReconcileSlots(limit=1)
    async with (
        hanging_server() as (url, _, arrived),
        aiohttp.ClientSession(trace_configs=[slots.trace_config()]) as http,
    ):

        async def reconcile() -> None:
            async with slots.held():
                await http.get(url)

        asking = asyncio.create_task(reconcile())
        await asyncio.wait_for(arrived.wait(), 5)
        assert slots.in_use == 0, "lent while it waits"
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        assert slots.in_use == 0
        async with slots.held():  # exactly one slot is left: a second holder waits
            second = asyncio.create_task(_hold_once(slots))
            await asyncio.sleep(0.01)
            assert not second.done()
        await asyncio.wait_for(second, 1)
