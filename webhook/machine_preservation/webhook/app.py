"""The aiohttp application: routes, the review pipeline per endpoint, health and metrics.

Every admission endpoint goes through `_serve`: read the body (413 above the limit), parse the review (400
with a reason), decide with the core, answer 200 with the uid echoed. `dryRun` requests take the same path:
no decision here has side effects. A body that does not arrive in time gets 408, so nothing hangs.

Many shoots, one server (Gardener): the node endpoints are also served under `/shoots/{namespace}<path>`, the
URL each shoot's kube-apiserver is given, so that a node request says which shoot it comes from (its shoot
namespace in the seed). There, and for Machine requests (by their namespace), whether MCM preserves natively is
the namespace's own decision when the server has a `NativeSource` (`--mcm-native-preservation-per-namespace`);
without one, and on the plain node paths, the process-wide setting applies as before. Metrics and failure
policies are those of the plain path: no label per shoot. A seed serves the two from separate processes
(`Routes`, `--routes`), so that the traffic of every shoot never takes the connections or the time of the seed's
fail-closed Machine webhooks.

The paths, the kinds each accepts and each webhook's failurePolicy are the registry's
(`core.webhook_configurations.REGISTRY`), the same the charts' configurations are tested against; here each path
only gets its decision. An unexpected exception (a bug of ours, never something a client sent) is logged,
counted and answered as the endpoint's failure policy says (`FAILURE_POLICIES`): a Node request is allowed with
a warning, because the node rules must never block kubelets; a Machine or Shoot request gets HTTP 500, so that
the API server treats the call as failed and applies the rule's `failurePolicy` (Fail unless an operator chose
Ignore) instead of this webhook letting it through unchecked.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypeVar, assert_never

from aiohttp import web
from pydantic import ValidationError

from machine_preservation.core.admission.annotations import judge_annotations
from machine_preservation.core.admission.ca_guard import guard_ca_annotation, guard_mcm_marker
from machine_preservation.core.admission.deletion import (
    NEEDS,
    RELEASES,
    Assessment,
    DeletionRequest,
    Need,
    ReadCluster,
    ReadExtension,
    ReadMachineSet,
    Reads,
    assess_machine_deletion,
)
from machine_preservation.core.admission.field_errors import shorten
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import validate_shoot
from machine_preservation.core.admission.verdict import Verdict, allow, deny, describe
from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.core.models import KubeModel, Machine, Node
from machine_preservation.core.webhook_configurations import (
    CA_ANNOTATION_PATH,
    MACHINE_DELETION_PATH,
    MCM_MARKER_PATH,
    NODE_PRESERVE,
    PRESERVE_ANNOTATION_PATH,
    REGISTRY,
    SHOOT_PATH,
    FailurePolicy,
    shoot_path,
)
from machine_preservation.webhook.machine_sets import MachineSetSource, SourceUnavailable
from machine_preservation.webhook.mcm_detection import NativeSource
from machine_preservation.webhook.metrics import CONTENT_TYPE, WebhookMetrics
from machine_preservation.webhook.wire import (
    AdmissionRequest,
    BadRequest,
    bad_request_response,
    first_problem,
    parse_review,
    review_response,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES: Final = 3 * 1024 * 1024
# The API server sends a review in one go and gives up after timeoutSeconds (≤ 30); a body still trickling
# in after this long is not from it, and must not hold a connection forever.
DEFAULT_BODY_TIMEOUT_SECONDS: Final = 10.0
INTERNAL_ERROR_WARNING: Final = "machine-preservation webhook: internal error, request not checked"
INTERNAL_ERROR_MESSAGE: Final = "machine-preservation webhook: internal error, request not judged; retry later"

NODE: Final = NODE_PRESERVE.group_kind

# The admission routes of one listener: "seed", the plain paths (the seed's Machine webhooks, and a standalone
# installation's node webhooks); "shoots", only `/shoots/{namespace}/…` (every shoot's node webhooks); "all", both.
# Health and metrics are served everywhere.
Routes = Literal["all", "seed", "shoots"]

# The failurePolicy each endpoint is registered with, per kind: how an internal error is answered. Node
# rules are always Ignore; Machine and Shoot rules default to Fail (an operator may register them with
# Ignore: the API server applies whichever they have, as it receives a 500).
FAILURE_POLICIES: Final[Mapping[tuple[str, tuple[str, str]], FailurePolicy]] = {
    (r.path, r.group_kind): r.failure_policy for r in REGISTRY
}
# The paths each shoot's kube-apiserver also calls under `/shoots/{namespace}` (the node webhooks).
NODE_PATHS: Final = tuple(dict.fromkeys(r.path for r in REGISTRY if r.per_shoot))
# A namespace name is a DNS-1123 label.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

_ERROR_KINDS: Final = {413: "too_large", 408: "timeout"}

# A parsed request and the namespace its URL names (None on the plain paths) to a verdict.
Decide = Callable[[AdmissionRequest, str | None], Awaitable[Verdict]]
M = TypeVar("M", bound=KubeModel)


@dataclass(frozen=True)
class WebhookConfig:
    settings: AdmissionSettings
    machine_sets: MachineSetSource
    ready: Callable[[], bool]
    metrics: WebhookMetrics
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS
    clock: Clock = system_clock
    # Per namespace whether MCM preserves natively (None: `settings.mcm_native_preservation` everywhere).
    native: NativeSource | None = None


def valid_namespace(name: str) -> bool:
    return _NAMESPACE.fullmatch(name) is not None


def failure_policy(path: str, kind: tuple[str, str] | None) -> FailurePolicy:
    """The policy for a request of `kind` (None: not known, the review could not be read) to `path`.

    A kind the table does not list for the path is treated as Ignore if the path serves Nodes at all, so that
    a kubelet's request is never blocked by mistake.
    """
    policy = FAILURE_POLICIES.get((path, kind)) if kind is not None else None
    if policy is not None:
        return policy
    return "Ignore" if (path, NODE) in FAILURE_POLICIES else "Fail"


def _internal_error_response(path: str, kind: tuple[str, str] | None, uid: str) -> web.Response:
    if failure_policy(path, kind) == "Ignore":
        verdict = allow(warnings=(INTERNAL_ERROR_WARNING,))
        return web.json_response(review_response(uid=uid, verdict=verdict).to_json())
    # A Status body: the API server quotes its message in the error it returns to the client.
    status = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": INTERNAL_ERROR_MESSAGE,
        "reason": "InternalError",
        "code": 500,
    }
    return web.json_response(status, status=500)


def _accepted_kinds(path: str, *, per_shoot: bool = False) -> tuple[tuple[str, str], ...]:
    """The kinds the webhooks registered at `path` send; `per_shoot`: on its `/shoots/{namespace}` route, where
    only a shoot's kube-apiserver calls (the node webhooks)."""
    return tuple(dict.fromkeys(r.group_kind for r in REGISTRY if r.path == path and (r.per_shoot or not per_shoot)))


