"""Leader election on a coordination.k8s.io/v1 Lease with kubernetes.aio's LeaderElection.

The library acquires and renews; what it lacks we add: events the manager can wait on (leading /
lost), releasing the Lease on a graceful shutdown (client-go's ReleaseOnCancel) so the next
replica takes over within its retry period instead of waiting for the lease to expire, and a fence
on the renew deadline.

The fence: another replica may take the Lease over once it has seen the same record for `lease_duration`, counted
from no earlier than our last successful renewal was sent. The library only gives up after a whole renew loop, each
attempt's requests bounded by their timeout, which can end well after that. So `lost` is set as soon as
`renew_deadline` has passed since the last successful renewal was sent: everything that writes stops then, and
`lease_duration - renew_deadline` is left for what was already sent to land before another leader can start.
`WriteFence` refuses to send a write past that deadline even before the timer setting `lost` has run (an event
loop stalled past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import types
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.leaderelection import electionconfig, leaderelection
from kubernetes.aio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

from machine_preservation.core.clock import system_clock
from machine_preservation.kube.api_errors import NO_ANSWER, Conflict, Failed, NoAnswer, api_call, call

logger = logging.getLogger(__name__)


EXIT_OK = 0
EXIT_LOST_LEADERSHIP = 1


class Election(Protocol):
    """How a process elects its leader (both processes' options carry these)."""

    @property
    def leader_elect(self) -> bool: ...
    @property
    def lease_duration(self) -> int: ...
    @property
    def renew_deadline(self) -> float: ...
    @property
    def retry_period(self) -> float: ...


def default_identity() -> str:
    """The pod's name when the chart passes it (POD_NAME), else host name; unique per process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class _LeaseLock(LeaseLock):
    """The library's LeaseLock with two fixes for kubernetes 37.0.2:

    - `create`: the library passes `pretty=True` (a bool) where the generated API validates a string, so
      creating the Lease always failed and no candidate could ever lead on a cluster without the Lease;
    - `update_lease`: the library stamps acquireTime/renewTime with the *local* time and labels it UTC (wrong
      by the UTC offset when TZ is not UTC) and never counts leaseTransitions. The election itself does not
      read these times (it times leases on its own clock), but people and tools reading the Lease do, so we
      write them as client-go does: renewTime now, acquireTime and leaseTransitions + 1 when the holder
      changes.
    """

    def update_lease(
        self, leader_election_record: LeaderElectionRecord, current_spec: client.V1LeaseSpec | None = None
    ) -> client.V1LeaseSpec:
        now = system_clock()
        spec = current_spec or client.V1LeaseSpec(lease_transitions=0)
        holder = leader_election_record.holder_identity
        if current_spec is not None and spec.holder_identity != holder:
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        if current_spec is None or spec.holder_identity != holder or spec.acquire_time is None:
            spec.acquire_time = now
        spec.holder_identity = holder
        duration = leader_election_record.lease_duration
        assert duration is not None  # the library always fills it in
        spec.lease_duration_seconds = int(duration)
        spec.renew_time = now
        return spec

    # Each Lease request gives up after this many seconds. The library times its renew deadline only between
    # attempts: a request the API server never answers would keep a leader leading on a Lease that has expired
    # (another replica may lead meanwhile). An unanswered or failed request is one failed attempt, as in client-go.
    request_timeout: float = 5.0
    # When (event loop clock) the last successful create or update of the Lease was sent; None before.
    renewed_at: float | None = None

    async def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            async with asyncio.timeout(self.request_timeout):
                return await super().get(name, namespace)
        except NO_ANSWER as error:
            logger.warning("could not read the lease %s/%s: %r", namespace, name, error)
            return False, ApiException(status=0, reason=f"no answer: {error!r}")

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        sent = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(self.request_timeout):
                updated = await super().update(name, namespace, updated_record)
        except NO_ANSWER as error:
            logger.warning("could not renew the lease %s/%s: %r", namespace, name, error)
            return False
        if updated:
            self.renewed_at = sent
        return updated

    async def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=self.update_lease(election_record))
        sent = asyncio.get_running_loop().time()
        try:
            with api_call():
                async with asyncio.timeout(self.request_timeout):
                    await self.api_instance.create_namespaced_lease(namespace, body)
        except Failed as error:
            logger.info("could not create the lease %s/%s: %s %s", namespace, name, error.status, error.reason)
            return False
        except NoAnswer as error:
            logger.warning("could not create the lease %s/%s: %r", namespace, name, error)
            return False
        self.renewed_at = sent
        return True


@dataclass
class LeaderElector:
    api_client: client.ApiClient
    namespace: str
    name: str
    identity: str
    lease_duration: int = 15  # whole seconds: the library renders it with str() and parses it with int()
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    _lock: _LeaseLock | None = None

    def __post_init__(self) -> None:
        if not 0 < self.renew_deadline < self.lease_duration:
            raise ValueError("the renew deadline must be shorter than the lease: what was sent before it must land")

    def may_write(self) -> bool:
        """False once leadership is lost or the renew deadline of the last renewal sent has passed; True before
        leading (the campaign's own writes)."""
        if self.lost.is_set():
            return False
        renewed = self._lock.renewed_at if self.leading.is_set() and self._lock is not None else None
        return renewed is None or asyncio.get_running_loop().time() < renewed + self.renew_deadline

    async def run(self) -> None:
        """Campaign, then renew; returns when leadership is lost, the renew deadline passed without a renewal or the
        election fails (sets `lost`). Cancel to stop campaigning."""

        async def started() -> None:
            logger.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)
            self.leading.set()

        async def stopped() -> None:
            logger.error("%s lost the lease %s/%s", self.identity, self.namespace, self.name)
            self.lost.set()

        lock = self._lock = _LeaseLock(self.name, self.namespace, self.identity, self.api_client)
        lock.request_timeout = self.renew_deadline / 2  # two attempts fit in a renew deadline
        config = electionconfig.Config(
            lock,
            lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
            onstarted_leading=started,
            onstopped_leading=stopped,
        )
        election = asyncio.create_task(self._elect(config), name="lease-renewals")
        fence = asyncio.create_task(self._fence(lock), name="lease-fence")
        try:
            await asyncio.wait((election, fence), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (election, fence):
                task.cancel()
            await asyncio.gather(election, fence, return_exceptions=True)

    async def _elect(self, config: electionconfig.Config) -> None:
        try:
            await leaderelection.LeaderElection(config).run()
        except Exception:
            logger.exception("leader election failed")
            self.lost.set()

    async def _fence(self, lock: _LeaseLock) -> None:
        """Once leading: set `lost` when `renew_deadline` has passed since the last successful renewal was sent."""
        await self.leading.wait()
        loop = asyncio.get_running_loop()
        while True:
            assert lock.renewed_at is not None  # leading: the Lease was created or updated
            left = lock.renewed_at + self.renew_deadline - loop.time()
            if left <= 0:
                logger.error(
                    "%s did not renew the lease %s/%s within %g s: stopping before another replica may lead",
                    self.identity,
                    self.namespace,
                    self.name,
                    self.renew_deadline,
                )
                self.lost.set()
                return
            await asyncio.sleep(left)

    async def release(self, *, attempts: int = 3) -> bool:
        """Give the Lease up if we hold it: empty holder, 1s duration. True if released. A conflict (our own renewal
        cut short as the election stopped may still have landed after the read) is read again and retried."""
        api = client.CoordinationV1Api(self.api_client)
        for attempt in range(1, attempts + 1):
            try:
                lease = await call(api.read_namespaced_lease(self.name, self.namespace))
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return False
                now = system_clock()
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.acquire_time = now
                lease.spec.renew_time = now
                await call(api.replace_namespaced_lease(self.name, self.namespace, lease))
            except Failed as error:
                if isinstance(error, Conflict) and attempt < attempts:
                    continue
                logger.warning(
                    "could not release the lease %s/%s: %s %s", self.namespace, self.name, error.status, error.reason
                )
                return False
            logger.info("%s released the lease %s/%s", self.identity, self.namespace, self.name)
            return True
        return False


class LeadershipLost(Exception):
    """A write was not sent: leadership is lost, or may be."""


_READS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class WriteFence:
    """Put into every API client of a replica: once its `elector` says leadership may be gone, no write is sent
    (the request raises `LeadershipLost`). Without an elector (leader election off) every write is sent."""

    elector: LeaderElector | None = None

    def trace_config(self) -> aiohttp.TraceConfig:
        """Comes first in a client's trace configs: a refused write is no request for the others to count."""
        trace = aiohttp.TraceConfig()

        async def on_start(
            _session: aiohttp.ClientSession, _context: types.SimpleNamespace, params: aiohttp.TraceRequestStartParams
        ) -> None:
            if params.method not in _READS and self.elector is not None and not self.elector.may_write():
                raise LeadershipLost(f"{params.method} {params.url.path} not sent: leadership is lost")

        trace.on_request_start.append(on_start)
        return trace


async def run_elected(
    elector: LeaderElector,
    *,
    stop: asyncio.Event,
    lead: Callable[[asyncio.Event], Awaitable[int]],
    on_leading: Callable[[bool], None],
    lost_code: int,
    stopped_code: int,
) -> int:
    """Campaign; once leading, `lead(lost)` until it returns; release the Lease on the way out unless it was lost.
    `lost_code` when leadership is lost before leading, `stopped_code` when `stop` comes first."""
    election = asyncio.create_task(elector.run(), name="leader-election")
    try:
        waiters = [asyncio.ensure_future(event.wait()) for event in (stop, elector.leading, elector.lost)]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if stop.is_set():
            logger.info("stopping before leading")
            return stopped_code
        if elector.lost.is_set():
            return lost_code
        on_leading(True)
        return await lead(elector.lost)
    finally:
        on_leading(False)
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
        if not elector.lost.is_set():
            await elector.release()


async def lead_when_elected(
    election: Election,
    *,
    lease: tuple[client.ApiClient, str, str],
    identity: str,
    fence: WriteFence,
    stop: asyncio.Event,
    lead: Callable[[asyncio.Event], Awaitable[int]],
    on_leading: Callable[[bool], None],
) -> int:
    """`lead(lost)` once this process leads: at once without leader election, else once elected on the Lease
    (`lease`: the client, namespace and name). Every client fenced by `fence` stops writing once the Lease may be
    gone. Exits `EXIT_LOST_LEADERSHIP` when leadership is lost, else what `lead` returns (or `EXIT_OK` on a stop
    before leading)."""
    if not election.leader_elect:
        return await lead(asyncio.Event())
    api_client, namespace, name = lease
    elector = LeaderElector(
        api_client=api_client,
        namespace=namespace,
        name=name,
        identity=identity,
        lease_duration=election.lease_duration,
        renew_deadline=election.renew_deadline,
        retry_period=election.retry_period,
    )
    fence.elector = elector
    return await run_elected(
        elector, stop=stop, lead=lead, on_leading=on_leading, lost_code=EXIT_LOST_LEADERSHIP, stopped_code=EXIT_OK
    )
