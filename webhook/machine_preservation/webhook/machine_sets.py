"""What the deletion guard reads: a Machine's MachineSet with the namespace's machines, MachineSets and
MachineDeployments (budget and replica counts), the Shoot's Gardener `Cluster` resource, and (only when serving
as Gardener's extension) the namespace's `Extension` of type machine-preservation: whether the extension is still
enabled for the Shoot in this seed.

All of it from watch-based caches (`kube.informer`), never a request per review: MCM deletes machines in bursts
(a rolling update, a scale-down), and three LISTs of a namespace per delete cost the API server more the larger
the namespace. As Gardener's extension the caches are seed-wide (one list and watch per resource for every shoot
namespace); standalone they cover the namespaces the installation guards, and any other a request names from its
first request on. They keep only what the guard reads. Until a cache has synced the guard cannot decide and says
so, as when the API server does not answer: MCM's delete is refused and retried (fail closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast

from kubernetes.aio import client
from kubernetes.aio.config.config_exception import ConfigException
from pydantic import ValidationError

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import EXTENSION_NAME, MachineSetView, ShootExtension
from machine_preservation.core.gardener import extension as gardener_extension
from machine_preservation.core.gardener.cluster import (
    CLUSTER_API_GROUP,
    CLUSTER_API_VERSION,
    CLUSTER_PLURAL,
    cluster_as_read,
)
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.kube.api_errors import NO_ANSWER, RETRYABLE, NotFound, api_call, ensure_ok
from machine_preservation.kube.backoff import Backoff
from machine_preservation.kube.clients import new_api_client
from machine_preservation.kube.informer import Informer, Source, supervise

logger = logging.getLogger(__name__)

# The Machine webhook's timeoutSeconds is 10: a review waits this long at most for caches that have not synced.
SYNC_WAIT_SECONDS = 3.0
PROBE_TIMEOUT_SECONDS = 10.0
_NAMESPACE_INDEX = "namespace"
# Standalone, the namespaces beyond those given that a review may start caches for: each costs four watches, and
# whoever reaches the webhook's port names the namespace.
MAX_NAMESPACES_FROM_REVIEWS = 8

M = TypeVar("M", bound=Machine | MachineSet | MachineDeployment)
T = TypeVar("T")


class SourceUnavailable(Exception):
    """The objects could not be read; the message says why."""


class MachineSetSource(Protocol):
    async def start(self) -> None:
        """Begin watching what the guard reads, ahead of the first review."""
        ...

    def synced(self) -> bool:
        """Whether what is watched from the start has been read, so that the guard can decide."""
        ...

    async def read(self, *, namespace: str, name: str) -> MachineSetView | None:
        """The MachineSet `name` with the namespace's machines, MachineSets and MachineDeployments; None when it
        does not exist."""
        ...

    async def read_cluster(self, *, namespace: str) -> dict[str, Any] | None:
        """Gardener's `Cluster` named after the control namespace, as far as the guard reads it; None when there
        is none (not Gardener)."""
        ...

    async def read_extension(self, *, namespace: str) -> ShootExtension | None:
        """The namespace's Extension of type machine-preservation (absent: `present` False); None when not
        serving as Gardener's extension, or the API server has no Extension kind (not Gardener)."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Unreadable:
    """An object that does not fit its model, kept in its place: the guard cannot count without it."""

    namespace: str
    problem: str


def parsed(model: type[M], raw: Mapping[str, Any]) -> M | Unreadable:
    try:
        return cast(M, model.model_validate(raw))
    except ValidationError as error:
        namespace = (raw.get("metadata") or {}).get("namespace") or ""
        return Unreadable(namespace, f"unexpected object from the API server: {error.errors()[0]['msg']}")


def _readable(objects: Iterable[T | Unreadable]) -> list[T]:
    readable: list[T] = []
    for item in objects:
        if isinstance(item, Unreadable):
            raise SourceUnavailable(item.problem)
        readable.append(item)
    return readable


def view_of(
    *,
    name: str,
    machine_sets: Iterable[MachineSet | Unreadable],
    machines: Iterable[Machine | Unreadable],
    machine_deployments: Iterable[MachineDeployment | Unreadable] = (),
) -> MachineSetView | None:
    """The view of a namespace's objects; None when the named MachineSet is not among them."""
    sets, members, deployments = _readable(machine_sets), _readable(machines), _readable(machine_deployments)
    own = next((s for s in sets if s.metadata.name == name), None)
    if own is None:
        return None
    return MachineSetView(machine_set=own, machines=members, siblings=sets, machine_deployments=deployments)


