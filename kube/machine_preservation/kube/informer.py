"""An async watch-and-cache ("informer") per resource, on `kubernetes.aio`.

List (paginated), then watch from the list's resourceVersion with bookmarks; resume every new watch
from the last resourceVersion seen (events and bookmarks), re-list on 410 Gone, reconnect with
backoff on any other failure (an apiserver restart is just a failed watch), and call the handlers
for every object on a periodic resync. Lists and watches are read raw (`*_without_preload_content`), objects
parsed into the core's pydantic models on arrival and the raw JSON dropped, so the cache holds only what its
reader (the controller, the webhook) reads.

`kubernetes.informer.SharedInformer` is thread-based; this one lives in its process's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import aiohttp

from machine_preservation.kube.api_errors import Failed, Gone, NoAnswer, api_call, ensure_ok, failed
from machine_preservation.kube.backoff import Backoff

logger = logging.getLogger(__name__)

T = TypeVar("T")

# (old, new): added = (None, obj), deleted = (obj, None), updated or resynced = (old, obj).
Handler = Callable[[T | None, T | None], None]
Indexer = Callable[[T], Iterable[str]]
ListFunction = Callable[..., Any]


def watch_event(line: bytes) -> tuple[str, Mapping[str, Any]]:
    """One line of a watch answer: (type, object). An ERROR event raises its status's meaning as a request would
    have (`Gone`: the resourceVersion expired); anything that is not an event raises ValueError."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    raw = event.get("object") if isinstance(event, Mapping) else None
    if not isinstance(raw, Mapping) or not isinstance(event.get("type"), str):
        raise ValueError(f"the watch answered {line[:200]!r}")
    if event["type"] == "ERROR":
        raise failed(raw.get("code"), f"{raw.get('reason')}: {raw.get('message')}")
    return event["type"], raw


class BudgetExceeded(Exception):
    """The objects an informer reads come to more bytes than its budget allows."""


async def watch_events(
    content: aiohttp.StreamReader, *, max_bytes: int | None = None
) -> AsyncIterator[tuple[int, str, Mapping[str, Any]]]:
    """The events of a watch answer's body, one JSON object per line, with their size in bytes, whatever the size
    of an object (a line may span many chunks), until the API server ends the watch. An event longer than
    `max_bytes` raises BudgetExceeded before it is parsed (or even read whole)."""
    pending = b""
    async for chunk in content.iter_any():
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            check_size(len(line), max_bytes, "one watch event comes")
            if line.strip():
                yield len(line), *watch_event(line)
        check_size(len(pending), max_bytes, "one watch event comes")
    if pending.strip():
        yield len(pending), *watch_event(pending)


# How much of a list page's beginning and end is kept while its bytes are only counted: its list metadata is there.
_LIST_END_BYTES = 64 * 2**10