def _require_kind(request: AdmissionRequest, kinds: tuple[tuple[str, str], ...]) -> None:
    if (request.kind.group, request.kind.kind) not in kinds:
        expected = ", ".join(f"{group or 'core'}/{kind}" for group, kind in kinds)
        shown = f"{request.kind.group or 'core'}/{request.kind.kind}"
        raise BadRequest(f"this endpoint handles {expected}, not {shown}", uid=request.uid)


def _parse(model: type[M], document: dict[str, Any] | None, *, field: str, uid: str) -> M:
    if document is None:
        raise BadRequest(f"request.{field} is missing", uid=uid)
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise BadRequest(f"request.{field} is not a valid {model.__name__}: {first_problem(error)}", uid=uid) from None


def _node_update(request: AdmissionRequest) -> tuple[Node, Node] | None:
    """The Node before and after an UPDATE (what the mutating node endpoints judge); None for other operations."""
    if request.operation != "UPDATE":
        return None
    return (
        _parse(Node, request.old_object, field="oldObject", uid=request.uid),
        _parse(Node, request.object, field="object", uid=request.uid),
    )


def _annotations_present(document: dict[str, Any] | None) -> bool:
    metadata = document.get("metadata") if document is not None else None
    return isinstance(metadata, dict) and isinstance(metadata.get("annotations"), dict)


