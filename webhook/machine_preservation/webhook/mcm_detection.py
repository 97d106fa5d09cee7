"""`--mcm-native-preservation`: whether the cluster's MCM preserves machines itself.

`auto` reads what the control cluster shows (MCM's Deployment in the control namespace when one is named,
MCM's Machine and MachineSet CRDs) and leaves the decision to the core. Anything that cannot be read is
evidence not given, never an error: the webhook must come up to serve its other rules.

Decided once at start (`decide`), or, with `--mcm-native-preservation-per-namespace`, per namespace
(`NativeByNamespace`): a Gardener seed runs one MCM per shoot namespace, each upgraded on its own, and one webhook
serves them all. Then every namespace's decision is read from its own MCM Deployment (and the seed's CRDs) when a
request first needs it, kept for a TTL, and read again after that, so an MCM upgrade in one shoot is followed
within the TTL without a restart. As Gardener's extension, only the namespaces holding our Extension
(`ExtensionNamespaces`) are read and cached: any other name in a request (a `/shoots/<namespace>/` URL is whatever
its caller wrote) gets the process-wide decision, so made-up names can neither send reads to the seed nor push the
real shoots out of the cache.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Final, Protocol

from kubernetes.aio import client
from kubernetes.aio.config.config_exception import ConfigException

from machine_preservation.core.admission.deletion import EXTENSION_NAME
from machine_preservation.core.gardener import extension as gardener_extension
from machine_preservation.core.mcm_evidence import MACHINE_CRD, MACHINE_SET_CRD, MCM_DEPLOYMENT, cluster_evidence
from machine_preservation.core.mcm_generation import (
    ClusterEvidence,
    NativeDecision,
    NativePreservationMode,
    decide_native_preservation,
)
from machine_preservation.kube.api_errors import NO_ANSWER, Failed, NoAnswer, call, read_object
from machine_preservation.kube.clients import new_api_client
from machine_preservation.kube.crds import SharedRead, read_crd

logger = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 5.0


async def _read(read: Awaitable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """One object as JSON; None when it cannot be read (missing, forbidden, unreachable, not JSON)."""
    try:
        return await read
    except (Failed, NoAnswer, ValueError):
        return None


async def _read_deployment(api_client: client.ApiClient, namespace: str, seconds: float) -> Mapping[str, Any]:
    read = client.AppsV1Api(api_client).read_namespaced_deployment_without_preload_content
    return await read_object(read, MCM_DEPLOYMENT, namespace, seconds=seconds)


async def _read_crds(
    api_client: client.ApiClient, seconds: float
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """MCM's Machine and MachineSet CRDs (read at the same time), each None when it cannot be read."""
    machine, machine_set = await asyncio.gather(
        _read(read_crd(api_client, MACHINE_CRD, seconds=seconds)),
        _read(read_crd(api_client, MACHINE_SET_CRD, seconds=seconds)),
    )
    return machine, machine_set


async def read_evidence(
    api_client: client.ApiClient, *, namespace: str | None, seconds: float = READ_TIMEOUT_SECONDS
) -> ClusterEvidence:
    """What the control cluster shows about its MCM; `namespace`: where MCM's Deployment runs, if known.
    `seconds`: the timeout of each read (they run at the same time)."""

    async def read_deployment() -> Mapping[str, Any] | None:
        return await _read(_read_deployment(api_client, namespace, seconds)) if namespace else None

    deployment, (machine_crd, machine_set_crd) = await asyncio.gather(
        read_deployment(), _read_crds(api_client, seconds)
    )
    return cluster_evidence(deployment=deployment, machine_crd=machine_crd, machine_set_crd=machine_set_crd)