def _namespace_of(obj: Machine | MachineSet | MachineDeployment | Unreadable) -> tuple[str]:
    return (obj.namespace if isinstance(obj, Unreadable) else obj.metadata.namespace,)


@dataclass
class _GardenerKind(Generic[T]):
    """An informer of one of Gardener's kinds, which an API server outside Gardener does not serve: a LIST of one
    finds out; while the kind is not served there is nothing to read, and the LIST is sent again with backoff
    (up to every 30 s), in case the CRD is installed later."""

    informer: Informer[T]
    served: bool | None = None  # None: not known yet

    async def run(self, backoff: Backoff) -> None:
        source, failures = self.informer.source, 0
        while not self.served:
            try:
                with api_call():
                    response = await source.raw_list_function()(
                        *source.args, **source.kwargs, limit=1, _request_timeout=PROBE_TIMEOUT_SECONDS
                    )
                    try:
                        await ensure_ok(response)
                    finally:
                        response.release()
                self.served = True
            except RETRYABLE as error:
                if isinstance(error, NotFound):
                    self.served = False
                failures += 1
                await asyncio.sleep(backoff.delay(failures))
        await supervise(self.informer, backoff)

    @property
    def synced(self) -> bool:
        return self.served is False or (self.served is True and self.informer.synced)

    def get(self, key: str) -> T | None:
        return self.informer.get(key) if self.served else None


