"""The informer against the real apiserver: list then watch, index upkeep, bookmarks and resume,
re-list on 410 Gone, periodic resync, and reconnect after the apiserver goes away."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.core.models import Machine
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.informer import Informer, Source
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.crds import crd_manifests
from tests.controller.support import GROUP, VERSION, aio_client, create_machine
from tests.controller.tcpproxy import TcpProxy
from tests.polling import eventually_async

Event = tuple[str, str]


def machine_informer(api_client: client.ApiClient, namespace: str, **kwargs: object) -> Informer[Machine]:
    custom = client.CustomObjectsApi(api_client)
    return Informer(
        name="machines",
        source=Source(custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "machines")),
        parse=Machine.model_validate,
        **kwargs,  # type: ignore[arg-type]
    )


def record(informer: Informer[Machine]) -> list[Event]:
    events: list[Event] = []

    def handler(old: Machine | None, new: Machine | None) -> None:
        if new is None:
            assert old is not None
            events.append(("deleted", old.metadata.name))
        elif old is None:
            events.append(("added", new.metadata.name))
        elif old is new:
            events.append(("resync", new.metadata.name))
        else:
            events.append(("updated", new.metadata.name))

    informer.add_handler(handler)
    return events


@contextlib.asynccontextmanager
async def running(informer: Informer[Machine]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_lists_then_watches_and_keeps_the_node_index(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "m1", node="n1")
    informer = machine_informer(api, namespace, page_size=1)  # paginated list
    informer.add_indexer("node", lambda m: [m.node_name])
    events = record(informer)
    await create_machine(custom, namespace, "m2", node="n1")
    async with running(informer):
        await asyncio.wait_for(informer.wait_synced(), 30)
        assert sorted(informer.keys()) == [f"{namespace}/m1", f"{namespace}/m2"]
        assert [m.metadata.name for m in informer.by_index("node", "n1")] == ["m1", "m2"]

        await create_machine(custom, namespace, "m3", node="n2", phase="Failed")
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "machines",
            "m1",
            {"metadata": {"labels": {"node": "n2"}}},
            _content_type="application/merge-patch+json",
        )
        await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "m2")

        await eventually_async(lambda: informer.get(f"{namespace}/m2") is None and len(informer) == 2)
        await eventually_async(lambda: [m.metadata.name for m in informer.by_index("node", "n2")] == ["m1", "m3"])
        assert informer.by_index("node", "n1") == []
        m3 = informer.get(f"{namespace}/m3")
        assert m3 is not None
        assert m3.phase == "Failed", "status written after create arrives through the watch"
    assert events[:2] == [("added", "m1"), ("added", "m2")]
    assert ("added", "m3") in events
    assert ("updated", "m1") in events
    assert events[-1] == ("deleted", "m2")
    assert informer.stats.lists == 1


async def test_bookmarks_advance_the_resume_point_and_a_watch_end_resumes_without_relisting(
    api: client.ApiClient, namespace: str
) -> None:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    informer = machine_informer(api, namespace, watch_timeout=5)
    events = record(informer)
    elsewhere = f"{namespace}-x"
    await core.create_namespace({"metadata": {"name": elsewhere}})
    try:
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), 30)
            # Changes in another namespace are not our events, but bookmarks carry their resourceVersion.
            other = await create_machine(custom, elsewhere, "other")
            other_version = int(other["metadata"]["resourceVersion"])
            await eventually_async(lambda: informer.stats.bookmarks >= 1 and informer.stats.watches >= 2, limit=60)
            await eventually_async(lambda: int(informer.resource_version) >= other_version, limit=60)
            assert informer.stats.events == 0
            await create_machine(custom, namespace, "late")
            await eventually_async(lambda: informer.get(f"{namespace}/late") is not None)
    finally:
        await core.delete_namespace(elsewhere)
    assert informer.stats.lists == 1, "an ordinary watch timeout must resume, not re-list"
    assert informer.stats.expired == 0
    assert events[0] == ("added", "late")
    assert set(events[1:]) <= {("updated", "late")}, "then at most the status write after create"


async def test_an_expired_resource_version_triggers_a_relist_that_reconciles_deletions(
    api: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "gone-while-away")
    await create_machine(custom, namespace, "stays")
    informer = machine_informer(api, namespace)
    events = record(informer)
    async with running(informer):
        await asyncio.wait_for(informer.wait_synced(), 30)
    # While the informer is stopped one object is deleted and one created; then it resumes from a
    # resourceVersion the apiserver no longer has (410 Gone).
    await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "gone-while-away")
    await create_machine(custom, namespace, "new-while-away")
    informer.resource_version = "1"
    async with running(informer):
        await eventually_async(lambda: informer.stats.lists == 2)
        await eventually_async(lambda: sorted(informer.keys()) == [f"{namespace}/new-while-away", f"{namespace}/stays"])
    assert informer.stats.expired == 1
    assert ("deleted", "gone-while-away") in events
    assert ("added", "new-while-away") in events


async def test_a_watched_object_spanning_many_chunks_arrives_whole(api: client.ApiClient, namespace: str) -> None:
    # An annotation alone may hold up to 256 KiB: the event reaches the reader in many chunks.
    custom = client.CustomObjectsApi(api)
    informer = machine_informer(api, namespace)
    async with running(informer):
        await asyncio.wait_for(informer.wait_synced(), 30)
        await create_machine(custom, namespace, "big", annotations={"example.com/big": "x" * 200_000})
        await create_machine(custom, namespace, "after")
        await eventually_async(lambda: informer.get(f"{namespace}/after") is not None)
    big = informer.get(f"{namespace}/big")
    assert big is not None
    assert len(big.metadata.annotations["example.com/big"]) == 200_000
    assert informer.stats.errors == 0
    assert informer.stats.lists == 1, "both arrived as watch events"


async def test_resync_replays_every_cached_object_to_the_handlers(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "a")
    await create_machine(custom, namespace, "b")
    informer = machine_informer(api, namespace, resync_period=0.3)
    events = record(informer)
    async with running(informer):
        await eventually_async(lambda: {("resync", "a"), ("resync", "b")} <= set(events))
    assert informer.stats.resyncs >= 1
    assert informer.stats.lists == 1


async def test_survives_the_apiserver_going_away_and_coming_back(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, api: client.ApiClient
) -> None:
    proxy = TcpProxy(upstream_port=control_plane.apiserver_port)
    await proxy.start()
    proxied = await aio_client(proxy.kubeconfig(source=control_plane.kubeconfig, target=tmp_path / "proxied"))
    custom = client.CustomObjectsApi(api)
    informer = machine_informer(proxied, namespace, backoff=Backoff(base=0.1, cap=0.5))
    try:
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), 30)
            await proxy.cut()
            await create_machine(custom, namespace, "made-during-outage")
            await eventually_async(lambda: informer.stats.errors >= 2, limit=30)
            assert informer.get(f"{namespace}/made-during-outage") is None
            await proxy.start()
            await eventually_async(lambda: informer.get(f"{namespace}/made-during-outage") is not None, limit=30)
    finally:
        await proxy.cut()
        await proxied.close()
    assert informer.stats.lists == 1, "the watch resumed from its resourceVersion instead of re-listing"


async def test_is_served_again_as_soon_as_its_watch_is_answered_not_at_the_next_event(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    # Nothing changes in the namespace after the outage: the resumed watch sends no event (a bookmark comes
    # only about a minute later), yet the informer must stop reporting the outage at once.
    proxy = TcpProxy(upstream_port=control_plane.apiserver_port)
    await proxy.start()
    proxied = await aio_client(proxy.kubeconfig(source=control_plane.kubeconfig, target=tmp_path / "proxied"))
    informer = machine_informer(proxied, namespace, backoff=Backoff(base=0.1, cap=0.5))
    try:
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), 30)
            await proxy.cut()
            await eventually_async(lambda: informer.failing is not None, limit=30)
            await proxy.start()
            await eventually_async(lambda: informer.failing is None, limit=10)
    finally:
        await proxy.cut()
        await proxied.close()
    assert informer.stats.lists == 1, "the watch resumed: no re-list cleared the outage"


async def test_tells_its_state_listeners_each_change_of_its_health_and_only_those(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """Who reports a cache's health (a shoot's Extension condition) is told when it synced, when listing or
    watching starts failing and when it works again, not polled and not told on every event or retry."""
    proxy = TcpProxy(upstream_port=control_plane.apiserver_port)
    await proxy.start()
    proxied = await aio_client(proxy.kubeconfig(source=control_plane.kubeconfig, target=tmp_path / "proxied"))
    informer = machine_informer(proxied, namespace, backoff=Backoff(base=0.1, cap=0.2))
    told: list[tuple[bool, str | None]] = []

    def broken() -> None:
        raise RuntimeError("a listener's bug")

    informer.add_state_listener(broken)  # logged; neither the cache nor the other listeners stop
    informer.add_state_listener(lambda: told.append((informer.synced, informer.failing)))
    custom = client.CustomObjectsApi(api_client := await aio_client(control_plane.kubeconfig))
    try:
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), 30)
            assert told == [(True, None)]
            for name in ("a", "b", "c"):  # events are no news about its health
                await create_machine(custom, namespace, name)
            await eventually_async(lambda: len(informer) == 3)
            assert told == [(True, None)]
            await proxy.cut()
            await eventually_async(lambda: informer.stats.errors >= 4, limit=30)  # retried, still failing
            await proxy.start()
            await eventually_async(lambda: informer.failing is None, limit=10)
    finally:
        await proxy.cut()
        await proxied.close()
        await api_client.close()
    assert told[-1] == (True, None)
    assert all(failing for _, failing in told[1:-1]), told
    assert len(told) >= 3, told
    assert all(before != after for before, after in itertools.pairwise(told)), f"a repeat: {told}"


async def test_an_object_that_does_not_parse_is_skipped_not_fatal(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    await create_machine(custom, namespace, "good")
    await create_machine(custom, namespace, "odd")

    def parse(raw: Mapping[str, Any]) -> Machine:
        machine = Machine.model_validate(raw)
        if machine.metadata.name == "odd" or machine.metadata.labels.get("odd"):
            raise ValueError("does not fit the model")
        return machine

    informer = Informer(
        name="machines",
        source=Source(custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "machines")),
        parse=parse,
    )
    events = record(informer)
    async with running(informer):
        await asyncio.wait_for(informer.wait_synced(), 30)
        assert informer.keys() == [f"{namespace}/good"]
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "machines",
            "good",
            {"metadata": {"labels": {"odd": "yes"}}},
            _content_type="application/merge-patch+json",
        )
        await eventually_async(lambda: informer.get(f"{namespace}/good") is None)
        await create_machine(custom, namespace, "later")
        await eventually_async(lambda: informer.get(f"{namespace}/later") is not None)
    assert informer.stats.unparsable >= 2
    assert informer.stats.errors == 0
    assert ("deleted", "good") in events


async def test_survives_its_crd_being_removed_and_follows_it_once_it_is_back(api: client.ApiClient) -> None:
    """MCM's CRDs may be replaced (an upgrade): the informer keeps its cache and retries, never ends."""
    group = "informer-crd.machine-preservation.test"
    crd = next(m for m in crd_manifests() if m["metadata"]["name"] == f"machines.{GROUP}")
    crd = {**crd, "metadata": {"name": f"machines.{group}"}, "spec": {**crd["spec"], "group": group}}
    extensions = client.ApiextensionsV1Api(api)

    async def install() -> None:
        await extensions.create_custom_resource_definition(crd)  # type: ignore[arg-type]
        await eventually_async(lambda: _served(api, group))

    await install()
    informer = Informer(
        name="machines",
        source=Source(client.CustomObjectsApi(api).list_cluster_custom_object, (group, VERSION, "machines")),
        parse=Machine.model_validate,
        backoff=Backoff(base=0.1, cap=0.5),
    )
    try:
        async with running(informer) as task:
            await asyncio.wait_for(informer.wait_synced(), 30)
            await extensions.delete_custom_resource_definition(crd["metadata"]["name"])
            await eventually_async(lambda: informer.failing is not None, limit=60)
            assert not task.done(), "still running: a removed CRD is a failure to retry, not the end"

            await eventually_async(_gone(extensions, crd["metadata"]["name"]), limit=60)
            await install()
            await eventually_async(lambda: informer.failing is None and informer.stats.lists >= 2, limit=60)
            assert not task.done()
    finally:
        with contextlib.suppress(Exception):
            await extensions.delete_custom_resource_definition(crd["metadata"]["name"])


