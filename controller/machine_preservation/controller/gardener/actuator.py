"""The work behind Gardener's `Extension` of type machine-preservation, one method per operation, as Gardener's
extension library splits a controller into a contract reconciler (`extensions.ExtensionReconciler`) and an actuator:

- reconcile (Create, Reconcile) and restore: the shoot-access Secret and the ManagedResource with the shoot's RBAC
  and node webhooks (`core.gardener.shoot_resources`), the shoot's lifecycle started (paused while hibernated);
- delete: the shoot's preservations ended (taints, conditions, our CA annotations, records; kept Failed machines
  back to MCM), then the ManagedResource (the shoot's objects go with it, once the shoot's gardener-resource-manager
  has removed them) and the Secrets;
- force delete (the Shoot is annotated `confirmation.gardener.cloud/force-deletion`): nothing waits for the shoot or
  its gardener-resource-manager, which are usually broken then; see `force_delete`;
- migrate: the lifecycle stopped, the ManagedResource kept in the shoot (`keepObjects`) and deleted here;
- keep: with no operation to run, what runs and what is provisioned follow the object, and `ControlPlaneHealthy`
  says whether the shoot is served.
Every failure is raised; the reconciler turns it into `lastOperation` Error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio import client

from machine_preservation.controller.gardener.shoots import ShootSupervisor
from machine_preservation.controller.machinery.events import EventRecorder, Regarding
from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.field_errors import aggregate
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import provider_config_errors
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener import shoot_resources
from machine_preservation.core.gardener.cluster import ClusterView
from machine_preservation.core.webhook_configurations import shoot_path
from machine_preservation.kube.api_errors import ApiError, NotFound, call, classify, read_json
from machine_preservation.kube.clients import MERGE_PATCH
from machine_preservation.kube.informer import Informer

EXTENSION_VERSION = contract.API_VERSION.rpartition("/")[2]


class CaBundleMissing(Exception):
    """The certs manager has not written the webhook CA yet."""


class ManagedResourceNotDeleted(Exception):
    """The shoot's gardener-resource-manager has not removed the ManagedResource in time."""


class ReleaseIncomplete(Exception):
    """The shoot's preservations did not all end yet; the message says why."""


