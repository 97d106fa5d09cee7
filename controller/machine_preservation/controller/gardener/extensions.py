"""Gardener's `Extension` contract for our type: one reconcile per shoot namespace, as Gardener's extension library
runs it (`extensions/pkg/controller/extension`), the work itself in `actuator.ExtensionActuator`.

The core (`core.gardener.extension`) decides the operation and shapes the status; this module does the contract's
writes in its order: the operation annotation off (reconcile: before the work), the finalizer on, `lastOperation`
Processing, the actuator's operation, then Succeeded (and the finalizer or the annotation off where the operation
says so) or Error. Every failure of an operation, whatever its type, ends in `lastOperation` Error with `lastError`
(a `providerConfig` that does not decode with `ERR_CONFIGURATION_PROBLEM`), so no Extension is left in Processing;
the failure is raised again for the queue's backoff. A Delete of a shoot Gardener force-deletes runs the actuator's
`force_delete`, which waits for nothing in the shoot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.gardener.actuator import EXTENSION_VERSION, ExtensionActuator, patch_status
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener.cluster import ClusterView
from machine_preservation.kube.api_errors import Failed, NotFound, call, read_json
from machine_preservation.kube.clients import MERGE_PATCH
from machine_preservation.kube.informer import Informer

logger = logging.getLogger(__name__)

# A `lastError` that could not be written whole (too large for the API server) is written again this short.
_SHORT_ERROR = 1024


@dataclass
class ExtensionReconciler:
    seed: client.ApiClient
    extensions: Informer[contract.Extension]
    clusters: Informer[ClusterView]
    clock: Callable[[], dt.datetime]
    actuator: ExtensionActuator

    async def reconcile(self, namespace: str) -> dt.timedelta | None:
        extension = self.extensions.get(f"{namespace}/{contract.EXTENSION_TYPE}")
        if extension is None or not extension.ours:  # another type or class under our name is not ours to touch
            await self.actuator.forget(namespace)
            return None
        facts = self.clusters.get(namespace)
        action = contract.decide(extension, shoot_failed=facts is not None and facts.failed)
        if action is None:
            await self.actuator.keep(extension, facts)
            return None
        if action.remove_annotation_first:
            extension = await self._patch(extension, contract.remove_operation_annotation_patch())
        if action.add_finalizer and (finalizers := contract.finalizers_patch(extension, add=True)) is not None:
            extension = await self._patch(extension, finalizers)
        await self.patch_status(
            extension, contract.processing(action.type, self.clock(), action.processing_description)
        )
        try:
            problem = await self._operate(action.type, extension, facts)
        except Exception as failure:  # the one place an operation's failure becomes the contract's Error
            await self._report_error(extension, action, _cause(failure))
            raise
        if problem is not None:
            await self._report_error(extension, action, problem, codes=(contract.ErrorCode.CONFIGURATION_PROBLEM,))
            return None
        await self.patch_status(
            extension,
            contract.succeeded(
                action.type,
                self.clock(),
                generation=extension.metadata.generation,
                description=action.succeeded_description,
            ),
        )
        if action.remove_finalizer or action.remove_all_finalizers:
            await self._remove_finalizers(extension, everyone=action.remove_all_finalizers)
        if action.remove_annotation_after:
            await self._patch(extension, contract.remove_operation_annotation_patch())
        return None

    async def _operate(
        self, kind: contract.OperationType, extension: contract.Extension, facts: ClusterView | None
    ) -> str | None:
        """The actuator's operation; what keeps the object from being served fully (for `lastError`), or None."""
        if kind is contract.OperationType.DELETE:
            if facts is not None and facts.force_deletion:
                await self.actuator.force_delete(extension)
            else:
                await self.actuator.delete(extension, facts)
            return None
        if kind is contract.OperationType.MIGRATE:
            await self.actuator.migrate(extension)
            return None
        if kind is contract.OperationType.RESTORE:
            return await self.actuator.restore(extension, facts)
        return await self.actuator.reconcile(extension, facts)

    async def refresh_health(self, namespace: str) -> dt.timedelta | None:
        """Report a change of the shoot's state (served, or why not) on its Extension; no operation is started."""
        extension = self.extensions.get(f"{namespace}/{contract.EXTENSION_TYPE}")
        if extension is not None and extension.ours and not extension.deleting and not contract.is_migrated(extension):
            await self.actuator.report_health(extension, self.clusters.get(namespace))
        return None

    async def _report_error(
        self,
        extension: contract.Extension,
        action: contract.Action,
        cause: str,
        *,
        codes: tuple[contract.ErrorCode, ...] = (),
    ) -> None:
        description = contract.error_text(action.error_description, cause)
        try:
            await call(self.patch_status(extension, self._error(extension, action, description, codes)))
        except Failed:
            if len(description) <= _SHORT_ERROR:
                raise
            # Too large for the object (a cause quoting much input): the first part is still an Error.
            await self.patch_status(extension, self._error(extension, action, description[:_SHORT_ERROR], codes))

    def _error(
        self,
        extension: contract.Extension,
        action: contract.Action,
        description: str,
        codes: tuple[contract.ErrorCode, ...],
    ) -> dict[str, Any]:
        return contract.error(
            action.type, self.clock(), generation=extension.metadata.generation, description=description, codes=codes
        )

    # --- the Extension object ---------------------------------------------------------------------------

    async def _patch(self, extension: contract.Extension, body: Mapping[str, Any]) -> contract.Extension:
        """Merge-patch the object; the object as it is now (for a later compare-and-swap on its finalizers)."""
        patched = await client.CustomObjectsApi(self.seed).patch_namespaced_custom_object(
            contract.API_GROUP,
            EXTENSION_VERSION,
            extension.metadata.namespace,
            contract.PLURAL,
            extension.metadata.name,
            dict(body),
            _content_type=MERGE_PATCH,
        )
        return contract.Extension.model_validate(patched)

    async def patch_status(self, extension: contract.Extension, status: Mapping[str, Any]) -> None:
        await patch_status(self.seed, extension, status)

    async def _remove_finalizers(self, extension: contract.Extension, *, everyone: bool) -> None:
        """Take our finalizer (or, after a migration, every finalizer) off the object as it is now."""
        custom = client.CustomObjectsApi(self.seed)
        response = await custom.get_namespaced_custom_object_without_preload_content(
            contract.API_GROUP,
            EXTENSION_VERSION,
            extension.metadata.namespace,
            contract.PLURAL,
            extension.metadata.name,
        )
        raw = await read_json(response)
        if raw is None:
            return
        current = contract.Extension.model_validate(raw)
        patch = contract.finalizers_patch(current, remove=not everyone, clear=everyone)
        if patch is None:
            return
        with contextlib.suppress(NotFound):
            await call(self._patch(current, patch))


def _cause(failure: Exception) -> str:
    """A failure in words for `lastError`: an API answer by its status, anything else by its message (or type)."""
    if isinstance(failure, ApiException):
        return f"{failure.status} {failure.reason}"
    return str(failure) or type(failure).__name__