class Endpoints:
    """The admission decisions, each from a parsed request of a kind its path accepts (and the namespace its URL
    names) to a verdict."""

    def __init__(self, config: WebhookConfig) -> None:
        self._config = config
        self._by_native = {
            native: config.settings.model_copy(update={"mcm_native_preservation": native}) for native in (False, True)
        }

    async def _settings(self, namespace: str | None) -> AdmissionSettings:
        """The settings for an object of `namespace`: with that namespace's own native decision when there is a
        source for it; the process-wide settings for no namespace."""
        source = self._config.native
        if source is None or not namespace:
            return self._config.settings
        return self._by_native[await source.native(namespace)]

    async def preserve_annotation(self, request: AdmissionRequest, shoot_namespace: str | None = None) -> Verdict:
        # A shoot's kube-apiserver sends Nodes only; Machines come from the seed's, on the plain path.
        group_kind = (request.kind.group, request.kind.kind)
        if request.operation not in ("CREATE", "UPDATE"):
            return allow()
        model: type[Node] | type[Machine] = Node if group_kind == NODE else Machine
        new = _parse(model, request.object, field="object", uid=request.uid)
        old = None
        if request.operation == "UPDATE":
            old = _parse(model, request.old_object, field="oldObject", uid=request.uid)
        # Nodes are cluster-scoped: their namespace is the shoot's, from the URL; a Machine's is its own.
        namespace = shoot_namespace if isinstance(new, Node) else (request.namespace or new.metadata.namespace)
        return judge_annotations(
            subject=describe(group_kind[1], new.metadata.name, new.metadata.generate_name),
            old=old.metadata.annotations if old is not None else None,
            new=new.metadata.annotations,
            username=request.user_info.username,
            settings=await self._settings(namespace),
            namespace=None if group_kind == NODE else namespace,
        )

    async def ca_annotation(self, request: AdmissionRequest, shoot_namespace: str | None = None) -> Verdict:
        update = _node_update(request)
        if update is None:
            return allow()
        return guard_ca_annotation(
            old_node=update[0],
            new_node=update[1],
            annotations_present=_annotations_present(request.object),
            username=request.user_info.username,
            settings=await self._settings(shoot_namespace),
        )

    async def mcm_marker(self, request: AdmissionRequest, shoot_namespace: str | None = None) -> Verdict:
        update = _node_update(request)
        if update is None:
            return allow()
        return guard_mcm_marker(
            old_node=update[0],
            new_node=update[1],
            username=request.user_info.username,
            settings=await self._settings(shoot_namespace),
        )

    async def machine_deletion(self, request: AdmissionRequest, _: str | None = None) -> Verdict:
        if request.operation != "DELETE":
            return allow()
        machine = _parse(Machine, request.old_object, field="oldObject", uid=request.uid)
        namespace = request.namespace or machine.metadata.namespace
        deletion = DeletionRequest(
            machine=machine,
            username=request.user_info.username,
            settings=await self._settings(namespace),
            now=self._config.clock(),
            namespace=namespace or None,  # whose MCM ServiceAccount counts (None: the machine's metadata says)
        )
        try:
            assessment = await self._assess(deletion)
        except SourceUnavailable as error:
            # Fail closed for MCM only (it retries): letting it delete could lose a machine that is
            # preserved or about to be.
            self._config.metrics.errors.labels(MACHINE_DELETION_PATH.lstrip("/"), "upstream").inc()
            return deny(
                f'cannot decide whether MCM may delete machine "{machine.metadata.name}": {error}; retry later',
                code=503,
                reason="ServiceUnavailable",
            )
        if assessment.outcome in RELEASES:
            logger.info("MCM may delete a machine that is kept: %s", assessment.message)
        return assessment.verdict()

    async def _assess(self, deletion: DeletionRequest) -> Assessment:
        """Ask the core, read what it still needs from the caches, ask again: each kind is asked for once at
        most, so there are at most `len(NEEDS)` reads."""
        reads = Reads()
        step = assess_machine_deletion(deletion, reads)
        for _ in NEEDS:
            if isinstance(step, Assessment):
                return step
            reads = await self._read(step, reads)
            step = assess_machine_deletion(deletion, reads)
        if isinstance(step, Assessment):
            return step
        raise RuntimeError(f"the deletion guard still needs {step} after one read of each kind")

    async def _read(self, need: Need, reads: Reads) -> Reads:
        source = self._config.machine_sets
        match need:
            case ReadMachineSet(namespace=namespace, name=name):
                return replace(reads, machine_set=await source.read(namespace=namespace, name=name))
            case ReadCluster(name=name):
                return replace(reads, cluster=await source.read_cluster(namespace=name))
            case ReadExtension(namespace=namespace):
                return replace(reads, extension=await source.read_extension(namespace=namespace))
            case _:
                assert_never(need)

    async def shoot(self, request: AdmissionRequest, _: str | None = None) -> Verdict:
        if request.operation not in ("CREATE", "UPDATE"):
            return allow()
        if request.object is None:
            raise BadRequest("request.object is missing", uid=request.uid)
        old = request.old_object if request.operation == "UPDATE" else None
        return validate_shoot(shoot=request.object, old_shoot=old, settings=self._config.settings)