async def _served(api: client.ApiClient, group: str) -> bool:
    try:
        await client.CustomObjectsApi(api).list_cluster_custom_object(group, VERSION, "machines")
    except ApiException:
        return False
    return True


def _gone(extensions: client.ApiextensionsV1Api, name: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            await extensions.read_custom_resource_definition(name)
        except ApiException as error:
            return error.status == 404
        return False

    return check


class RecordedLists:
    """CustomObjectsApi's namespaced list, recording the `limit` of every list request (not the watches)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.limits: list[int] = []

    def list_namespaced_custom_object(self) -> None:  # named for `Source`, which calls the raw variant
        raise NotImplementedError

    async def list_namespaced_custom_object_without_preload_content(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("watch"):
            self.limits.append(kwargs["limit"])
        return await self.custom.list_namespaced_custom_object_without_preload_content(*args, **kwargs)


async def list_by_bytes(lists: RecordedLists, namespace: str, *, first_page_size: int = 1) -> Informer[Machine]:
    """An informer of the namespace's Machines, its pages of 1 to 50 objects sized to about 120 kB; synced."""
    informer = Informer(
        name="machines",
        source=Source(lists.list_namespaced_custom_object, (GROUP, VERSION, namespace, "machines")),
        parse=Machine.model_validate,
        page_size=50,
        page_bytes=120_000,
        first_page_size=first_page_size,
    )
    async with running(informer):
        await asyncio.wait_for(informer.wait_synced(), 30)
    return informer


async def create_big_machines(api: client.ApiClient, namespace: str, names: list[str]) -> None:
    custom = client.CustomObjectsApi(api)
    for name in names:
        await create_machine(custom, namespace, name, annotations={"owner.example.com/big": "x" * 50_000})


async def test_pages_are_sized_by_their_bytes(api: client.ApiClient, namespace: str) -> None:
    await create_big_machines(api, namespace, [f"m{i:02}" for i in range(14)])
    lists = RecordedLists(api)
    informer = await list_by_bytes(lists, namespace)
    assert len(informer) == 14
    # The first page takes 1 object (its size is not known yet: it may be big); the next ones as many as fit in
    # about 120 kB (objects of ~50 kB).
    assert lists.limits == [1, 2, 2, 2, 2, 2, 2, 2]


async def test_a_page_far_over_its_bytes_is_asked_for_again_one_object_at_a_time(
    api: client.ApiClient, namespace: str
) -> None:
    """Small objects first, big ones after (a shoot's normal Nodes, then an owner's big ones): the page sized by the
    small ones would hold many big ones, so once it comes to more than twice its bytes it is dropped unparsed and
    the same page is asked for again from one object."""
    custom = client.CustomObjectsApi(api)
    for i in range(6):
        await create_machine(custom, namespace, f"a{i:02}")
    await create_big_machines(api, namespace, [f"m{i:02}" for i in range(10)])
    lists = RecordedLists(api)
    informer = await list_by_bytes(lists, namespace)
    assert len(informer) == 16
    # 1 small object; 50 asked for (a page of 5 small and 10 big, ~500 kB: dropped after 240 kB); the same page
    # again from 1 object, then as many as fit in 120 kB.
    assert lists.limits[:3] == [1, 50, 1], lists.limits
    assert max(lists.limits[3:]) <= 50
    assert lists.limits[-1] == 2, lists.limits


async def test_a_first_page_of_many_objects_costs_one_round_trip_and_is_still_bounded_by_its_bytes(
    api: client.ApiClient, namespace: str
) -> None:
    """A node's pods are listed from a first page of many: small objects come in one request, and big ones after
    them still make the page dropped past twice its bytes and asked for again from one object."""
    custom = client.CustomObjectsApi(api)
    for i in range(6):
        await create_machine(custom, namespace, f"a{i:02}")
    lists = RecordedLists(api)
    assert len(await list_by_bytes(lists, namespace, first_page_size=50)) == 6
    assert lists.limits == [50]
    await create_big_machines(api, namespace, [f"m{i:02}" for i in range(10)])
    lists = RecordedLists(api)
    assert len(await list_by_bytes(lists, namespace, first_page_size=50)) == 16
    assert lists.limits[:2] == [50, 1], lists.limits


async def test_objects_over_the_byte_budget_fail_the_informer_until_they_are_within_it(
    api: client.ApiClient, namespace: str
) -> None:
    await create_big_machines(api, namespace, [f"m{i}" for i in range(8)])
    informer = machine_informer(api, namespace, page_size=2, byte_budget=300_000, backoff=Backoff(base=0.1, cap=0.5))
    async with running(informer):
        # Over the budget: no list completes, the informer says why.
        await eventually_async(lambda: informer.over_budget, limit=30)
        assert not informer.synced
        assert informer.failing is not None
        assert "over the budget" in informer.failing
        assert len(informer) == 0

        custom = client.CustomObjectsApi(api)
        for i in range(4, 8):
            await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", f"m{i}")
        # Within the budget once 5 are left: a re-list between two deletes may sync on 5, the watch then sees the last.
        await eventually_async(lambda: informer.synced and len(informer) == 4, limit=30)
        assert (informer.over_budget, informer.failing) == (False, None)

        # A watch event past the budget fails it again, and the re-lists say so.
        await create_big_machines(api, namespace, ["m8", "m9"])
        await eventually_async(lambda: informer.over_budget, limit=30)


async def test_a_cache_over_its_budget_parses_nothing_until_its_objects_fit(
    api: client.ApiClient, namespace: str
) -> None:
    """A re-list of a cache that was over its budget only counts (bytes as they stream in, objects from the API
    server's remainingItemCount): no object is parsed while they stay over it, however often it is tried; once
    they fit, they are read and parsed."""
    custom = client.CustomObjectsApi(api)
    await create_big_machines(api, namespace, [f"m{i}" for i in range(8)])
    parsed: list[str] = []

    def parse(raw: Mapping[str, Any]) -> Machine:
        parsed.append(raw["metadata"]["name"])
        return Machine.model_validate(raw)

    informer: Informer[Machine] = Informer(
        name="machines",
        source=Source(custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "machines")),
        parse=parse,
        page_size=2,
        byte_budget=300_000,
        backoff=Backoff(base=0.05, cap=0.1),
        budget_backoff=Backoff(base=0.05, cap=0.1),
    )
    async with running(informer):
        await eventually_async(lambda: informer.over_budget, limit=30)
        first = informer.stats.errors
        parsed_by_the_first_list = len(parsed)  # the first list parses as it goes, until past the budget
        await eventually_async(lambda: informer.stats.errors >= first + 5, limit=30)  # five re-lists, still over
        assert len(parsed) == parsed_by_the_first_list, "a re-list over the budget parsed objects"
        for i in range(4, 8):
            await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", f"m{i}")
        await eventually_async(lambda: informer.synced and len(informer) == 4, limit=30)
        assert sorted(parsed[parsed_by_the_first_list:])[:4] == ["m0", "m1", "m2", "m3"]