def _list_metadata(head: bytes, tail: bytes) -> Mapping[str, Any]:
    """The `metadata` of a list page from its beginning and its end, never its items: built-in kinds come as
    `{"kind":…,"apiVersion":…,"metadata":{…},"items":[…]}`, custom resources with sorted keys, the metadata last
    (`{"apiVersion":…,"items":[…],"kind":…,"metadata":{…}}`). A key's quotes cannot come from inside a string, so
    no object can fake it. {} if not found."""
    start, items = head.find(b'"metadata":'), head.find(b'"items":')
    if start >= 0 and (items < 0 or start < items):
        text = head[start:]
    elif (start := tail.rfind(b'"metadata":')) >= 0:
        text = tail[start:]
    else:
        return {}
    try:
        metadata, _ = json.JSONDecoder().raw_decode(text[len(b'"metadata":') :].decode())
    except (ValueError, UnicodeDecodeError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def check_size(size: int, max_bytes: int | None, what: str) -> None:
    """Raise BudgetExceeded if `size` is over `max_bytes` (None: no budget); `what` says whose size it is."""
    if max_bytes is not None and size > max_bytes:
        raise BudgetExceeded(f"{what} to more than {max_bytes / 2**20:g} MiB of JSON, over the budget")


@dataclass(frozen=True)
class Source:
    """How to list and watch one resource: a bound `list_*` method of a kubernetes.aio API and its
    positional arguments (e.g. `CustomObjectsApi.list_namespaced_custom_object`, group, version, ...)."""

    list_function: ListFunction
    args: tuple[Any, ...] = ()
    # Keyword arguments of both the list and the watch, e.g. a field selector.
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def raw_list_function(self) -> ListFunction:
        owner = self.list_function.__self__  # type: ignore[attr-defined]
        return cast(ListFunction, getattr(owner, f"{self.list_function.__name__}_without_preload_content"))


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0
    errors: int = 0
    resyncs: int = 0
    unparsable: int = 0


def object_key(raw: Mapping[str, Any]) -> str:
    metadata = raw.get("metadata") or {}
    namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
    return f"{namespace}/{name}" if namespace else name


@dataclass
class Informer(Generic[T]):
    """List-watch cache of one resource, keyed `namespace/name` (or `name` when cluster-scoped)."""

    name: str
    source: Source
    parse: Callable[[Mapping[str, Any]], T]
    resync_period: float = 600.0
    watch_timeout: int = 300
    page_size: int = 500
    # Where set, pages are sized to about this many bytes (by the last page's bytes per object), from 1 object up
    # to `page_size`: a page is read and parsed whole, and a cluster's objects may be big (a first page of 10
    # Nodes of 1.36 MB each was 13.6 MB of JSON parsed at once). A page that comes to more than twice as many
    # bytes (small objects, then big ones: 31 Nodes of 1.36 MB after 19 small ones, 140 MiB of memory) is dropped
    # unparsed and asked for again one object at a time.
    page_bytes: int | None = None
    # With `page_bytes`, how many objects the first page asks for: 1 where a dropped page costs much (its size is not
    # known yet), more where one round trip matters more than reading up to twice `page_bytes` once for nothing.
    first_page_size: int = 1
    # Where set, how many bytes of JSON the objects may come to, as read: past it, listing or watching stops and
    # the informer fails (BudgetExceeded) until a re-list finds them within it. A page or an event is measured
    # before it is parsed.
    byte_budget: int | None = None
    # What each object counts against the budget at least: many small objects must not fill the cache either.
    min_object_bytes: int = 0
    backoff: Backoff = field(default_factory=lambda: Backoff(base=0.2, cap=30.0))
    # The re-lists after the objects came to more than the byte budget (None: `backoff`): each reads up to the
    # budget again, so a cache that stays over it can be retried more patiently.
    budget_backoff: Backoff | None = None
    # The resourceVersion the next watch resumes from ("" = list first).
    resource_version: str = ""
    # Bumped on every change to the store (not on resyncs): what is derived from the cache is valid while it stays.
    generation: int = 0
    stats: InformerStats = field(default_factory=InformerStats)
    # Why listing or watching fails, while it does (None once a list or a watch event gets through).
    failing: str | None = None
    # Whether the objects came to more than the byte budget (until a re-list finds them within it).
    over_budget: bool = False
    _store: dict[str, T] = field(default_factory=dict)
    _indexers: dict[str, Indexer[T]] = field(default_factory=dict)
    _indices: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    _index_values: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    _handlers: list[Handler[T]] = field(default_factory=list)
    # Told when `synced`, `failing` or `over_budget` changes (not on every event): whoever reports on the cache's
    # health learns of it at once instead of asking.
    _state_listeners: list[Callable[[], None]] = field(default_factory=list)
    # The size in bytes each object had as read (kept with a `byte_budget` only).
    _sizes: dict[str, int] = field(default_factory=dict)
    _bytes: int = 0  # their sum
    _synced: asyncio.Event = field(default_factory=asyncio.Event)

    # --- wiring ------------------------------------------------------------------------------------

    def add_indexer(self, index: str, indexer: Indexer[T]) -> None:
        self._indexers[index] = indexer
        self._indices[index] = {}
        self._index_values[index] = {}
        for key, obj in self._store.items():
            self._index(index, key, obj)

    def has_indexer(self, index: str) -> bool:
        return index in self._indexers

    def add_handler(self, handler: Handler[T]) -> None:
        self._handlers.append(handler)

    def add_state_listener(self, listener: Callable[[], None]) -> None:
        self._state_listeners.append(listener)

    # --- reading -----------------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        return self._store.get(key)

    def keys(self) -> list[str]:
        return list(self._store)

    def values(self) -> list[T]:
        return list(self._store.values())

    def by_index(self, index: str, value: str) -> list[T]:
        return [self._store[key] for key in sorted(self._indices[index].get(value, ()))]

    def __len__(self) -> int:
        return len(self._store)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def relist(self) -> None:
        """Start over: the next run lists anew, and until it has, the cache counts as not synced (it may have missed
        changes while nothing watched)."""
        self.resource_version = ""
        if self._synced.is_set():
            self._synced.clear()
            self._state_changed()

    # --- running -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled."""
        resync = asyncio.create_task(self._resync_loop(), name=f"{self.name}-resync")
        failures = 0
        try:
            while True:
                try:
                    with api_call():
                        if not self.resource_version:
                            await self._list()
                        await self._watch()
                    failures = 0
                except Gone:
                    self.stats.expired += 1
                    logger.info("%s: resourceVersion %s expired, re-listing", self.name, self.resource_version)
                    self.resource_version = ""
                except Failed as error:
                    failures += 1
                    self.stats.errors += 1
                    self._report(failing=f"HTTP {error.status} {error.reason}")
                    logger.warning("%s: list/watch failed (%s %s), retrying", self.name, error.status, error.reason)
                    await asyncio.sleep(self._jittered(failures))
                except BudgetExceeded as error:
                    failures += 1
                    self.stats.errors += 1
                    self._report(failing=str(error), over_budget=True)
                    self.resource_version = ""  # what was dropped unread is known again only by a re-list
                    logger.warning("%s: %s, re-listing later", self.name, error)
                    await asyncio.sleep(self._jittered(failures, self.budget_backoff))
                except (NoAnswer, ValueError) as error:  # ValueError: an unreadable answer
                    failures += 1
                    self.stats.errors += 1
                    self._report(failing=str(error) or type(error).__name__)
                    logger.warning("%s: list/watch failed (%r), retrying", self.name, error)
                    await asyncio.sleep(self._jittered(failures))
        finally:
            resync.cancel()

    def _report(self, *, failing: str | None, over_budget: bool | None = None, changed: bool = False) -> None:
        """Keep why listing or watching fails (None: it works) and whether the objects are over the budget; tell
        the state listeners if that, or `changed` (the cache synced), is news."""
        over_budget = self.over_budget if over_budget is None else over_budget
        changed = changed or (failing, over_budget) != (self.failing, self.over_budget)
        self.failing, self.over_budget = failing, over_budget
        if changed:
            self._state_changed()

    def _state_changed(self) -> None:
        for listener in self._state_listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not stop the cache it listens to
                logger.exception("%s: state listener failed", self.name)

    def _jittered(self, failures: int, backoff: Backoff | None = None) -> float:
        return (backoff or self.backoff).delay(failures) * random.uniform(0.8, 1.2)

    async def _list(self) -> None:
        if self.over_budget:
            await self._count()  # raises BudgetExceeded while the objects are still over the budget
        raw_list = self.source.raw_list_function()
        items: dict[str, T] = {}
        sizes: dict[str, int] = {}
        token: str | None = None
        resource_version = ""
        limit = self.page_size if self.page_bytes is None else self.first_page_size
        listed = 0
        while True:
            kwargs: dict[str, Any] = {"limit": limit}
            if token:
                kwargs["_continue"] = token
            response = await raw_list(*self.source.args, **self.source.kwargs, **kwargs)
            cap = 2 * self.page_bytes if self.page_bytes is not None and limit > 1 else None
            body = await self._read_page(response, listed=listed, cap=cap)
            if body is None:
                limit = 1  # the same page again (the same continue token), sized anew from its first object
                continue
            page = json.loads(body)
            raws = page.get("items") or []
            size = len(body) // max(len(raws), 1)  # each object's share of the page (its own is not known)
            listed += max(size, self.min_object_bytes) * len(raws)
            check_size(listed, self.byte_budget, f"the {self.name} come")
            for raw in raws:
                parsed = self._parse(raw)
                if parsed is not None:
                    items[key := object_key(raw)] = parsed
                    if self.byte_budget is not None:
                        sizes[key] = max(size, self.min_object_bytes)
            metadata = page.get("metadata") or {}
            del page, raws  # the page's JSON is not kept while the next is read
            if self.page_bytes is not None:
                limit = max(1, min(self.page_size, self.page_bytes // max(size, 1)))
            resource_version = resource_version or metadata.get("resourceVersion", "")
            token = metadata.get("continue")
            if not token:
                break
        self.stats.lists += 1
        self._sizes, self._bytes = sizes, sum(sizes.values())
        self._replace(items)
        self.resource_version = resource_version
        newly_synced = not self._synced.is_set()
        self._synced.set()
        self._report(failing=None, over_budget=False, changed=newly_synced)
        logger.debug("%s: listed %d objects at resourceVersion %s", self.name, len(items), resource_version)

    async def _count(self) -> None:
        """While the objects are over the byte budget, a re-list first only counts them, parsing nothing: the bytes
        of each page as they stream in, the objects from the API server's `remainingItemCount`. Only once they fit
        are they read for real. Raises BudgetExceeded while they are still over it; returns once they fit, or when
        the API server does not say how many remain (a filtered list: then the real list counts)."""
        raw_list = self.source.raw_list_function()
        token: str | None = None
        counted = objects = 0
        left: int | None = None  # the objects after the pages counted so far
        while True:
            limit = 1 if left is None else self.page_size  # the first page's count is then known: 0 or 1
            kwargs: dict[str, Any] = {"limit": limit, **({"_continue": token} if token else {})}
            response = await raw_list(*self.source.args, **self.source.kwargs, **kwargs)
            size, metadata = await self._count_page(response, counted=counted)
            counted += size
            token = metadata.get("continue") or None
            remaining = metadata.get("remainingItemCount") if token else 0
            if not isinstance(remaining, int):
                return
            # The first page (limit 1) holds at most one object; each later one, those that no longer remain.
            objects += 1 if left is None else left - remaining
            check_size(max(counted, objects * self.min_object_bytes), self.byte_budget, f"the {self.name} come")
            if not token:
                return
            left = remaining

    async def _count_page(self, response: Any, *, counted: int) -> tuple[int, Mapping[str, Any]]:
        """A list page's size in bytes (read no further than the budget allows after the `counted` bytes before
        it) and its list metadata; only the page's two ends are kept."""
        try:
            await ensure_ok(response)
            head, tail, size = bytearray(), bytearray(), 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                check_size(counted + size, self.byte_budget, f"the {self.name} come")
                if len(head) < _LIST_END_BYTES:
                    head += chunk[: _LIST_END_BYTES - len(head)]
                tail = (tail + chunk)[-_LIST_END_BYTES:]
            return size, _list_metadata(bytes(head), bytes(tail))
        finally:
            response.release()

    async def _read_page(self, response: Any, *, listed: int, cap: int | None) -> bytearray | None:
        """A list page's body, read no further than the byte budget allows after the `listed` bytes before it; None
        (the rest unread) once it comes to more than `cap` bytes."""
        try:
            await ensure_ok(response)
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                check_size(listed + len(body), self.byte_budget, f"the {self.name} come")
                if cap is not None and len(body) > cap:
                    return None
            return body
        finally:
            response.release()

    async def _watch(self) -> None:
        self.stats.watches += 1
        # Spread the watch restarts of many informers/replicas over time (client-go: 5-10 minutes).
        timeout = int(self.watch_timeout * random.uniform(1.0, 1.5))
        # The raw answer, read here: the library's `Watch` builds a client with the system's CA bundle for every
        # watch (~0.8 MiB kept and ~36 ms of CPU each).
        response = await self.source.raw_list_function()(
            *self.source.args,
            **self.source.kwargs,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _request_timeout=timeout + 30,
        )
        try:
            await ensure_ok(response)
            # Served again from the moment the API server answers the watch: a quiet cluster may send its first
            # event or bookmark only a minute later, and a shoot would be reported unserved until then.
            self._report(failing=None)
            async for size, kind, raw in watch_events(response.content, max_bytes=self.byte_budget):
                self._apply(kind, raw, size=size)
        finally:
            response.release()

    def _apply(self, kind: str, raw: Mapping[str, Any], *, size: int = 0) -> None:
        if self.failing is not None:
            self._report(failing=None)
        version = (raw.get("metadata") or {}).get("resourceVersion", "")
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
        else:
            self.stats.events += 1
            key = object_key(raw)
            if self.byte_budget is not None:
                self._bytes -= self._sizes.pop(key, 0)
                if kind != "DELETED":
                    self._sizes[key] = max(size, self.min_object_bytes)
                    self._bytes += self._sizes[key]
                    check_size(self._bytes, self.byte_budget, f"the {self.name} come")
            if kind == "DELETED":
                old = self._remove(key)
                if old is not None:
                    self._notify(old, None)
            else:
                new = self._parse(raw)
                if new is None:  # unreadable: as if it were gone, so nothing acts on a stale copy
                    old = self._remove(key)
                    if old is not None:
                        self._notify(old, None)
                else:
                    old = self._put(key, new)
                    self._notify(old, new)
        if version:
            self.resource_version = version

    def _parse(self, raw: Mapping[str, Any]) -> T | None:
        """The model of one object; None (and a warning) if it does not fit, so one odd object cannot
        stall the whole cache."""
        try:
            return self.parse(raw)
        except ValueError as error:
            self.stats.unparsable += 1
            logger.warning("%s: skipping %s, it does not parse: %s", self.name, object_key(raw), error)
            return None

    def _replace(self, items: dict[str, T]) -> None:
        for key in [k for k in self._store if k not in items]:
            old = self._remove(key)
            if old is not None:
                self._notify(old, None)
        for key, new in items.items():
            old = self._put(key, new)
            self._notify(old, new)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_period)
            if self.synced:
                self.stats.resyncs += 1
                for obj in list(self._store.values()):
                    self._notify(obj, obj)

    # --- store and indices -------------------------------------------------------------------------

    def _put(self, key: str, obj: T) -> T | None:
        self.generation += 1
        old = self._store.get(key)
        self._store[key] = obj
        for index in self._indexers:
            self._unindex(index, key)
            self._index(index, key, obj)
        return old

    def _remove(self, key: str) -> T | None:
        self.generation += 1
        old = self._store.pop(key, None)
        for index in self._indexers:
            self._unindex(index, key)
        return old

    def _index(self, index: str, key: str, obj: T) -> None:
        values = tuple(v for v in self._indexers[index](obj) if v)
        self._index_values[index][key] = values
        for value in values:
            self._indices[index].setdefault(value, set()).add(key)

    def _unindex(self, index: str, key: str) -> None:
        for value in self._index_values[index].pop(key, ()):
            keys = self._indices[index].get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._indices[index][value]

    def _notify(self, old: T | None, new: T | None) -> None:
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:
                logger.exception("%s: event handler failed", self.name)


async def supervise(informer: Informer[Any], backoff: Backoff) -> None:
    """Run `informer` until cancelled. One that ends (an answer or a bug its own retries do not cover) is started
    again with backoff and lists anew; until it has, its cache, which no longer follows the API server, counts as
    not synced."""
    failures = 0
    while True:
        try:
            await informer.run()
            raise RuntimeError("the informer returned")  # it runs until cancelled
        except asyncio.CancelledError:
            raise
        except Exception as error:
            failures += 1
            delay = backoff.delay(failures)
            logger.error("informer %s ended (%r); starting it again in %.1f s", informer.name, error, delay)
            informer.relist()
            await asyncio.sleep(delay)
