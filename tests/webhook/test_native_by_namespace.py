"""NativeByNamespace: whether a namespace's MCM preserves natively, read when first needed, cached for a TTL,
one read shared by concurrent requests, bounded in size and time, and never an error. The reads against a real
API server are in tests/integration/test_webhook_mcm_detection.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from machine_preservation.core.mcm_generation import ClusterEvidence
from machine_preservation.webhook.mcm_detection import RETRY_SECONDS, ExtensionNamespaces, NativeByNamespace

V61 = ClusterEvidence(mcm_image="r/machine-controller-manager:v0.61.3")
V62 = ClusterEvidence(mcm_image="r/machine-controller-manager:v0.62.0")
NEW_CRDS = ClusterEvidence(machine_crd_has_expiry=True, machine_set_crd_has_auto_max=True)
NOTHING = ClusterEvidence()


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    """What each namespace shows; a read may be held (`gate`), fail, or hang."""

    evidence: dict[str, ClusterEvidence] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None
    failure: BaseException | None = None
    hang: bool = False

    async def read(self, api_client: Any, namespace: str, seconds: float) -> ClusterEvidence:
        assert api_client == "client"
        self.reads.append(namespace)
        if self.gate is not None:
            await self.gate.wait()
        if self.hang:
            await asyncio.sleep(3600)
        if self.failure is not None:
            raise self.failure
        return self.evidence.get(namespace, NOTHING)


def cache(cluster: Cluster, clock: Clock, **options: Any) -> NativeByNamespace:
    async def connect() -> Any:
        return "client"

    return NativeByNamespace(connect=connect, read=cluster.read, monotonic=clock, **options)


async def test_each_namespace_decides_from_its_own_mcm() -> None:
    cluster, clock = Cluster({"a": V62, "b": V61}), Clock()
    natives = cache(cluster, clock)
    assert await natives.native("a") is True
    assert await natives.native("b") is False
    assert await natives.native("unknown") is False  # nothing shown: not native
    assert cluster.reads == ["a", "b", "unknown"]


async def test_a_decision_is_kept_for_the_ttl_then_read_again() -> None:
    """At least three quarters of the TTL, at most all of it: decisions made together expire spread out."""
    cluster, clock = Cluster({"a": V61}), Clock()
    natives = cache(cluster, clock, ttl=60.0)
    assert await natives.native("a") is False
    cluster.evidence["a"] = V62  # MCM upgraded
    clock.now += 44.9
    assert await natives.native("a") is False
    assert cluster.reads == ["a"]
    clock.now += 15.1
    assert await natives.native("a") is True
    assert cluster.reads == ["a", "a"]
    # And back (a rollback), after the next TTL.
    cluster.evidence["a"] = V61
    clock.now += 60.0
    assert await natives.native("a") is False


async def test_decisions_made_together_expire_at_different_times() -> None:
    cluster, clock = Cluster({f"ns{n}": V61 for n in range(50)}), Clock()
    natives = cache(cluster, clock, ttl=60.0)
    await asyncio.gather(*(natives.native(f"ns{n}") for n in range(50)))
    clock.now += 52.5
    cluster.reads.clear()
    await asyncio.gather(*(natives.native(f"ns{n}") for n in range(50)))
    assert 0 < len(cluster.reads) < 50, "some expired, some not"


async def test_a_burst_of_first_requests_reads_a_few_namespaces_at_a_time() -> None:
    cluster, clock = Cluster(), Clock()
    cluster.gate = asyncio.Event()
    natives = cache(cluster, clock, max_reads=3)
    waiting = [asyncio.create_task(natives.native(f"ns{n}")) for n in range(20)]
    await asyncio.sleep(0.05)
    assert len(cluster.reads) == 3, "the others wait for a turn"
    cluster.gate.set()
    assert await asyncio.gather(*waiting) == [False] * 20
    assert len(cluster.reads) == 20


async def test_concurrent_requests_share_one_read() -> None:
    cluster, clock = Cluster({"a": V62, "b": V61}), Clock()
    cluster.gate = asyncio.Event()
    natives = cache(cluster, clock)
    waiting = [asyncio.create_task(natives.native(ns)) for ns in ("a", "a", "b", "a", "b")]
    await asyncio.sleep(0.01)
    assert sorted(cluster.reads) == ["a", "b"]
    cluster.gate.set()
    assert await asyncio.gather(*waiting) == [True, True, False, True, False]
    assert sorted(cluster.reads) == ["a", "b"]


async def test_a_request_that_gives_up_does_not_cancel_the_shared_read() -> None:
    cluster, clock = Cluster({"a": V62}), Clock()
    cluster.gate = asyncio.Event()
    natives = cache(cluster, clock)
    first = asyncio.create_task(natives.native("a"))
    second = asyncio.create_task(natives.native("a"))
    await asyncio.sleep(0.01)
    first.cancel()
    cluster.gate.set()
    assert await second is True
    with pytest.raises(asyncio.CancelledError):
        await first
    assert cluster.reads == ["a"]


@pytest.mark.parametrize(
    "failure", [RuntimeError("a bug"), OSError("unreachable"), ValueError("bad kubeconfig"), TimeoutError()]
)
async def test_a_failed_read_is_evidence_not_given(failure: BaseException) -> None:
    cluster, clock = Cluster({"a": V62}), Clock()
    cluster.failure = failure
    natives = cache(cluster, clock)
    assert await natives.native("a") is False
    # Nothing was known: read again soon, not only after the TTL.
    cluster.failure = None
    clock.now += RETRY_SECONDS
    assert await natives.native("a") is True


async def test_a_failed_connection_is_evidence_not_given_and_retried() -> None:
    clock, attempts = Clock(), []

    async def connect() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("no route")
        return "client"

    cluster = Cluster({"a": V62})
    natives = NativeByNamespace(connect=connect, read=cluster.read, monotonic=clock)
    assert await natives.native("a") is False
    clock.now += RETRY_SECONDS
    assert await natives.native("a") is True
    assert len(attempts) == 2


async def test_a_weaker_read_keeps_the_last_decision_and_retries_soon() -> None:
    cluster, clock = Cluster({"a": V61}), Clock()
    natives = cache(cluster, clock, ttl=60.0)
    assert await natives.native("a") is False
    # The seed's CRDs are v0.62 (another shoot's MCM is), but this shoot's Deployment cannot be read this time:
    # that says nothing about this shoot's MCM.
    cluster.evidence["a"] = NEW_CRDS
    clock.now += 60.0
    assert await natives.native("a") is False
    clock.now += RETRY_SECONDS - 0.1
    assert await natives.native("a") is False
    assert len(cluster.reads) == 2
    cluster.evidence["a"] = V62
    clock.now += 0.1
    assert await natives.native("a") is True
    # Failing outright keeps it too.
    cluster.failure = OSError("gone")
    clock.now += 60.0
    assert await natives.native("a") is True


async def test_the_crds_decide_where_no_deployment_was_ever_seen() -> None:
    cluster, clock = Cluster({"a": NEW_CRDS}), Clock()
    natives = cache(cluster, clock)
    assert await natives.native("a") is True


async def test_a_hanging_read_is_given_up_after_the_timeout() -> None:
    cluster, clock = Cluster({"a": V62}), Clock()
    cluster.hang = True
    natives = cache(cluster, clock, timeout=0.2)
    started = time.monotonic()
    results = await asyncio.gather(natives.native("a"), natives.native("a"))
    assert list(results) == [False, False]
    assert time.monotonic() - started < 1.0
    assert cluster.reads == ["a"]


async def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cluster, clock = Cluster({"a": V62, "b": V62, "c": V62}), Clock()
    natives = cache(cluster, clock, max_entries=2)
    await natives.native("a")
    await natives.native("b")
    await natives.native("a")  # a is now the most recent
    await natives.native("c")  # b goes
    assert cluster.reads == ["a", "b", "c"]
    await natives.native("a")
    await natives.native("c")
    assert cluster.reads == ["a", "b", "c"]
    await natives.native("b")
    assert cluster.reads == ["a", "b", "c", "b"]


async def test_close_releases_the_client_and_forgets() -> None:
    closed: list[bool] = []

    class Client:
        async def close(self) -> None:
            closed.append(True)

    async def connect() -> Any:
        return Client()

    async def read(api_client: Any, namespace: str, seconds: float) -> ClusterEvidence:
        return V62

    natives = NativeByNamespace(connect=connect, read=read)
    assert await natives.native("a") is True
    await natives.close()
    assert closed == [True]
    await natives.close()
    assert closed == [True]


@dataclass
class Extensions:
    """The namespaces holding our Extension, as each list shows them; a list may fail."""

    namespaces: set[str] = field(default_factory=set)
    lists: int = 0
    failure: BaseException | None = None

    async def list(self, api_client: Any, seconds: float) -> frozenset[str]:
        assert api_client == "client"
        self.lists += 1
        if self.failure is not None:
            raise self.failure
        return frozenset(self.namespaces)


def shoots(extensions: Extensions, clock: Clock) -> ExtensionNamespaces:
    async def connect() -> Any:
        return "client"

    return ExtensionNamespaces(
        connect=connect, list_namespaces=extensions.list, monotonic=clock, period=60.0, min_interval=5.0
    )


async def test_only_shoots_with_our_extension_are_read_and_cached() -> None:
    """Made-up names in `/shoots/<namespace>/` URLs send no reads to the seed and push no real shoot out."""
    cluster, clock = Cluster({"shoot--p--a": V62, "made-up-0": V62}), Clock()
    extensions = Extensions({"shoot--p--a"})
    natives = cache(cluster, clock, only=shoots(extensions, clock), default=False, max_entries=2)
    assert await natives.native("shoot--p--a") is True
    for n in range(100):
        assert await natives.native(f"made-up-{n}") is False  # the process-wide decision
    assert cluster.reads == ["shoot--p--a"]
    # At most one list per min_interval however many unknown names arrive.
    assert extensions.lists == 1
    clock.now += 5.0
    await asyncio.gather(*(natives.native(f"made-up-{n}") for n in range(100, 200)))
    assert extensions.lists == 2
    assert await natives.native("shoot--p--a") is True
    assert cluster.reads == ["shoot--p--a"], "still cached"


async def test_a_new_shoot_is_found_once_it_has_our_extension() -> None:
    cluster, clock = Cluster({"shoot--p--b": V62}), Clock()
    extensions = Extensions()
    natives = cache(cluster, clock, only=shoots(extensions, clock), default=False)
    assert await natives.native("shoot--p--b") is False
    extensions.namespaces.add("shoot--p--b")
    assert await natives.native("shoot--p--b") is False  # listed just now: not again yet
    clock.now += 5.0
    assert await natives.native("shoot--p--b") is True
    assert cluster.reads == ["shoot--p--b"]


async def test_a_failed_list_keeps_what_the_last_one_showed() -> None:
    clock = Clock()
    extensions = Extensions({"shoot--p--a"})
    known = shoots(extensions, clock)
    assert await known.contains("shoot--p--a")
    extensions.failure = OSError("no answer")
    clock.now += 60.0
    assert await known.contains("shoot--p--a")
    assert extensions.lists == 2
