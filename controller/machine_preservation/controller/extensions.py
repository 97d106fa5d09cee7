"""Gardener's `Extension` resources of type machine-preservation: the contract with gardenlet, and per shoot the
objects that make the shoot reachable and guarded.

One reconcile per shoot namespace. The core (`core.extension`) decides the operation and shapes the status; this
module does the writes, in the contract's order:
- Create, Reconcile, Restore: the operation annotation off (reconcile: before the work), the finalizer on,
  `lastOperation` Processing, then the shoot-access Secret and the ManagedResource with the shoot's RBAC and node
  webhooks (`core.shoot_resources`), the shoot's lifecycle started, Succeeded (or Error with `lastError`);
- Delete: the shoot's lifecycle stopped, the ManagedResource (the shoot's objects go with it) and the Secrets
  deleted, Succeeded, the finalizer off;
- Migrate: the lifecycle stopped, the ManagedResource kept in the shoot (`keepObjects`) and deleted here,
  Succeeded, the finalizer and the annotation off.
With nothing to do (a finished operation), the reconcile keeps what runs in line with the object: the shoot's
lifecycle runs unless the shoot is hibernated, the provisioned objects follow the CA bundle, and the
`ControlPlaneHealthy` condition says whether the shoot is served.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.controller.informer import Informer
from machine_preservation.controller.shoot_access import ShootAccessUnavailable
from machine_preservation.controller.shoots import ShootSupervisor
from machine_preservation.core import extension as contract
from machine_preservation.core import shoot_resources
from machine_preservation.core.admission.field_errors import aggregate
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import provider_config_errors
from machine_preservation.core.gardener import ShootFacts
from machine_preservation.core.webhook_configurations import shoot_path
from machine_preservation.kube.api_errors import ApiError, classify, read_json
from machine_preservation.kube.clients import MERGE_PATCH

logger = logging.getLogger(__name__)

EXTENSION_VERSION = contract.API_VERSION.rpartition("/")[2]


class CaBundleMissing(Exception):
    """The certs manager has not written the webhook CA yet."""


class ManagedResourceNotDeleted(Exception):
    """The shoot's gardener-resource-manager has not removed the ManagedResource in time."""


class ReleaseIncomplete(Exception):
    """The shoot's preservations did not all end yet; the message says why."""


