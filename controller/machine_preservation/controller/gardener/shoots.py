"""The preservation lifecycles of every enabled shoot of the seed, in one process: one `ShootRuntime` per shoot.

Each shoot runs in a task of its own with its own caches, queues and workers, so a shoot whose API server is
down, slow or rejects our token only stalls itself: its task retries with a backoff of its own, and its problem
is kept for the shoot's Extension status. While a runtime runs, MCM is inspected again every `recheck_period`; when
the verdict on native preservation changes (MCM upgraded in that shoot), the shoot's runtime is restarted on the
new verdict, and no other shoot notices. And the shoot's API server is asked for its version (`ApiServerProbe`):
watches stay open on a server that answers slowly and a served shoot sends nothing else while no machine fails, so
only a request tells that every write of the next preservation would wait (reported on the Extension).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.aio import client

from machine_preservation.controller.gardener.shoot_access import ShootAccessUnavailable, new_shoot_client
from machine_preservation.controller.machinery.leader import WriteFence
from machine_preservation.controller.machinery.loop import Outcome, wait_any
from machine_preservation.controller.machinery.metrics import Metrics
from machine_preservation.controller.machinery.slots import ReconcileSlots
from machine_preservation.controller.preservation.crd_check import ControlFactsCache
from machine_preservation.controller.preservation.runtime import RuntimeOptions, ShootRuntime, inspect_mcm
from machine_preservation.controller.preservation.views import SeedInformers
from machine_preservation.kube.api_errors import RETRYABLE
from machine_preservation.kube.backoff import Backoff

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShootState:
    """How a shoot's lifecycle is doing, for its Extension's status."""

    running: bool = False  # a runtime is up and its caches synced
    native: bool | None = None  # MCM preserves natively (None: not inspected yet)
    problem: str = ""  # why it is not running, for people
    slow: str = ""  # how the shoot's API server answered too late while running, for people
    nodes_over_budget: bool = False  # not served because its Nodes are over their budget (`problem` says so)


@dataclass(frozen=True)
class ApiServerProbe:
    """A served shoot's API server is asked for its version every `period`; an answer later than `slow_answer`,
    or none within `timeout`, reports the shoot as slow until an answer comes in time. 200 shoots: 20 small reads
    a second, spread over 200 API servers. Asked more often than the client keeps an idle connection (15 s), each
    probe finds the last one's connection open: 0.4 ms of this process's CPU instead of 2.4 ms with a new TLS
    connection (0.8 % of a core for 200 shoots)."""

    period: float = 10.0
    slow_answer: float = 2.0
    timeout: float = 10.0

    async def verdict(self, target: client.ApiClient) -> str | None:
        """How the API server answered too late, for people; "" in time; None without an answer (an error)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.timeout):
                await client.VersionApi(target).get_code()
        except TimeoutError:
            return f"no answer to GET /version within {self.timeout:g} s"
        except RETRYABLE as error:  # refused, down or unreachable: the watches tell that
            logger.debug("version probe failed: %s", error)
            return None
        took = loop.time() - started
        return f"GET /version took {took:.1f} s" if took > self.slow_answer else ""


@dataclass
class _Shoot:
    namespace: str
    kubeconfig_secret: str
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    runtime: ShootRuntime | None = None
    native: bool | None = None
    problem: str = "starting"
    slow: str = ""  # the last verdict of ShootSupervisor.probe
    announced: ShootState | None = None  # the state last told (`notify`)