async def _read_body(request: web.Request, *, limit: int, seconds: float) -> bytes:
    """The body, read from the stream rather than with `request.read()`: that keeps a copy on the request, and
    aiohttp holds the last request of a kept-alive connection until the next one arrives."""
    if request.content_length is not None and request.content_length > limit:
        raise BadRequest(f"body of {request.content_length} bytes exceeds the limit of {limit} bytes", status=413)
    content = request.content
    chunks: list[bytes] = []
    size = 0
    try:
        # The API server sends the whole review at once: usually it is all in already and needs no timer.
        async with asyncio.timeout(None if content.is_eof() else seconds):
            while chunk := await content.readany():
                size += len(chunk)
                if size > limit:
                    raise BadRequest(f"body exceeds the limit of {limit} bytes", status=413)
                chunks.append(chunk)
    except TimeoutError:
        raise BadRequest(f"body not received within {seconds:g} s", status=408) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _shoot_namespace(request: web.Request) -> str:
    """The namespace a `/shoots/{namespace}/…` path names; BadRequest for one that cannot be a namespace."""
    namespace = request.match_info["namespace"]
    if not valid_namespace(namespace):
        shown = namespace if len(namespace) <= 80 else namespace[:80] + "…"
        raise BadRequest(f"{shown!r} in the URL path is not a namespace name (a DNS-1123 label)")
    return namespace


def _serve(
    config: WebhookConfig, path: str, decide: Decide, *, for_shoot: bool = False
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of endpoint `path`; `for_shoot`: its `/shoots/{namespace}` route (same metrics, same policy)."""
    endpoint = path.lstrip("/")
    kinds = _accepted_kinds(path, per_shoot=for_shoot)
    metrics = config.metrics
    # Label lookups cost a lock and a dict probe each; bind this endpoint's series once.
    requests, denials = metrics.requests.labels(endpoint), metrics.denials.labels(endpoint)
    patches, latency = metrics.patches.labels(endpoint), metrics.latency.labels(endpoint)

    async def handler(request: web.Request) -> web.Response:
        started = time.perf_counter()
        requests.inc()
        uid = ""
        kind: tuple[str, str] | None = None
        try:
            try:
                shoot_namespace = _shoot_namespace(request) if for_shoot else None
                if shoot_namespace and config.native is not None:
                    # The shoot's decision first (read from the seed when not cached): a burst of first requests
                    # from many shoots then waits holding their bodies, not their ~3x larger parsed reviews.
                    await config.native.native(shoot_namespace)
                body = await _read_body(request, limit=config.max_body_bytes, seconds=config.body_timeout)
                review = parse_review(body)
                uid, kind = review.request.uid, (review.request.kind.group, review.request.kind.kind)
                _require_kind(review.request, kinds)
                verdict = await decide(review.request, shoot_namespace)
            except BadRequest as error:
                metrics.errors.labels(endpoint, _ERROR_KINDS.get(error.status, "bad_request")).inc()
                return web.json_response(bad_request_response(error).to_json(), status=error.status)
            except Exception:
                logger.exception("internal error while judging request %s to %s", uid, path)
                metrics.errors.labels(endpoint, "internal").inc()
                return _internal_error_response(path, kind, uid)
            # Denials and patches are rare and are what an operator asks about; allowed requests are only counted.
            if not verdict.allowed:
                denials.inc()
                logger.info("%s denied request %s: %s", endpoint, uid, shorten(verdict.message))
            if verdict.patch:
                patches.inc()
                logger.info("%s patched request %s: %s", endpoint, uid, shorten("; ".join(verdict.warnings)))
            return web.json_response(review_response(uid=uid, verdict=verdict).to_json())
        finally:
            latency.observe(time.perf_counter() - started)

    return handler


def build_app(config: WebhookConfig, *, routes: Routes = "all") -> web.Application:
    """The app with the admission routes `routes` names (see `Routes`), health and metrics."""
    # aiohttp's own cap (default 1 MiB) would answer 413 before we see the body; ours applies instead.
    app = web.Application(client_max_size=config.max_body_bytes)
    endpoints = Endpoints(config)
    decisions: dict[str, Decide] = {
        PRESERVE_ANNOTATION_PATH: endpoints.preserve_annotation,
        CA_ANNOTATION_PATH: endpoints.ca_annotation,
        MCM_MARKER_PATH: endpoints.mcm_marker,
        MACHINE_DELETION_PATH: endpoints.machine_deletion,
        SHOOT_PATH: endpoints.shoot,
    }
    # Every registered path, and only those (a path without a decision fails here, at start).
    for path in dict.fromkeys(r.path for r in REGISTRY):
        decide = decisions[path]
        if routes != "shoots":
            app.router.add_post(path, _serve(config, path, decide))
        if path in NODE_PATHS and routes != "seed":
            app.router.add_post(shoot_path("{namespace}", path), _serve(config, path, decide, for_shoot=True))

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if config.ready():
            return web.Response(text="ok")
        return web.Response(
            status=503, text="no valid serving certificate loaded, or the deletion guard's caches not synced yet"
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=config.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)

    async def close_sources(_: web.Application) -> None:
        await config.machine_sets.close()
        if config.native is not None:
            await config.native.close()

    app.on_cleanup.append(close_sources)
    return app