@dataclass
class ExtensionReconciler:
    seed: client.ApiClient
    extensions: Informer[contract.Extension]
    clusters: Informer[ShootFacts]
    managed_resources: Informer[shoot_resources.ObjectsApplied]  # ours, in every shoot namespace
    supervisor: ShootSupervisor
    webhook_url: str
    ca_bundle: Callable[[], bytes | None]  # the CA the shoots' API servers verify the webhook with
    clock: Callable[[], dt.datetime]
    # The bounds a providerConfig is judged by, as the garden admission judges it.
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    # How long a Delete or Migrate waits for the shoot's GRM to let the ManagedResource go before it reports an
    # Error (and is retried).
    managed_resource_deletion_limit: float = 60.0
    # Per namespace, the digest of the objects last made current there: unchanged desired objects are not read
    # again on every reconcile (a restart reads each shoot's once).
    _provisioned: dict[str, str] = field(default_factory=dict)

    async def reconcile(self, namespace: str) -> dt.timedelta | None:
        extension = self.extensions.get(f"{namespace}/{contract.EXTENSION_TYPE}")
        if extension is None:
            await self.supervisor.stop(namespace)  # gone without our finalizer: nothing left to clean here
            return None
        facts = self.clusters.get(namespace)
        action = contract.decide(extension, shoot_failed=facts is not None and facts.failed)
        if action is None:
            await self._keep(extension, facts)
            return None
        kind = action.type
        if action.remove_annotation_first:
            extension = await self._patch(extension, contract.remove_operation_annotation_patch())
        if action.add_finalizer and (finalizers := contract.finalizers_patch(extension, add=True)) is not None:
            extension = await self._patch(extension, finalizers)
        await self._patch_status(extension, contract.processing(kind, self.clock(), action.processing_description))
        try:
            if kind is contract.OperationType.DELETE:
                await self._delete(extension, facts)
            elif kind is contract.OperationType.MIGRATE:
                await self._migrate(extension)
            else:
                problem = await self._provision(extension, facts)
                if problem is not None:
                    await self._patch_status(extension, self._error(extension, action, problem))
                    return None
        except (
            ApiException,
            ShootAccessUnavailable,
            CaBundleMissing,
            ReleaseIncomplete,
            ManagedResourceNotDeleted,
        ) as failure:
            cause = f"{failure.status} {failure.reason}" if isinstance(failure, ApiException) else str(failure)
            await self._patch_status(extension, self._error(extension, action, cause))
            raise
        await self._patch_status(
            extension,
            contract.succeeded(
                kind,
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

    def _error(self, extension: contract.Extension, action: contract.Action, cause: str) -> dict[str, Any]:
        return contract.error(
            action.type,
            self.clock(),
            generation=extension.metadata.generation,
            description=contract.error_text(action.error_description, cause),
        )

    # --- the operations ----------------------------------------------------------------------------------

    async def _provision(self, extension: contract.Extension, facts: ShootFacts | None) -> str | None:
        """Everything the shoot needs from us; the problem for `lastError` if the object cannot be served fully
        (the rest is provisioned anyway: a bad providerConfig must not take the node webhooks away)."""
        namespace = extension.metadata.namespace
        self._provisioned.pop(namespace, None)  # an operation looks at the objects again, whatever we remember
        await self._ensure_objects(namespace)
        await self._run_or_pause(namespace, facts)
        if extension.spec.provider_config is None:
            return None
        errors = provider_config_errors(
            shoot=facts.shoot if facts is not None else None,
            provider_config=extension.spec.provider_config,
            settings=self.admission,
        )
        return aggregate(errors) if errors else None

    async def _delete(self, extension: contract.Extension, facts: ShootFacts | None) -> None:
        """Disabled, or the shoot goes: end the shoot's preservations (taints, conditions, our CA annotations,
        records; kept Failed machines back to MCM), then remove what we provisioned. A shoot being deleted or
        hibernated loses every machine anyway and its API server may be gone: nothing to end there."""
        namespace = extension.metadata.namespace
        if facts is None or facts.lifecycle.deleted or facts.lifecycle.hibernated:
            await self.supervisor.stop(namespace)
        else:
            problem = await self.supervisor.release(namespace, kubeconfig_secret=facts.kubeconfig_secret)
            if problem is not None:
                raise ReleaseIncomplete(problem)
        await self._delete_objects(namespace)

    async def _migrate(self, extension: contract.Extension) -> None:
        namespace = extension.metadata.namespace
        await self.supervisor.stop(namespace)
        # The objects in the shoot stay for the destination seed's installation to take over.
        await self._patch_object(
            "resources.gardener.cloud",
            "v1alpha1",
            "managedresources",
            namespace,
            shoot_resources.MANAGED_RESOURCE,
            shoot_resources.keep_objects_patch(),
        )
        await self._delete_objects(namespace)

    async def _keep(self, extension: contract.Extension, facts: ShootFacts | None) -> None:
        """A finished operation: keep what runs and what is provisioned in line with the object."""
        last = extension.status.last_operation
        if extension.metadata.deletion_timestamp is not None or last is None:
            return
        if contract.is_migrated(extension):
            await self.supervisor.stop(extension.metadata.namespace)  # the shoot is served by another seed now
            return
        namespace = extension.metadata.namespace
        await self._ensure_objects(namespace)
        await self._run_or_pause(namespace, facts)
        await self._report_health(extension, facts)

    async def refresh_health(self, namespace: str) -> dt.timedelta | None:
        """Report a change of the shoot's state (served, or why not) on its Extension; no operation is started."""
        extension = self.extensions.get(f"{namespace}/{contract.EXTENSION_TYPE}")
        if extension is not None and not extension.deleting and not contract.is_migrated(extension):
            await self._report_health(extension, self.clusters.get(namespace))
        return None

    async def _report_health(self, extension: contract.Extension, facts: ShootFacts | None) -> None:
        """ControlPlaneHealthy: whether the shoot is served (core.shoot_resources.shoot_health)."""
        namespace = extension.metadata.namespace
        state = self.supervisor.state(namespace)
        health = shoot_resources.shoot_health(
            hibernated=facts is not None and facts.lifecycle.hibernated,
            running=state.running,
            native=state.native,
            problem=state.problem,
            objects=self.managed_resources.get(f"{namespace}/{shoot_resources.MANAGED_RESOURCE}"),
            slow=state.slow,
        )
        patch = contract.control_plane_healthy(
            extension,
            status=contract.ConditionStatus.TRUE if health.served else contract.ConditionStatus.FALSE,
            reason=health.reason,
            message=health.message,
            now=self.clock(),
        )
        if patch is not None:
            await self._patch_status(extension, patch)

    async def _run_or_pause(self, namespace: str, facts: ShootFacts | None) -> None:
        if facts is None or facts.lifecycle.hibernated or facts.lifecycle.deleted:
            # Hibernated or going: its API server is (about to be) down and MCM deletes every machine.
            await self.supervisor.stop(namespace)
            return
        self.supervisor.ensure_running(namespace, kubeconfig_secret=facts.kubeconfig_secret)

    # --- the per-shoot objects ----------------------------------------------------------------------------

    async def _ensure_objects(self, namespace: str) -> None:
        ca_bundle = self.ca_bundle()
        if ca_bundle is None:
            raise CaBundleMissing("the webhook CA is not there yet (the certs manager writes it)")
        access = shoot_resources.shoot_access_secret(namespace)
        # The shoot's node webhooks call a path naming the shoot: the one webhook serves every shoot of the seed.
        url = self.webhook_url.rstrip("/") + shoot_path(namespace)
        objects = shoot_resources.shoot_objects(ca_bundle=ca_bundle, url=url)
        secret, managed_resource = shoot_resources.managed_resource(namespace, objects)
        digest = hashlib.sha256(json.dumps([access, secret, managed_resource], sort_keys=True).encode()).hexdigest()
        if self._provisioned.get(namespace) == digest:
            return
        await self._ensure_secret(access, keep_data=True)
        await self._ensure_secret(secret, keep_data=False)
        await self._ensure_custom("resources.gardener.cloud", "v1alpha1", "managedresources", managed_resource)
        self._provisioned[namespace] = digest

    async def _delete_objects(self, namespace: str) -> None:
        """Delete the ManagedResource and wait until the shoot's GRM has let it go (it deletes the shoot's objects
        first, unless they are kept), then the Secrets."""
        self._provisioned.pop(namespace, None)
        custom, core = client.CustomObjectsApi(self.seed), client.CoreV1Api(self.seed)
        resource = (
            "resources.gardener.cloud",
            "v1alpha1",
            namespace,
            "managedresources",
            shoot_resources.MANAGED_RESOURCE,
        )
        await _absent(custom.delete_namespaced_custom_object(*resource))
        deadline = asyncio.get_running_loop().time() + self.managed_resource_deletion_limit
        while True:
            response = await custom.get_namespaced_custom_object_without_preload_content(*resource)
            await response.read()
            if classify(response.status) is ApiError.NOT_FOUND:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise ManagedResourceNotDeleted(
                    f"ManagedResource {namespace}/{shoot_resources.MANAGED_RESOURCE} is not deleted yet (is the "
                    "shoot's gardener-resource-manager running?)"
                )
            await asyncio.sleep(0.5)
        await _absent(core.delete_namespaced_secret(shoot_resources.MANAGED_RESOURCE_SECRET, namespace))
        await _absent(core.delete_namespaced_secret(shoot_resources.SHOOT_ACCESS_SECRET, namespace))

    async def _ensure_secret(self, desired: Mapping[str, Any], *, keep_data: bool) -> None:
        """The Secret as desired: its labels, annotations and data (unless `keep_data`: the token GRM writes)."""
        core = client.CoreV1Api(self.seed)
        await _ensure(
            desired,
            read=core.read_namespaced_secret_without_preload_content,
            # The client sends a plain JSON body as it is.
            create=lambda namespace, body: core.create_namespaced_secret(namespace, body),  # type: ignore[arg-type]
            patch=lambda name, namespace, body: core.patch_namespaced_secret(
                name, namespace, body, _content_type=MERGE_PATCH
            ),
            fields=() if keep_data else ("data",),
        )

    async def _ensure_custom(self, group: str, version: str, plural: str, desired: Mapping[str, Any]) -> None:
        """The custom object as desired: its labels, annotations and spec."""
        custom = client.CustomObjectsApi(self.seed)
        await _ensure(
            desired,
            read=lambda name, namespace: custom.get_namespaced_custom_object_without_preload_content(
                group, version, namespace, plural, name
            ),
            create=lambda namespace, body: custom.create_namespaced_custom_object(
                group, version, namespace, plural, body
            ),
            patch=lambda name, namespace, body: self._patch_object(group, version, plural, namespace, name, body),
            fields=("spec",),
        )

    async def _patch_object(
        self, group: str, version: str, plural: str, namespace: str, name: str, body: Mapping[str, Any]
    ) -> None:
        await _absent(
            client.CustomObjectsApi(self.seed).patch_namespaced_custom_object(
                group, version, namespace, plural, name, dict(body), _content_type=MERGE_PATCH
            )
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

    async def _patch_status(self, extension: contract.Extension, status: Mapping[str, Any]) -> None:
        await client.CustomObjectsApi(self.seed).patch_namespaced_custom_object_status(
            contract.API_GROUP,
            EXTENSION_VERSION,
            extension.metadata.namespace,
            contract.PLURAL,
            extension.metadata.name,
            dict(status),
            _content_type=MERGE_PATCH,
        )

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
        if patch is not None:
            await _absent(self._patch(current, patch))


async def _ensure(
    desired: Mapping[str, Any],
    *,
    read: Callable[[str, str], Awaitable[Any]],
    create: Callable[[str, dict[str, Any]], Awaitable[Any]],
    patch: Callable[[str, str, dict[str, Any]], Awaitable[Any]],
    fields: tuple[str, ...],
) -> None:
    """Create the object (`read`: a raw response for name, namespace), or merge-patch its labels, annotations and
    `fields` to what is desired; no write when nothing differs."""
    metadata = desired["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    current = await read_json(await read(name, namespace))
    if current is None:
        await create(namespace, dict(desired))
        return
    changes = _metadata_patch(current, desired)
    for key in fields:
        if (current.get(key) or {}) != (desired.get(key) or {}):
            changes[key] = desired.get(key) or {}
    if changes:
        await patch(name, namespace, changes)


def _metadata_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The labels and annotations `desired` sets that `current` lacks or has otherwise, as a merge patch."""
    patch: dict[str, Any] = {}
    for part in ("labels", "annotations"):
        want = (desired.get("metadata") or {}).get(part) or {}
        have = (current.get("metadata") or {}).get(part) or {}
        changed = {key: value for key, value in want.items() if have.get(key) != value}
        if changed:
            patch.setdefault("metadata", {})[part] = changed
    return patch


async def _absent(call: Any) -> None:
    """Await a write for which a missing object is as good as done."""
    try:
        await call
    except ApiException as error:
        if classify(error.status) is not ApiError.NOT_FOUND:
            raise


def decode_ca_bundle(secret: Mapping[str, Any], key: str) -> bytes | None:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if value else None