async def decide(*, mode: NativePreservationMode, kubeconfig: Path | None, namespace: str | None) -> NativeDecision:
    """The decision for `mode`, reading the cluster only for `auto`; logged once."""
    evidence = ClusterEvidence()
    if mode == NativePreservationMode.AUTO:
        try:
            api_client = await new_api_client(kubeconfig=kubeconfig)
        except (ConfigException, OSError, ValueError) as error:
            logger.warning("cannot read the control cluster to detect MCM's generation: %s", error)
        else:
            async with api_client:
                evidence = await read_evidence(api_client, namespace=namespace)
    decision = decide_native_preservation(mode=mode, evidence=evidence)
    logger.info(
        "MCM native preservation: %s (%s)%s",
        "on" if decision.native else "off",
        decision.because,
        "; the deletion guard covers only preservations our controller still holds" if decision.native else "",
    )
    return decision


# --- per namespace ----------------------------------------------------------------------------------------------

NAMESPACE_TTL_SECONDS: Final = 60.0
# A seed holds a few hundred shoot namespaces; beyond this many the least recently used decision is dropped.
NAMESPACE_CACHE_SIZE: Final = 2048
# How long a request waits for its namespace's evidence at most: the node webhooks' timeoutSeconds is <= 5, and a
# kube-apiserver in the seed answers three GETs in milliseconds.
NAMESPACE_READ_TIMEOUT_SECONDS: Final = 2.0
# Namespaces read at once: a few milliseconds each, so 200 first requests at once are all answered well within
# the read timeout, without 600 GETs in flight.
NAMESPACE_READS_AT_ONCE: Final = 10
# After a read that gave less than the one before (the Deployment could not be read this time), read again this soon.
RETRY_SECONDS: Final = 5.0


class _Strength(IntEnum):
    """How much a read showed: a weaker read never overrides a stronger decision of the same namespace."""

    NOTHING = 0
    CRDS = 1
    IMAGE = 2


def _strength(evidence: ClusterEvidence) -> _Strength:
    if evidence.mcm_image is not None:
        return _Strength.IMAGE
    if evidence.machine_crd_has_expiry is not None or evidence.machine_set_crd_has_auto_max is not None:
        return _Strength.CRDS
    return _Strength.NOTHING


class NativeSource(Protocol):
    """Whether the MCM of a namespace preserves machines itself; never raises."""

    async def native(self, namespace: str) -> bool: ...

    async def close(self) -> None: ...


ReadEvidence = Callable[[client.ApiClient, str, float], Awaitable[ClusterEvidence]]
Connect = Callable[[], Awaitable[client.ApiClient]]
ListNamespaces = Callable[[client.ApiClient, float], Awaitable[frozenset[str]]]

# How often the namespaces with our Extension are listed; a namespace not among them is looked for again at most
# this often (a new shoot waits that long for its own decision; made-up names cost one list per interval at most).
EXTENSION_LIST_PERIOD_SECONDS: Final = 60.0
EXTENSION_RELIST_MIN_SECONDS: Final = 5.0


async def _list_extension_namespaces(api_client: client.ApiClient, seconds: float) -> frozenset[str]:
    """The namespaces holding an Extension named as ours (seed-wide, one small list by name)."""
    listing = await client.CustomObjectsApi(api_client).list_cluster_custom_object(
        gardener_extension.API_GROUP,
        gardener_extension.API_VERSION.split("/")[1],
        gardener_extension.PLURAL,
        field_selector=f"metadata.name={EXTENSION_NAME}",
        _request_timeout=seconds,
    )
    items = listing.get("items") if isinstance(listing, dict) else None
    return frozenset(
        str(item["metadata"]["namespace"])
        for item in items or []
        if isinstance(item, dict) and isinstance(item.get("metadata"), dict) and item["metadata"].get("namespace")
    )