@dataclass
class ExtensionActuator:
    seed: client.ApiClient
    clusters: Informer[ClusterView]
    managed_resources: Informer[shoot_resources.ObjectsApplied]  # ours, in every shoot namespace
    supervisor: ShootSupervisor
    webhook_url: str
    ca_bundle: Callable[[], bytes | None]  # the CA the shoots' API servers verify the webhook with
    clock: Callable[[], dt.datetime]
    identity: str = "machine-preservation-extension"  # this process, as its Events name it
    # The bounds a providerConfig is judged by, as the garden admission judges it.
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    # How long a Delete or Migrate waits for the shoot's GRM to let the ManagedResource go before it reports an
    # Error (and is retried).
    managed_resource_deletion_limit: float = 60.0
    # Per namespace, the digest of the objects last made current there: unchanged desired objects are not read
    # again on every reconcile (a restart reads each shoot's once).
    _provisioned: dict[str, str] = field(default_factory=dict)

    async def reconcile(self, extension: contract.Extension, facts: ClusterView | None) -> str | None:
        """Everything the shoot needs from us; the problem for `lastError` if the object cannot be served fully
        (the rest is provisioned anyway: a bad providerConfig must not take the node webhooks away)."""
        namespace = extension.metadata.namespace
        self._provisioned.pop(namespace, None)  # an operation looks at the objects again, whatever we remember
        await self._ensure_objects(namespace, facts)
        await self._run_or_pause(namespace, facts)
        if extension.spec.provider_config is None:
            return None
        errors = provider_config_errors(
            shoot=facts.shoot_document if facts is not None else None,
            provider_config=extension.spec.provider_config,
            settings=self.admission,
        )
        return aggregate(errors) if errors else None

    async def delete(self, extension: contract.Extension, facts: ClusterView | None) -> None:
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

    async def force_delete(self, extension: contract.Extension) -> None:
        """The Shoot is force-deleted: its API server and its gardener-resource-manager are usually broken, so nothing
        here waits for either. The lifecycle stops (it writes nothing more); the ManagedResource is deleted with
        `keepObjects`, so its finalizer asks nothing of the shoot (gardenlet's force-deletion flow removes what is
        left, finalizers included); the Secrets go. In the seed nothing of ours holds a machine any more: the
        deletion guard lets MCM delete every machine of a shoot whose Extension is being deleted, preserved ones
        included, and Gardener deletes them all anyway."""
        namespace = extension.metadata.namespace
        await self.supervisor.stop(namespace)
        self._provisioned.pop(namespace, None)
        await self._keep_shoot_objects(namespace)
        custom = client.CustomObjectsApi(self.seed)
        data = await self._data_secrets(namespace)
        await _absent(custom.delete_namespaced_custom_object(*_managed_resource(namespace)))
        await self._delete_secrets(namespace, data)

    async def restore(self, extension: contract.Extension, facts: ClusterView | None) -> str | None:
        """The shoot moved to this seed: provisioned as on Create. The preservations continue from the records the
        Machines carry (the provider extension restores the Machines with their annotations), with their expiries."""
        return await self.reconcile(extension, facts)

    async def forget(self, namespace: str) -> None:
        """The Extension is gone (without our finalizer, or after a migration): nothing left to clean here."""
        self._provisioned.pop(namespace, None)
        await self.supervisor.stop(namespace)

    async def migrate(self, extension: contract.Extension) -> None:
        namespace = extension.metadata.namespace
        await self.supervisor.stop(namespace)
        # The objects in the shoot stay for the destination seed's installation to take over.
        await self._keep_shoot_objects(namespace)
        await self._delete_objects(namespace)

    async def keep(self, extension: contract.Extension, facts: ClusterView | None) -> None:
        """A finished operation: keep what runs and what is provisioned in line with the object."""
        last = extension.status.last_operation
        if extension.metadata.deletion_timestamp is not None or last is None:
            return
        if contract.is_migrated(extension):
            await self.supervisor.stop(extension.metadata.namespace)  # the shoot is served by another seed now
            return
        namespace = extension.metadata.namespace
        await self._ensure_objects(namespace, facts)
        await self._run_or_pause(namespace, facts)
        await self.report_health(extension, facts)

    async def report_health(self, extension: contract.Extension, facts: ClusterView | None) -> None:
        """ControlPlaneHealthy: whether the shoot is served (core.shoot_resources.shoot_health)."""
        namespace = extension.metadata.namespace
        state = self.supervisor.state(namespace)
        gap = shoot_resources.kubernetes_gap(facts.kubernetes_version) if facts is not None else ""
        if state.running:  # stopping the shoot's lifecycle drops its series
            self.supervisor.metrics.shoot_node_protection_missing.labels(namespace).set(1 if gap else 0)
        health = shoot_resources.shoot_health(
            hibernated=facts is not None and facts.lifecycle.hibernated,
            running=state.running,
            native=state.native,
            problem=state.problem,
            objects=self.managed_resources.get(f"{namespace}/{shoot_resources.MANAGED_RESOURCE}"),
            slow=state.slow,
            gap=gap,
        )
        patch = contract.control_plane_healthy(
            extension, status=health.status, reason=health.reason, message=health.message, now=self.clock()
        )
        if patch is not None:
            await patch_status(self.seed, extension, patch)
        if health.diagnosis:
            # Ours to tell, not a condition of the Shoot's: an Event on the Extension, counted while it lasts.
            if health.status is contract.ConditionStatus.FALSE:
                reason = "ShootKubernetesTooOld"  # the only diagnosis that comes with False
            elif state.slow and state.running:
                reason = "ShootAPIServerSlow"
            elif state.nodes_over_budget:
                reason = "ShootNodesOverBudget"
            else:
                reason = "ShootNotServed"
            await self.events(namespace).record(
                regarding=Regarding(kind="Extension", name=extension.metadata.name, uid=extension.metadata.uid),
                type=v.EventType.WARNING,
                reason=reason,
                message=health.diagnosis,
                action="Serve",
                now=self.clock(),
                key=reason,
            )

    def events(self, namespace: str) -> EventRecorder:
        return EventRecorder(control=self.seed, target=self.seed, machine_namespace=namespace, instance=self.identity)

    async def _run_or_pause(self, namespace: str, facts: ClusterView | None) -> None:
        if facts is None or facts.lifecycle.hibernated or facts.lifecycle.deleted:
            # Hibernated or going: its API server is (about to be) down and MCM deletes every machine.
            await self.supervisor.stop(namespace)
            return
        self.supervisor.ensure_running(namespace, kubeconfig_secret=facts.kubeconfig_secret)

    # --- the per-shoot objects ----------------------------------------------------------------------------

    async def _ensure_objects(self, namespace: str, facts: ClusterView | None) -> None:
        ca_bundle = self.ca_bundle()
        if ca_bundle is None:
            raise CaBundleMissing("the webhook CA is not there yet (the certs manager writes it)")
        access = shoot_resources.shoot_access_secret(namespace)
        # The shoot's node webhooks call a path naming the shoot: the one webhook serves every shoot of the seed.
        url = self.webhook_url.rstrip("/") + shoot_path(namespace)
        version = facts.kubernetes_version if facts is not None else ""
        objects = shoot_resources.shoot_objects(ca_bundle=ca_bundle, url=url, kubernetes_version=version)
        secret, managed_resource = shoot_resources.managed_resource(namespace, objects, ca_bundle=ca_bundle)
        digest = hashlib.sha256(json.dumps([access, secret, managed_resource], sort_keys=True).encode()).hexdigest()
        if self._provisioned.get(namespace) == digest:
            return
        await self._ensure_secret(access)
        await self._create_absent(secret)
        await self._ensure_custom("resources.gardener.cloud", "v1alpha1", "managedresources", managed_resource)
        self._provisioned[namespace] = digest

    async def _delete_objects(self, namespace: str) -> None:
        """Delete the ManagedResource and wait until the shoot's GRM has let it go (it deletes the shoot's objects
        first, unless they are kept), then the Secrets."""
        self._provisioned.pop(namespace, None)
        custom = client.CustomObjectsApi(self.seed)
        resource = _managed_resource(namespace)
        data = await self._data_secrets(namespace)
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
        await self._delete_secrets(namespace, data)

    async def _keep_shoot_objects(self, namespace: str) -> None:
        """Set `keepObjects` on the namespace's ManagedResource: deleting it then removes nothing in the shoot."""
        group, version, _, plural, name = _managed_resource(namespace)
        await self._patch_object(group, version, plural, namespace, name, shoot_resources.keep_objects_patch())

    async def _data_secrets(self, namespace: str) -> list[str]:
        """The data Secrets the namespace's ManagedResource refers to now (deleted with it: the seed's GRM would
        collect them too, but only where it runs its garbage collector)."""
        custom = client.CustomObjectsApi(self.seed)
        raw = await read_json(
            await custom.get_namespaced_custom_object_without_preload_content(*_managed_resource(namespace))
        )
        return shoot_resources.data_secrets(raw) if raw is not None else []

    async def _delete_secrets(self, namespace: str, data: list[str]) -> None:
        core = client.CoreV1Api(self.seed)
        for name in data:
            await _absent(core.delete_namespaced_secret(name, namespace))
        await _absent(core.delete_namespaced_secret(shoot_resources.SHOOT_ACCESS_SECRET, namespace))

    async def _ensure_secret(self, desired: Mapping[str, Any]) -> None:
        """The Secret as desired: its labels and annotations (its data is the token GRM writes)."""
        core = client.CoreV1Api(self.seed)
        await _ensure(
            desired,
            read=core.read_namespaced_secret_without_preload_content,
            # The client sends a plain JSON body as it is.
            create=lambda namespace, body: core.create_namespaced_secret(namespace, body),  # type: ignore[arg-type]
            patch=lambda name, namespace, body: core.patch_namespaced_secret(
                name, namespace, body, _content_type=MERGE_PATCH
            ),
            fields=(),
        )

    async def _create_absent(self, secret: Mapping[str, Any]) -> None:
        """An immutable data Secret: named after its whole content, so one that exists is as desired."""
        core = client.CoreV1Api(self.seed)
        metadata = secret["metadata"]
        if (
            await read_json(
                await core.read_namespaced_secret_without_preload_content(metadata["name"], metadata["namespace"])
            )
            is None
        ):
            await core.create_namespaced_secret(metadata["namespace"], dict(secret))  # type: ignore[arg-type]

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


def _managed_resource(namespace: str) -> tuple[str, str, str, str, str]:
    """The namespace's ManagedResource, as the custom objects API names it."""
    return ("resources.gardener.cloud", "v1alpha1", namespace, "managedresources", shoot_resources.MANAGED_RESOURCE)


async def patch_status(seed: client.ApiClient, extension: contract.Extension, status: Mapping[str, Any]) -> None:
    """Merge-patch the Extension's status subresource."""
    await client.CustomObjectsApi(seed).patch_namespaced_custom_object_status(
        contract.API_GROUP,
        EXTENSION_VERSION,
        extension.metadata.namespace,
        contract.PLURAL,
        extension.metadata.name,
        dict(status),
        _content_type=MERGE_PATCH,
    )


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


async def _absent(write: Awaitable[Any]) -> None:
    """Await a write for which a missing object is as good as done."""
    with contextlib.suppress(NotFound):
        await call(write)


def decode_ca_bundle(secret: Mapping[str, Any], key: str) -> bytes | None:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if value else None
