"""The evidence of a Failed machine's failure, kept in the shoot (core.evidence), and its removal.

- `EvidenceKeeper.capture`, when a Failed machine's preservation is planned with a drain, takes the pods on the
  node from the drain's own watch of them, as they are before its first eviction (they are what the drain
  changes). The rest is read once the drain's outcome is written (`drain_over`, at most EVIDENCE_DEFER later), so
  that the capture's requests never compete with the evictions for the shoot's API server: the Node (one GET: the
  cached Node keeps only a few conditions) and the Events about it (in `default`, where the kubelet's and the
  node controller's go; pages up to a byte budget); MCM's last operation comes from the Machine cache. It writes
  the ConfigMap EVIDENCE_NAMESPACE/evidence_name(node), owned by the Node, and the reconcile then points the Node
  at it (`settled`, `annotate`). With MCM preserving (and draining) natively, there is no watch: the capture lists
  the pods and reads the rest at once. Nothing of the preservation waits for it. A capture that fails is logged
  and told by a Warning Event on the Node.
- `EvidenceSweeper` looks at the evidence ConfigMaps every `core.evidence.sweep_period` and does what
  `core.evidence.plan_sweep` says: an expiry once the preservation ended, none while preserved again, deletion
  past the expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from kubernetes.aio import client

from machine_preservation.controller.machinery.events import NODE_EVENT_NAMESPACE, EventRecorder, Regarding
from machine_preservation.core import evidence as e
from machine_preservation.core import vocabulary as v
from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.core.models import Machine, Node, Pod
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.kube.api_errors import (
    NO_ANSWER,
    Conflict,
    Failed,
    NotFound,
    api_call,
    call,
    ensure_ok,
    read_json,
)
from machine_preservation.kube.clients import MERGE_PATCH

logger = logging.getLogger(__name__)
T = TypeVar("T")

# How long the reconcile waits, once the drain's outcome is written, for the capture to end before it points the
# Node at the evidence (a later reconcile points at it otherwise).
EVIDENCE_WAIT: Final = 2.0
# How long the rest of a capture waits for the drain's outcome to be written: a drain that takes longer (refused
# evictions, busy drain slots) does not hold the evidence back by more than this.
EVIDENCE_DEFER: Final = 2.0
# Each request of a capture or a sweep: an answer later than this is not waited for.
REQUEST_TIMEOUT: Final = 10.0
# The Events about a node read at most: pages of EVENTS_PAGE, up to EVENTS_BYTES of JSON (a node's Events of the
# last hour are a few dozen; the rest would be someone flooding them).
EVENTS_PAGE: Final = 250
EVENTS_BYTES: Final = 4 * 2**20
# The pods on a node read at most: one page (a node runs ≤ 110 pods by default, a few hundred on the largest
# instances of some providers), up to PODS_BYTES of JSON.
PODS_PAGE: Final = 1000
PODS_BYTES: Final = 16 * 2**20
# The evidence ConfigMaps a sweep lists at most, as metadata only: one page, up to SWEEP_BYTES.
SWEEP_PAGE: Final = 500
SWEEP_BYTES: Final = 8 * 2**20
_METADATA_ONLY: Final = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}


class TooBig(Exception):
    """An answer larger than its byte budget."""


async def _read_bounded(response: Any, limit: int) -> tuple[Any, int]:
    """The JSON of a raw answer and its size, read no further than `limit` bytes (TooBig past it)."""
    try:
        await ensure_ok(response)
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise TooBig(f"more than {limit / 2**20:g} MiB")
        return json.loads(body), len(body)
    finally:
        response.release()


def _items_of(page: object) -> list[Any]:
    items = page.get("items") if isinstance(page, Mapping) else None
    return items if isinstance(items, list) else []


@dataclass
class _Capture:
    node: str
    task: asyncio.Task[bool]  # True once the evidence is in the ConfigMap
    drain_over: asyncio.Event  # set by `drain_over`: a capture with the drain's pods reads the rest then
    pointed: bool = False  # the Node was pointed at it (`annotate`)


@dataclass
class EvidenceKeeper:
    """The evidence captures of one shoot, one per Failed machine's preservation (keyed by the machine's key)."""

    target: client.ApiClient
    recorder: EventRecorder
    clock: Clock = system_clock
    _captures: dict[str, _Capture] = field(default_factory=dict)
    _running: set[asyncio.Task[bool]] = field(default_factory=set)
    # How many captures have ended (written or not): the sweep looks again only after one did (EvidenceSweeper).
    ended: int = 0

    def capture(
        self, key: str, *, machine: Machine, node: Node, since: dt.datetime, pods: Sequence[Pod] | None
    ) -> None:
        """Start capturing the evidence of the machine's failure (once per preservation of its node; `since`: when
        the preservation started; `pods`: those on the node as our drain's watch has them before its first
        eviction, or None to list them)."""
        name = node.metadata.name
        if (known := self._captures.get(key)) is not None and known.node == name:
            return
        drain_over = asyncio.Event()
        watched = None if pods is None else tuple(pods)
        task = asyncio.create_task(self._capture(machine, node, since, watched, drain_over), name=f"evidence-{name}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._captures[key] = _Capture(node=name, task=task, drain_over=drain_over)

    def drain_over(self, key: str) -> None:
        """The drain's outcome is written: the rest of the machine's capture may go on."""
        if (known := self._captures.get(key)) is not None:
            known.drain_over.set()

    async def settled(self, key: str, *, seconds: float) -> None:
        """Until the machine's capture is done, at most `seconds` (it goes on afterwards)."""
        known = self._captures.get(key)
        if known is not None and not known.task.done():
            await asyncio.wait([known.task], timeout=seconds)

    def written(self, key: str) -> bool:
        known = self._captures.get(key)
        task = None if known is None else known.task
        return task is not None and task.done() and not task.cancelled() and task.exception() is None and task.result()

    def forget(self, key: str) -> None:
        """The machine's preservation ended: a later one captures anew (an unfinished capture still writes; the
        sweep removes what it wrote)."""
        self._captures.pop(key, None)

    def unpointed(self, key: str) -> bool:
        """The machine's capture is written (or still going on) and its Node not pointed at it yet."""
        known = self._captures.get(key)
        return known is not None and not known.pointed and (not known.task.done() or self.written(key))

    async def annotate(self, key: str, node: Node, *, version: str) -> str | None:
        """Point the Node at its evidence (PRESERVED_EVIDENCE_ANNOTATION) once it is written, at the Node's
        `version`; returns the Node's new resourceVersion, or None when nothing was written (not written yet,
        already pointed at, or the Node changed meanwhile: a later reconcile tries again)."""
        name = node.metadata.name
        reference = e.evidence_reference(name)
        known = self._captures.get(key)
        if known is None or known.pointed or not self.written(key):
            return None
        if node.metadata.annotations.get(v.PRESERVED_EVIDENCE_ANNOTATION) == reference:
            known.pointed = True
            return None
        body = {"metadata": {"resourceVersion": version, "annotations": {v.PRESERVED_EVIDENCE_ANNOTATION: reference}}}
        try:
            result = await call(
                client.CoreV1Api(self.target).patch_node(
                    name, body, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT
                )
            )
        except (Conflict, NotFound):
            return None
        except (Failed, *NO_ANSWER) as error:  # the preservation goes on without the pointer
            logger.warning("node %s: not pointed at its evidence: %s", name, error)
            return None
        known.pointed = True
        return (result.metadata.resource_version if result.metadata else None) or None

    async def stop(self) -> None:
        running = list(self._running)
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _capture(
        self, machine: Machine, node: Node, since: dt.datetime, pods: tuple[Pod, ...] | None, drain_over: asyncio.Event
    ) -> bool:
        try:
            return await self._read_and_write(machine, node, since, pods, drain_over)
        finally:
            self.ended += 1

    async def _read_and_write(
        self, machine: Machine, node: Node, since: dt.datetime, pods: tuple[Pod, ...] | None, drain_over: asyncio.Event
    ) -> bool:
        name = node.metadata.name
        try:
            evidence = await self._read(machine, name, pods, drain_over)
            await self._write(node, evidence, since=since)
        except (Failed, *NO_ANSWER, TooBig, ValueError) as error:
            logger.warning("node %s: evidence of the failure not recorded: %s", name, error)
            with contextlib.suppress(Failed, *NO_ANSWER):
                await self.recorder.record(
                    regarding=Regarding(kind="Node", name=name, uid=node.metadata.uid),
                    type=v.EventType.WARNING,
                    reason=v.EventReason.EVIDENCE_NOT_RECORDED,
                    message=f"The evidence of the failure could not be recorded: {error}"[:1024],
                    action="Preservation",
                    now=self.clock(),
                    once=True,
                    key=f"evidence-{since.isoformat()}",
                )
            return False
        logger.info("node %s: evidence of the failure recorded in %s", name, e.evidence_reference(name))
        return True

    async def _read(
        self, machine: Machine, node: str, pods: tuple[Pod, ...] | None, drain_over: asyncio.Event
    ) -> e.Evidence:
        """What the API serves about the node, each read on its own (one that fails is named in `unavailable`):
        with `pods` from our drain's watch, once the drain is over (at most EVIDENCE_DEFER); else at once, the
        pods listed."""
        core = client.CoreV1Api(self.target)
        pods_on_node: Sequence[Pod] | None = pods
        pods_error = None
        if pods_on_node is None:
            pods_on_node, pods_error = await _attempt(_pods(core, node))
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EVIDENCE_DEFER):
                    await drain_over.wait()
        (raw_node, node_error), (events, events_error) = await asyncio.gather(
            _attempt(_get(core.read_node_without_preload_content(node, _request_timeout=REQUEST_TIMEOUT))),
            _attempt(_events(core, node)),
        )
        errors = {"node": node_error, "events": events_error, "pods": pods_error}
        return e.build_evidence(
            node_name=node,
            captured_at=self.clock(),
            node=raw_node,
            events=events,
            pods=pods_on_node or (),
            machine={
                "metadata": {"name": machine.metadata.name},
                "status": {"currentStatus": {"phase": machine.phase}, "lastOperation": machine.status.last_operation},
            },
            unavailable=[f"{what}: {why}" for what, why in errors.items() if why is not None],
        )

    async def _write(self, node: Node, evidence: e.Evidence, *, since: dt.datetime) -> None:
        """Create the ConfigMap; one there already is kept if it holds this preservation's evidence (a restart
        captured again, after evictions), else replaced (an earlier preservation's)."""
        name = node.metadata.name
        body = e.evidence_config_map(node_name=name, node_uid=node.metadata.uid, evidence=evidence)
        core = client.CoreV1Api(self.target)
        try:
            await call(core.create_namespaced_config_map(v.EVIDENCE_NAMESPACE, body, _request_timeout=REQUEST_TIMEOUT))  # type: ignore[arg-type]
            return
        except Conflict:
            pass
        existing = await _get(
            core.read_namespaced_config_map_without_preload_content(
                e.evidence_name(name), v.EVIDENCE_NAMESPACE, _request_timeout=REQUEST_TIMEOUT
            )
        )
        if e.captured_since(_data(existing), since=since):
            return
        metadata = body["metadata"]
        replace = {
            "metadata": {
                "resourceVersion": e.resource_version(existing),
                "labels": metadata["labels"],
                "annotations": {**metadata["annotations"], v.EVIDENCE_EXPIRES_KEY: None},
                "ownerReferences": metadata["ownerReferences"],
            },
            "data": body["data"],
        }
        await call(
            core.patch_namespaced_config_map(
                e.evidence_name(name),
                v.EVIDENCE_NAMESPACE,
                replace,
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT,
            )
        )