@dataclass
class _Caches:
    """The informers of one scope: the whole seed, or one namespace."""

    machines: Informer[Machine | Unreadable]
    machine_sets: Informer[MachineSet | Unreadable]
    machine_deployments: Informer[MachineDeployment | Unreadable]
    clusters: _GardenerKind[dict[str, Any]]
    extensions: _GardenerKind[ShootExtension | Unreadable] | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        return (self.machines, self.machine_sets, self.machine_deployments)

    def synced(self) -> bool:
        extensions_synced = self.extensions is None or self.extensions.synced
        return all(i.synced for i in self.informers) and self.clusters.synced and extensions_synced

    def start(self, backoff: Backoff) -> None:
        self.tasks = [asyncio.create_task(supervise(i, backoff), name=f"webhook-{i.name}") for i in self.informers]
        for kind in (self.clusters, self.extensions):
            if kind is not None:
                self.tasks.append(asyncio.create_task(kind.run(backoff), name=f"webhook-{kind.informer.name}"))

    async def wait_synced(self, scope: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SYNC_WAIT_SECONDS
        while not self.synced():
            if loop.time() >= deadline:
                raise SourceUnavailable(f"the caches of {scope} have not synced yet")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _parse_extension(raw: Mapping[str, Any]) -> ShootExtension | Unreadable:
    try:
        return ShootExtension.read(raw)
    except ValidationError as error:
        namespace = (raw.get("metadata") or {}).get("namespace") or ""
        return Unreadable(namespace, f"unexpected object from the API server: {error.errors()[0]['msg']}")


class KubernetesMachineSets:
    """MachineSetSource backed by informers on the API server (kubeconfig file, in-cluster config, or the
    default).

    `gardener_extension`: serving as Gardener's extension (one installation per seed): the caches are
    seed-wide, and a shoot namespace without our Extension has the extension disabled. Off, the caches are per
    namespace (`namespaces` from the start, any other from its first review) and `read_extension` reads nothing
    and answers None: a seed may well have Gardener's Extension kind without this installation being the
    extension (a standalone installation per shoot namespace), and there the guard must stay as it is."""

    def __init__(
        self,
        *,
        kubeconfig: Path | None = None,
        gardener_extension: bool = False,
        namespaces: Sequence[str] = (),
        backoff: Backoff | None = None,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._gardener_extension = gardener_extension
        self._namespaces = tuple(namespaces)
        self._backoff = backoff or Backoff(base=0.5, cap=30.0)
        self._api_client: client.ApiClient | None = None
        # By namespace; the seed-wide caches under None.
        self._caches: dict[str | None, _Caches] = {}
        self._lock = asyncio.Lock()

    def _scopes(self) -> tuple[str | None, ...]:
        """What is watched from the start: the seed, or the namespaces given."""
        return (None,) if self._gardener_extension else self._namespaces

    async def start(self) -> None:
        for scope in self._scopes():
            try:
                await self._caches_of(scope)
            except SourceUnavailable as error:  # tried again by the first review; not ready until then
                logger.warning("the deletion guard cannot watch yet: %s", error)

    def synced(self) -> bool:
        return all(scope in self._caches and self._caches[scope].synced() for scope in self._scopes())

    async def _caches_of(self, namespace: str | None) -> _Caches:
        async with self._lock:
            caches = self._caches.get(namespace)
            if caches is None:
                if namespace not in self._scopes() and len(self._caches) >= (
                    len(self._scopes()) + MAX_NAMESPACES_FROM_REVIEWS
                ):
                    raise SourceUnavailable(
                        f"namespace {namespace!r} is not watched: already {MAX_NAMESPACES_FROM_REVIEWS} namespaces"
                        " besides the configured ones (--control-namespace)"
                    )
                try:
                    if self._api_client is None:
                        self._api_client = await new_api_client(kubeconfig=self._kubeconfig)
                except (ConfigException, *NO_ANSWER) as error:
                    raise SourceUnavailable(f"no API client: {error}") from None
                caches = self._caches[namespace] = self._new_caches(
                    client.CustomObjectsApi(self._api_client), namespace
                )
                caches.start(self._backoff)
            return caches

    def _new_caches(self, api: client.CustomObjectsApi, namespace: str | None) -> _Caches:
        def machine_source(plural: str) -> Source:
            if namespace is None:
                return Source(api.list_cluster_custom_object, (v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, plural))
            return Source(
                api.list_namespaced_custom_object, (v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, namespace, plural)
            )

        def informer(plural: str, model: type[M]) -> Informer[M | Unreadable]:
            cache: Informer[M | Unreadable] = Informer(
                name=plural if namespace is None else f"{namespace}/{plural}",
                source=machine_source(plural),
                parse=lambda raw: parsed(model, raw),
            )
            cache.add_indexer(_NAMESPACE_INDEX, _namespace_of)
            return cache

        # Standalone, the one Cluster named after the namespace (RBAC grants it by name).
        by_name = {} if namespace is None else {"field_selector": f"metadata.name={namespace}"}
        clusters: Informer[dict[str, Any]] = Informer(
            name="clusters" if namespace is None else f"{namespace}/cluster",
            source=Source(
                api.list_cluster_custom_object, (CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL), by_name
            ),
            parse=cluster_as_read,
        )
        extensions = None
        if self._gardener_extension:
            extensions = _GardenerKind(
                Informer(
                    name="extensions",
                    source=Source(
                        api.list_cluster_custom_object,
                        (
                            gardener_extension.API_GROUP,
                            gardener_extension.API_VERSION.split("/")[1],
                            gardener_extension.PLURAL,
                        ),
                        {"field_selector": f"metadata.name={EXTENSION_NAME}"},
                    ),
                    parse=_parse_extension,
                )
            )
        return _Caches(
            machines=informer("machines", Machine),
            machine_sets=informer("machinesets", MachineSet),
            machine_deployments=informer("machinedeployments", MachineDeployment),
            clusters=_GardenerKind(clusters),
            extensions=extensions,
        )

    async def _synced_caches(self, namespace: str) -> _Caches:
        caches = await self._caches_of(None if self._gardener_extension else namespace)
        await caches.wait_synced("the seed" if self._gardener_extension else f"namespace {namespace!r}")
        return caches

    async def read(self, *, namespace: str, name: str) -> MachineSetView | None:
        caches = await self._synced_caches(namespace)
        return view_of(
            name=name,
            machine_sets=caches.machine_sets.by_index(_NAMESPACE_INDEX, namespace),
            machines=caches.machines.by_index(_NAMESPACE_INDEX, namespace),
            machine_deployments=caches.machine_deployments.by_index(_NAMESPACE_INDEX, namespace),
        )

    async def read_cluster(self, *, namespace: str) -> dict[str, Any] | None:
        return (await self._synced_caches(namespace)).clusters.get(namespace)

    async def read_extension(self, *, namespace: str) -> ShootExtension | None:
        if not self._gardener_extension:
            return None
        extensions = (await self._synced_caches(namespace)).extensions
        if extensions is None or not extensions.served:
            return None  # no Extension kind: not Gardener
        extension = extensions.get(f"{namespace}/{EXTENSION_NAME}")
        if isinstance(extension, Unreadable):
            raise SourceUnavailable(extension.problem)
        return extension or ShootExtension(present=False)

    async def close(self) -> None:
        caches, self._caches = list(self._caches.values()), {}
        await asyncio.gather(*(c.stop() for c in caches))
        if self._api_client is not None:
            with contextlib.suppress(*NO_ANSWER):
                await self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