@dataclass
class ShootSupervisor:
    seed: client.ApiClient
    runtime_options: RuntimeOptions  # every shoot's
    access_secret: str
    metrics: Metrics
    informers: SeedInformers  # MCM's objects and the Clusters of every shoot, watched once for the seed
    recheck_period: float = 60.0
    probe: ApiServerProbe = field(default_factory=ApiServerProbe)
    # Told the namespace whenever a shoot's state changes (synced, failed), to report it on the Extension.
    notify: Callable[[str], None] = lambda namespace: None
    # Retries of a shoot that cannot be started: 1 s doubling to 5 min.
    backoff: Backoff = field(default_factory=lambda: Backoff(base=1.0, cap=300.0))
    # Reconciles at once over all shoots (fair: first come, first served; drains not counted).
    slots: ReconcileSlots = field(default_factory=ReconcileSlots)
    # Leadership is gone: every runtime stops at once, in-flight reconciles cancelled (another leader may write).
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    # The process's: the shoots' clients send no write once leadership may be gone.
    fence: WriteFence = field(default_factory=WriteFence)
    _shoots: dict[str, _Shoot] = field(default_factory=dict)
    # The seed's CRDs, read once per recheck period for every shoot.
    control_facts: ControlFactsCache = field(init=False)

    def __post_init__(self) -> None:
        self.control_facts = ControlFactsCache(self.seed, max_age=self.recheck_period)
        for informer in self.informers.all:  # every shoot's state reads the seed-wide caches too
            informer.add_state_listener(self._announce_all)

    def namespaces(self) -> list[str]:
        return sorted(self._shoots)

    def state(self, namespace: str) -> ShootState:
        shoot = self._shoots.get(namespace)
        if shoot is None:
            return ShootState(problem="not running")
        runtime = shoot.runtime
        if runtime is None:
            return ShootState(native=shoot.native, problem=shoot.problem)
        failing = runtime.failing()
        over = runtime.nodes_over_budget()
        if not runtime.synced():
            # Over the Node budget, the Nodes never sync: say so rather than that they are on their way.
            problem = failing if failing and over else shoot.problem
            return ShootState(native=shoot.native, problem=problem, nodes_over_budget=over)
        if failing:
            return ShootState(native=shoot.native, problem=failing, nodes_over_budget=over)
        return ShootState(running=True, native=shoot.native, slow=shoot.slow)

    def ensure_running(self, namespace: str, *, kubeconfig_secret: str) -> None:
        """Start the shoot's lifecycle unless it runs; a changed kubeconfig Secret restarts it."""
        if self.lost.is_set():
            return
        shoot = self._shoots.get(namespace)
        if shoot is not None and shoot.kubeconfig_secret == kubeconfig_secret and shoot.task and not shoot.task.done():
            return
        if shoot is not None:
            shoot.halt.set()  # the old task ends on its own; the new one starts afresh
        shoot = self._shoots[namespace] = _Shoot(namespace=namespace, kubeconfig_secret=kubeconfig_secret)
        shoot.task = asyncio.create_task(self._run(shoot), name=f"shoot-{namespace}")

    async def stop(self, namespace: str) -> None:
        """Stop the shoot's lifecycle (in-flight reconciles finish, bounded) and forget it."""
        shoot = self._shoots.pop(namespace, None)
        if shoot is None:
            return
        for gauge in (
            self.metrics.shoot_api_server_slow,
            self.metrics.shoot_nodes_over_budget,
            self.metrics.shoot_node_protection_missing,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace)
        shoot.halt.set()
        if shoot.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await shoot.task

    async def release(self, namespace: str, *, kubeconfig_secret: str, limit: float = 60.0) -> str | None:
        """End every preservation of the shoot (the extension is being disabled): stop its lifecycle, run it once
        more releasing, until nothing is preserved; then stop. The problem, for people, if that did not finish
        within `limit` seconds (the caller retries)."""
        await self.stop(namespace)
        try:
            target = await self._shoot_client(namespace, kubeconfig_secret)
        except ShootAccessUnavailable as error:
            return f"cannot reach the shoot to end its preservations: {error}"
        runtime = self._runtime(namespace, target, releasing=True)
        stop = asyncio.Event()
        task: asyncio.Task[Outcome] | None = None
        try:
            await runtime.prepare(await self.control_facts.get())
            task = asyncio.create_task(runtime.run(stop=stop, lost=self.lost), name=f"release-{namespace}")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + limit
            while loop.time() < deadline and not task.done():
                if runtime.synced() and runtime.preservations_left() == 0:
                    return None
                await asyncio.sleep(0.2)
            if not runtime.synced():
                return "cannot reach the shoot to end its preservations (its caches did not sync)"
            return f"{runtime.preservations_left()} preservations still ending after {limit:g} s"
        finally:
            stop.set()
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
            await target.close()  # type: ignore[no-untyped-call]

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(namespace) for namespace in list(self._shoots)))

    async def _run(self, shoot: _Shoot) -> None:
        failures = 0
        while not shoot.halt.is_set():
            restart = asyncio.Event()
            try:
                outcome = await self._run_once(shoot, restart)
            except ShootAccessUnavailable as error:
                shoot.problem = str(error)
                outcome = None
            except Exception as error:  # any other failure: reported, retried; the other shoots go on
                logger.exception("%s: the preservation lifecycle failed", shoot.namespace)
                shoot.problem = f"the preservation lifecycle failed: {error}"
                outcome = None
            finally:
                shoot.runtime = None
            if shoot.halt.is_set() or self.lost.is_set():
                return
            self._announce(shoot)
            if outcome is Outcome.STOPPED and restart.is_set():
                failures = 0
                continue  # MCM's generation changed: start again at once on the new verdict
            failures = 0 if outcome is Outcome.INFORMER_FAILED else failures + 1
            delay = max(self.backoff.delay(failures), self.backoff.base)
            logger.info("%s: %s; next attempt in %.0f s", shoot.namespace, shoot.problem, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await shoot.halt.wait()

    async def _run_once(self, shoot: _Shoot, restart: asyncio.Event) -> Outcome:
        target = await self._shoot_client(shoot.namespace, shoot.kubeconfig_secret)
        try:
            runtime = self._runtime(shoot.namespace, target)
            await runtime.prepare(await self.control_facts.get())
            shoot.runtime, shoot.native = runtime, runtime.native
            shoot.problem = "waiting for the caches to sync (is the shoot's API server reachable?)"
            shoot.slow = ""
            self._announce(shoot)
            stop = asyncio.Event()
            tasks = (
                asyncio.create_task(self._recheck(shoot, runtime.native, restart)),
                asyncio.create_task(_set_when_any(stop, shoot.halt, restart)),
                asyncio.create_task(self._probe(shoot, target)),
            )
            try:
                outcome = await runtime.run(stop=stop, lost=self.lost)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            if outcome is Outcome.INFORMER_FAILED:
                shoot.problem = "a cache stopped following the shoot; restarting"
            return outcome
        finally:
            await target.close()  # type: ignore[no-untyped-call]

    async def _shoot_client(self, namespace: str, kubeconfig_secret: str) -> client.ApiClient:
        return await new_shoot_client(
            self.seed,
            namespace=namespace,
            kubeconfig_secret=kubeconfig_secret,
            access_secret=self.access_secret,
            # Each request of a reconcile to the shoot gives its slot back while it waits for the answer.
            trace_configs=[
                self.fence.trace_config(),
                self.metrics.trace_config(cluster="shoot"),
                self.slots.trace_config(),
            ],
            identity=self.runtime_options.identity,
        )

    def _runtime(self, namespace: str, target: client.ApiClient, *, releasing: bool = False) -> ShootRuntime:
        shoot = self._shoots.get(namespace)
        return ShootRuntime(
            on_state=(lambda: self._announce(shoot)) if shoot is not None and not releasing else None,
            namespace=namespace,
            options=self.runtime_options,
            control=self.seed,
            target=target,
            metrics=self.metrics,
            slots=self.slots,
            views=self.informers.views(namespace),
            releasing=releasing,
        )

    def _announce_all(self) -> None:
        for shoot in list(self._shoots.values()):
            self._announce(shoot)

    def _announce(self, shoot: _Shoot) -> None:
        """Tell when the shoot's state changes (synced; its API server lost or back; its Nodes over their budget),
        for its Extension. Called on every change of what the state is made of: the runtime's caches and the
        seed-wide ones (their state listeners), the runtime starting or ending, the probe's verdict."""
        if self._shoots.get(shoot.namespace) is not shoot:
            return  # stopped: its gauges are gone and its Extension is told otherwise
        runtime = shoot.runtime
        over = runtime is not None and runtime.nodes_over_budget()
        self.metrics.shoot_nodes_over_budget.labels(shoot.namespace).set(1 if over else 0)
        current = self.state(shoot.namespace)
        if current != shoot.announced:
            shoot.announced = current
            self.notify(shoot.namespace)

    async def _probe(self, shoot: _Shoot, target: client.ApiClient) -> None:
        """Ask the shoot's API server every probe period and keep the verdict in `shoot.slow`. The first probe comes
        at a random point of the first period: shoots started together (all of them, after a restart) would
        otherwise probe together, every period."""
        await asyncio.sleep(random.uniform(0, self.probe.period))
        while True:
            verdict = await self.probe.verdict(target)
            if verdict is not None:  # None: down, or refusing us (the caches' watches tell that)
                if verdict and not shoot.slow:
                    logger.warning("%s: the shoot's API server answers slowly (%s)", shoot.namespace, verdict)
                elif shoot.slow and not verdict:
                    logger.info("%s: the shoot's API server answers in time again", shoot.namespace)
                changed, shoot.slow = verdict != shoot.slow, verdict
                self.metrics.shoot_api_server_slow.labels(shoot.namespace).set(1 if verdict else 0)
                if changed:  # the state (its `slow`) is news only then: no state computed per probe
                    self._announce(shoot)
            await asyncio.sleep(self.probe.period)

    async def _recheck(self, shoot: _Shoot, native: bool, restart: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.recheck_period)
            try:
                decision = await inspect_mcm(
                    self.seed,
                    namespace=shoot.namespace,
                    mode=self.runtime_options.native_preservation,
                    crds=(await self.control_facts.get()).crds,
                )
            except Exception as error:  # a failed look is not a verdict: try again next period
                logger.warning("%s: cannot inspect MCM (%s)", shoot.namespace, error)
                continue
            if decision.native != native:
                logger.info(
                    "%s: MCM native preservation is now %s (%s): restarting the shoot's lifecycle",
                    shoot.namespace,
                    "on" if decision.native else "off",
                    decision.because,
                )
                restart.set()
                return


async def _set_when_any(target: asyncio.Event, *events: asyncio.Event) -> None:
    await wait_any(*events)
    target.set()
