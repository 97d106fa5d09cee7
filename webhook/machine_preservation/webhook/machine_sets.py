"""What the deletion guard reads on demand: a Machine's MachineSet with the namespace's machines, MachineSets
and MachineDeployments (budget and replica counts), the Shoot's Gardener `Cluster` resource, and (only when
serving as Gardener's extension) the namespace's `Extension` of type machine-preservation: whether the extension
is still enabled for the Shoot in this seed.

A guarded Machine DELETE is rare, so the webhook reads on demand with kubernetes.aio (in the server's event
loop) instead of keeping a cache.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.config.config_exception import ConfigException
from pydantic import ValidationError

from machine_preservation.core import extension as gardener_extension
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.deletion import EXTENSION_NAME, MachineSetView, ShootExtension
from machine_preservation.core.gardener import CLUSTER_API_GROUP, CLUSTER_API_VERSION, CLUSTER_PLURAL
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.kube.api_errors import NO_ANSWER, ApiError, classify
from machine_preservation.kube.clients import new_api_client

# The Machine webhook's timeoutSeconds is 10; leave room to answer.
READ_TIMEOUT_SECONDS = 3.0
# The API server answers 429 with a Retry-After of about a second while a resource's watch cache
# (re)initializes, e.g. for the first list after a CRD is installed or the API server restarted: worth a short
# wait, a few times, within the webhook's time.
BUSY_ATTEMPTS = 3
BUSY_WAIT_MAX_SECONDS = 1.0


class SourceUnavailable(Exception):
    """The objects could not be read; the message says why."""


class MachineSetSource(Protocol):
    async def read(self, *, namespace: str, name: str) -> MachineSetView | None:
        """The MachineSet `name` with the namespace's machines, MachineSets and MachineDeployments; None when it
        does not exist."""
        ...

    async def read_cluster(self, *, namespace: str) -> dict[str, Any] | None:
        """Gardener's `Cluster` named after the control namespace, as served; None when there is none (not
        Gardener)."""
        ...

    async def read_extension(self, *, namespace: str) -> ShootExtension | None:
        """The namespace's Extension of type machine-preservation (absent: `present` False); None when not
        serving as Gardener's extension, or the API server has no Extension kind (not Gardener)."""
        ...

    async def close(self) -> None: ...


def view_from_lists(
    *,
    name: str,
    machine_sets: list[dict[str, Any]],
    machines: list[dict[str, Any]],
    machine_deployments: list[dict[str, Any]] | None = None,
) -> MachineSetView | None:
    """Build the view from raw list items; None when the named MachineSet is not among them."""
    try:
        sets = [MachineSet.model_validate(item) for item in machine_sets]
        members = [Machine.model_validate(item) for item in machines]
        deployments = [MachineDeployment.model_validate(item) for item in machine_deployments or []]
    except ValidationError as error:
        raise SourceUnavailable(f"unexpected object from the API server: {error.errors()[0]['msg']}") from None
    own = next((s for s in sets if s.metadata.name == name), None)
    if own is None:
        return None
    return MachineSetView(machine_set=own, machines=members, siblings=sets, machine_deployments=deployments)