class ExtensionNamespaces:
    """The shoot namespaces with our Extension, listed every `period` and, for a namespace not among them, again
    once `min_interval` has passed since the last list. A list that fails keeps what the last one showed (nothing
    before the first: then no namespace is known)."""

    def __init__(
        self,
        *,
        connect: Connect,
        period: float = EXTENSION_LIST_PERIOD_SECONDS,
        min_interval: float = EXTENSION_RELIST_MIN_SECONDS,
        timeout: float = NAMESPACE_READ_TIMEOUT_SECONDS,
        list_namespaces: ListNamespaces = _list_extension_namespaces,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._period, self._min_interval, self._timeout = period, min_interval, timeout
        self._list = list_namespaces
        self._monotonic = monotonic
        self._names: frozenset[str] = frozenset()
        self._listed_at: float | None = None
        self._listing: asyncio.Task[None] | None = None
        self._api_client: client.ApiClient | None = None
        self.lists = 0  # lists started, for tests and the curious

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | None, **options: Any) -> ExtensionNamespaces:
        return cls(connect=lambda: new_api_client(kubeconfig=kubeconfig), **options)

    async def contains(self, namespace: str) -> bool:
        now = self._monotonic()
        age = None if self._listed_at is None else now - self._listed_at
        if age is None or age >= self._period or (namespace not in self._names and age >= self._min_interval):
            if self._listing is None:
                self._listing = asyncio.create_task(self._refresh())
            # Shielded: a request that gives up does not cancel the list the others wait for.
            await asyncio.shield(self._listing)
        return namespace in self._names

    async def _refresh(self) -> None:
        try:
            self.lists += 1
            async with asyncio.timeout(self._timeout):
                if self._api_client is None:
                    self._api_client = await self._connect()
                self._names = await call(self._list(self._api_client, self._timeout))
        except TimeoutError:
            logger.warning("the shoot namespaces with our Extension: no answer within %g s", self._timeout)
        except Failed as error:
            logger.warning(
                "the shoot namespaces with our Extension cannot be listed: %s %s", error.status, error.reason
            )
        except (ConfigException, ValueError, *NO_ANSWER) as error:
            logger.warning("the shoot namespaces with our Extension cannot be listed: %s", error)
        finally:
            # Also after a failure: the next try waits as long as a namespace not found would.
            self._listed_at, self._listing = self._monotonic(), None

    async def close(self) -> None:
        if self._listing is not None:
            self._listing.cancel()
        if self._api_client is not None:
            await self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None


@dataclass
class _Entry:
    decision: NativeDecision | None = None
    strength: _Strength = _Strength.NOTHING
    expires: float = 0.0  # monotonic seconds
    pending: asyncio.Task[None] | None = None


