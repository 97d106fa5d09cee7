"""The control cluster's CRDs, read once for every user in the process: they are the cluster's, the same for every
namespace, so the controller's 200 shoots and the webhook's 200 namespaces share one read per period."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from kubernetes.aio import client

from machine_preservation.kube.api_errors import read_object

T = TypeVar("T")


async def read_crd(api_client: client.ApiClient, name: str, *, seconds: float | None = None) -> Mapping[str, Any]:
    """A CRD as JSON; raises its meaning (`NotFound`: not installed), as `read_object` does."""
    read = client.ApiextensionsV1Api(api_client).read_custom_resource_definition_without_preload_content
    return await read_object(read, name, seconds=seconds)


class SharedRead(Generic[T]):
    """What `read` returns, read again only once it is `max_age` old (or as old as `fresh_for` says of it): one read
    at a time, the callers meanwhile wait for it and share it. A read that raises keeps nothing; the next caller
    reads again."""

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        fresh_for: Callable[[T], float] | None = None,
    ) -> None:
        self._read, self._clock = read, clock
        self._fresh_for = fresh_for or (lambda _: max_age)
        self._kept: tuple[T, float] | None = None  # the value and when it was read
        self._lock = asyncio.Lock()

    async def get(self) -> T:
        async with self._lock:
            kept = self._kept
            if kept is None or self._clock() - kept[1] >= self._fresh_for(kept[0]):
                kept = self._kept = (await self._read(), self._clock())
            return kept[0]