async def _attempt(read: Awaitable[T]) -> tuple[T | None, str | None]:
    """What `read` returns, or None and why it failed (the API refused, did not answer, or answered too much)."""
    try:
        return await read, None
    except Failed as error:
        return None, f"{error.status} {error.reason}"
    except (*NO_ANSWER, TooBig, ValueError) as error:
        return None, str(error) or type(error).__name__


def _data(config_map: Mapping[str, Any]) -> object:
    data = config_map.get("data")
    return data.get(v.EVIDENCE_DATA_KEY) if isinstance(data, Mapping) else None


async def _get(request: Any) -> dict[str, Any]:
    """One object as JSON (NotFound and the others raised as their meaning)."""
    with api_call():
        document = await read_json(await request, absent=frozenset())
    if not isinstance(document, dict):
        raise ValueError("the answer is not a JSON object")
    return document


async def _events(core: client.CoreV1Api, node: str) -> list[Any]:
    """The Events about the Node in `default`, in the API server's order (oldest first: an Event is named after
    its object and the time it was first seen), pages up to EVENTS_BYTES; the newest pages kept when more come."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    events: list[Any] = []
    token: str | None = None
    read = 0
    while True:
        kwargs: dict[str, Any] = {"_continue": token} if token else {}
        with api_call():
            response = await core.list_namespaced_event_without_preload_content(
                NODE_EVENT_NAMESPACE,
                field_selector=selector,
                limit=EVENTS_PAGE,
                _request_timeout=REQUEST_TIMEOUT,
                **kwargs,
            )
            page, size = await _read_bounded(response, EVENTS_BYTES - read)
        read += size
        events += _items_of(page)
        continued = page.get("metadata", {}).get("continue") if isinstance(page, dict) else None
        if not continued or read >= EVENTS_BYTES:
            return events
        token = continued


async def _pods(core: client.CoreV1Api, node: str) -> list[Pod]:
    with api_call():
        response = await core.list_pod_for_all_namespaces_without_preload_content(
            field_selector=f"spec.nodeName={node}", limit=PODS_PAGE, _request_timeout=REQUEST_TIMEOUT
        )
        page, _ = await _read_bounded(response, PODS_BYTES)
    return e.pods_of(page)


@dataclass
class EvidenceSweeper:
    """Removes the evidence of ended preservations after `grace` (core.evidence.plan_sweep), every
    `core.evidence.sweep_period(grace)`."""

    target: client.ApiClient
    grace: dt.timedelta
    # The nodes preserved now (their evidence is kept).
    preserved: Callable[[], Collection[str]]
    # How many captures have ended (EvidenceKeeper.ended).
    captures_ended: Callable[[], int]
    clock: Clock = system_clock

    async def run(self) -> None:
        """Sweep every period while there may be evidence: after a sweep that found none, the next one waits for a
        capture to end. Most shoots never hold any, and a list every minute of each shoot of a seed cost the seed's
        process 9 % of its CPU at rest (run R, 200 shoots). The first sweep finds what an earlier process left."""
        period = e.sweep_period(self.grace).total_seconds()
        idle_since: int | None = None  # the captures ended before the last sweep that found no evidence
        while True:
            ended = self.captures_ended()
            if idle_since != ended:
                try:
                    idle_since = None if await self.sweep() else ended
                except (Failed, *NO_ANSWER, TooBig, ValueError) as error:
                    logger.warning("evidence sweep failed: %s; again in %gs", error, period)
            await asyncio.sleep(period)

    async def sweep(self) -> int:
        """One look at the evidence ConfigMaps; how many of them are ours."""
        core = client.CoreV1Api(self.target)
        with api_call():
            response = await core.list_namespaced_config_map_without_preload_content(
                v.EVIDENCE_NAMESPACE,
                label_selector=f"{v.EVIDENCE_LABEL}=true",
                limit=SWEEP_PAGE,
                _request_timeout=REQUEST_TIMEOUT,
                _headers=_METADATA_ONLY,
            )
            page, _ = await _read_bounded(response, SWEEP_BYTES)
        listed = (item.get("metadata") if isinstance(item, dict) else None for item in _items_of(page))
        stored = [found for metadata in listed if (found := e.stored_evidence(metadata)) is not None]
        for sweep in e.plan_sweep(stored, preserved=self.preserved(), now=self.clock(), grace=self.grace):
            await self._apply(core, sweep)
        return len(stored)

    async def _apply(self, core: client.CoreV1Api, sweep: e.Sweep) -> None:
        stored = sweep.evidence
        version = {"resourceVersion": stored.resource_version}
        try:
            if sweep.action is e.SweepAction.DELETE:
                await call(
                    core.delete_namespaced_config_map(
                        stored.name,
                        v.EVIDENCE_NAMESPACE,
                        body=client.V1DeleteOptions(
                            preconditions=client.V1Preconditions(resource_version=stored.resource_version)
                        ),
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                )
                logger.info("node %s: evidence of the failure deleted (expired)", stored.node)
                return
            expires = None if sweep.expires is None else format_timestamp(sweep.expires)
            body = {"metadata": {**version, "annotations": {v.EVIDENCE_EXPIRES_KEY: expires}}}
            await call(
                core.patch_namespaced_config_map(
                    stored.name,
                    v.EVIDENCE_NAMESPACE,
                    body,
                    _content_type=MERGE_PATCH,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            )
        except (Conflict, NotFound):
            pass  # changed or gone meanwhile: the next sweep sees it as it is