class NativeByNamespace:
    """`auto` per namespace, cached: the decision for a namespace is read when a request first needs it and again
    once `ttl` has passed (less up to a quarter, at random, so that decisions made together do not expire
    together). MCM's CRDs are read once per `ttl` for all namespaces; at most `max_reads` namespaces are read at
    once (a burst of first requests from 200 shoots would otherwise send 600 GETs at once and hold 200 reviews).

    - Concurrent requests for the same namespace share one read; a request waits for it at most `timeout`
      (the read itself is bounded by that), then goes on with what is known.
    - A read that fails is evidence not given, never an error. When it shows less than the read before (e.g. the
      Deployment could not be read, but was last time), the last decision stays and is read again after
      `RETRY_SECONDS`; with nothing known at all, the core decides from what there is (not native without any
      evidence).
    - At most `max_entries` namespaces are kept, the least recently asked for dropped first.
    - With `only`, a namespace it does not contain is neither read nor cached: it gets `default` (the process-wide
      decision).
    """

    def __init__(
        self,
        *,
        connect: Connect,
        ttl: float = NAMESPACE_TTL_SECONDS,
        max_entries: int = NAMESPACE_CACHE_SIZE,
        timeout: float = NAMESPACE_READ_TIMEOUT_SECONDS,
        read: ReadEvidence | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        max_reads: int = NAMESPACE_READS_AT_ONCE,
        only: ExtensionNamespaces | None = None,
        default: bool = False,
    ) -> None:
        self._connect = connect
        self._only, self._default = only, default
        # MCM's CRDs are the seed's, the same for every namespace: read once per `ttl` for all (200 namespaces would
        # otherwise read both every minute each), and a CRD that could not be read again soon, not after a whole ttl.
        self._crds = SharedRead(
            self._read_seed_crds,
            max_age=ttl,
            clock=monotonic,
            fresh_for=lambda crds: ttl if None not in crds else min(ttl, RETRY_SECONDS),
        )
        self._read = read or self._read_namespace
        self._reading = asyncio.Semaphore(max_reads)
        self._ttl, self._max_entries, self._timeout = ttl, max_entries, timeout
        self._monotonic = monotonic
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._api_client: client.ApiClient | None = None
        self._connecting = asyncio.Lock()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | None, **options: Any) -> NativeByNamespace:
        return cls(connect=lambda: new_api_client(kubeconfig=kubeconfig), **options)

    async def native(self, namespace: str) -> bool:
        if self._only is not None and not await self._only.contains(namespace):
            return self._default
        entry = self._entries.get(namespace)
        if entry is None:
            entry = self._entries[namespace] = _Entry()
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(namespace)
        if entry.decision is None or self._monotonic() >= entry.expires:
            if entry.pending is None:
                entry.pending = asyncio.create_task(self._refresh(namespace, entry))
            # Shielded: a request that gives up (its client went away) does not cancel the read the others wait for.
            await asyncio.shield(entry.pending)
        return entry.decision.native if entry.decision is not None else False

    async def _client(self) -> client.ApiClient:
        async with self._connecting:
            if self._api_client is None:
                self._api_client = await self._connect()
            return self._api_client

    async def _read_seed_crds(self) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
        return await _read_crds(await self._client(), self._timeout)

    async def _read_namespace(self, api_client: client.ApiClient, namespace: str, seconds: float) -> ClusterEvidence:
        deployment, (machine_crd, machine_set_crd) = await asyncio.gather(
            _read(_read_deployment(api_client, namespace, seconds)), self._crds.get()
        )
        return cluster_evidence(deployment=deployment, machine_crd=machine_crd, machine_set_crd=machine_set_crd)

    async def _evidence(self, namespace: str) -> ClusterEvidence:
        try:
            async with asyncio.timeout(self._timeout), self._reading:  # waiting for a turn counts
                return await self._read(await self._client(), namespace, self._timeout)
        except TimeoutError:
            logger.warning("MCM's generation in %s: no answer within %g s", namespace, self._timeout)
        except (ConfigException, ValueError, *NO_ANSWER) as error:
            logger.warning("MCM's generation in %s: cannot read the cluster: %s", namespace, error)
        except Exception:
            # Evidence not given, whatever the reason: the decision must never fail a request.
            logger.exception("MCM's generation in %s: reading failed", namespace)
        return ClusterEvidence()

    async def _refresh(self, namespace: str, entry: _Entry) -> None:
        try:
            evidence = await self._evidence(namespace)
            strength = _strength(evidence)
            now = self._monotonic()
            if entry.decision is not None and strength < entry.strength:
                entry.expires = now + min(self._ttl, RETRY_SECONDS)
                return
            decision = decide_native_preservation(mode=NativePreservationMode.AUTO, evidence=evidence)
            if entry.decision is None or entry.decision.native != decision.native:
                logger.info(
                    "MCM native preservation in %s: %s (%s)",
                    namespace,
                    "on" if decision.native else "off",
                    decision.because,
                )
            entry.decision, entry.strength = decision, strength
            ttl = self._ttl * random.uniform(0.75, 1.0)
            entry.expires = now + (ttl if strength > _Strength.NOTHING else min(ttl, RETRY_SECONDS))
        finally:
            entry.pending = None

    async def close(self) -> None:
        if self._only is not None:
            await self._only.close()
        for entry in self._entries.values():
            if entry.pending is not None:
                entry.pending.cancel()
        self._entries.clear()
        if self._api_client is not None:
            await self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