async def _patiently(call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()`, again after the API server's Retry-After (at most a second) while it answers 429."""
    for attempt in range(1, BUSY_ATTEMPTS + 1):
        try:
            return await call()
        except ApiException as error:
            if classify(error.status) is not ApiError.TOO_MANY_REQUESTS or attempt == BUSY_ATTEMPTS:
                raise
            await asyncio.sleep(_retry_after(error))
    raise AssertionError("unreachable")


def _retry_after(error: ApiException) -> float:
    try:
        seconds = float((error.headers or {}).get("Retry-After", BUSY_WAIT_MAX_SECONDS))
    except (TypeError, ValueError):
        seconds = BUSY_WAIT_MAX_SECONDS
    return min(max(seconds, 0.0), BUSY_WAIT_MAX_SECONDS)


def _items(listing: object) -> list[dict[str, Any]]:
    items = listing.get("items") if isinstance(listing, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _object_missing(error: ApiException) -> bool:
    """A 404 about the object itself (a Status naming its kind), not about the resource: the API server answers a
    path of a kind it does not serve (no CRD) with a bare "404 page not found"."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        return False
    details = status.get("details") if isinstance(status, dict) else None
    return (
        isinstance(details, dict)
        and details.get("kind") == gardener_extension.PLURAL
        and details.get("group") == gardener_extension.API_GROUP
    )


class KubernetesMachineSets:
    """MachineSetSource backed by the API server (kubeconfig file, in-cluster config, or the default).

    `gardener_extension`: serving as Gardener's extension (one installation per seed), where a shoot namespace
    without our Extension has the extension disabled. Off, `read_extension` reads nothing and answers None: a
    seed may well have Gardener's Extension kind without this installation being the extension (a standalone
    installation per shoot namespace), and there the guard must stay as it is."""

    def __init__(self, *, kubeconfig: Path | None = None, gardener_extension: bool = False) -> None:
        self._kubeconfig = kubeconfig
        self._gardener_extension = gardener_extension
        self._api_client: client.ApiClient | None = None
        self._lock = asyncio.Lock()

    async def _api(self) -> client.CustomObjectsApi:
        async with self._lock:
            if self._api_client is None:
                self._api_client = await new_api_client(kubeconfig=self._kubeconfig)
            return client.CustomObjectsApi(self._api_client)

    async def read(self, *, namespace: str, name: str) -> MachineSetView | None:
        def listing(plural: str) -> Any:
            return _patiently(
                lambda: api.list_namespaced_custom_object(
                    v.MACHINE_API_GROUP, v.MACHINE_API_VERSION, namespace, plural, _request_timeout=READ_TIMEOUT_SECONDS
                )
            )

        try:
            api = await self._api()
            sets, machines, deployments = await asyncio.gather(
                listing("machinesets"), listing("machines"), listing("machinedeployments")
            )
        except ApiException as error:
            raise SourceUnavailable(f"reading MachineSets in {namespace!r}: {error.status} {error.reason}") from None
        except (ConfigException, *NO_ANSWER) as error:
            raise SourceUnavailable(f"reading MachineSets in {namespace!r}: {error}") from None
        return view_from_lists(
            name=name,
            machine_sets=_items(sets),
            machines=_items(machines),
            machine_deployments=_items(deployments),
        )

    async def read_cluster(self, *, namespace: str) -> dict[str, Any] | None:
        try:
            api = await self._api()
            cluster = await _patiently(
                lambda: api.get_cluster_custom_object(
                    CLUSTER_API_GROUP,
                    CLUSTER_API_VERSION,
                    CLUSTER_PLURAL,
                    namespace,
                    _request_timeout=READ_TIMEOUT_SECONDS,
                )
            )
        except ApiException as error:
            # No Cluster resource (or not even its CRD): not a Gardener seed.
            if classify(error.status) is ApiError.NOT_FOUND:
                return None
            raise SourceUnavailable(f"reading the Cluster {namespace!r}: {error.status} {error.reason}") from None
        except (ConfigException, *NO_ANSWER) as error:
            raise SourceUnavailable(f"reading the Cluster {namespace!r}: {error}") from None
        return cluster if isinstance(cluster, dict) else None

    async def read_extension(self, *, namespace: str) -> ShootExtension | None:
        if not self._gardener_extension:
            return None
        shown = f"the Extension {namespace}/{EXTENSION_NAME}"
        try:
            api = await self._api()
            extension = await _patiently(
                lambda: api.get_namespaced_custom_object(
                    gardener_extension.API_GROUP,
                    gardener_extension.API_VERSION.split("/")[1],
                    namespace,
                    gardener_extension.PLURAL,
                    EXTENSION_NAME,
                    _request_timeout=READ_TIMEOUT_SECONDS,
                )
            )
        except ApiException as error:
            # No such Extension: disabled; no Extension kind at all: not Gardener.
            if classify(error.status) is ApiError.NOT_FOUND:
                return ShootExtension(present=False) if _object_missing(error) else None
            raise SourceUnavailable(f"reading {shown}: {error.status} {error.reason}") from None
        except (ConfigException, *NO_ANSWER) as error:
            raise SourceUnavailable(f"reading {shown}: {error}") from None
        if not isinstance(extension, dict):
            raise SourceUnavailable(f"reading {shown}: unexpected answer from the API server")
        try:
            return ShootExtension.read(extension)
        except ValidationError as error:
            raise SourceUnavailable(f"unexpected object from the API server: {error.errors()[0]['msg']}") from None

    async def close(self) -> None:
        if self._api_client is not None:
            await self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