async def test_a_cache_over_its_budget_is_listed_again_by_its_own_backoff(
    api: client.ApiClient, namespace: str
) -> None:
    """Each re-list of a cache over its budget reads up to the budget again: it waits by `budget_backoff`, not by
    the short backoff of a failed watch."""
    await create_big_machines(api, namespace, [f"m{i}" for i in range(8)])
    informer = machine_informer(
        api,
        namespace,
        page_size=2,
        byte_budget=300_000,
        backoff=Backoff(base=0.05, cap=0.05),
        budget_backoff=Backoff(base=1.5, cap=1.5),
    )
    async with running(informer):
        await eventually_async(lambda: informer.over_budget, limit=30)

        def failed_since(first: int, more: int) -> float:
            return time.monotonic() if informer.stats.errors >= first + more else 0.0

        first = informer.stats.errors
        began = await eventually_async(lambda: failed_since(first, 1), limit=30, interval=0.02)
        ended = await eventually_async(lambda: failed_since(first, 4), limit=60, interval=0.02)
        # Three re-lists, each after a wait of 1.2-1.8 s (jittered): at least 3.6 s however slow the machine, where
        # the watch's 0.05 s would take well under a second. Half of it is left for a late look at the counter.
        assert ended - began >= 1.8, ended - began
        assert informer.over_budget


async def test_many_small_objects_count_at_least_their_minimum_against_the_budget(
    api: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    for i in range(6):
        await create_machine(custom, namespace, f"m{i}")
    informer = machine_informer(
        api, namespace, page_size=2, byte_budget=50_000, min_object_bytes=10_000, backoff=Backoff(base=0.1, cap=0.5)
    )
    async with running(informer):
        await eventually_async(lambda: informer.over_budget, limit=30)
        assert not informer.synced
        await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "machines", "m5")
        await asyncio.wait_for(informer.wait_synced(), 30)
        assert len(informer) == 5
