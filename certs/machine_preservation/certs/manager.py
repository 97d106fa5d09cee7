"""The I/O shell around the rotation decision (kubernetes.aio): Secret, serving Secret, cert dir, caBundle
injection, and webhook configurations kept entirely (as a manifest describes them, see `managed`; the chart creates
them, so the certs manager never needs the right to create webhook configurations).

Any number of managers may run at once (replicas, a rolling update). There is no leader: each pass reads the
webhook configurations and the serving Secret, then the Secret, decides, and writes with optimistic
concurrency (every object is written with the resourceVersion read). When two managers rotate at once one
write wins, the other gets 409 and its next pass adopts the winner's certificates. Reading the dependent
objects *before* the Secret makes a lagging manager's write fail with 409 instead of replacing a newer
caBundle or serving pair with an older one.

The Secret holds the CA's private key, so only the certs manager's identity may read it. The webhook gets
its serving certificate from one of two places, both polled by the server, which reloads on change:
- the serving Secret: only `tls.crt` and `tls.key`, mounted into the webhook pods by the kubelet (the
  chart's way: the identity serving admission requests holds no key material beyond its own pair);
- a cert dir: `tls.crt`, `tls.key` and `ca.crt` (the trust bundle), each replaced atomically by rename
  (for a manager running beside the webhook with a shared directory).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.certs import bundle, managed
from machine_preservation.certs.rotation import (
    CA_BUNDLE_KEY,
    TLS_CERT_KEY,
    TLS_KEY_KEY,
    CertificateState,
    RotationPolicy,
    ServingIdentity,
    StoredCertificates,
    apply,
    decide,
    summary,
)
from machine_preservation.core.clock import Clock, system_clock
from machine_preservation.core.gardener import shoot_resources
from machine_preservation.kube import api_errors
from machine_preservation.kube.api_errors import RETRYABLE, Failed, Invalid, NoAnswer, NotFound, api_call, call

logger = logging.getLogger(__name__)

FIELD_MANAGER = "machine-preservation-certs"
# File names in the cert dir; the trust bundle is `ca.crt` there, as in Secrets of type kubernetes.io/tls.
CERT_DIR_FILES = {TLS_CERT_KEY: TLS_CERT_KEY, TLS_KEY_KEY: TLS_KEY_KEY, CA_BUNDLE_KEY: "ca.crt"}
# What the serving Secret holds: the webhook's own pair, nothing of the CA.
SERVING_SECRET_KEYS = (TLS_CERT_KEY, TLS_KEY_KEY)


class WebhookKind(StrEnum):
    VALIDATING = "validating"
    MUTATING = "mutating"


@dataclass(frozen=True)
class WebhookConfigurationRef:
    kind: WebhookKind
    name: str
    # The cluster the configuration lives in: None is the cluster holding the Secret.
    kubeconfig: Path | None = None
    # A manifest without caBundle, re-read every pass: the configuration (created by the chart) is kept as it
    # describes (owned entirely); None: only the caBundle is injected into a configuration someone else keeps.
    template: Path | None = None

    def __str__(self) -> str:
        where = f" (cluster of {self.kubeconfig})" if self.kubeconfig else ""
        return f"{self.kind.value}/{self.name}{where}"

    @classmethod
    def parse(cls, text: str) -> WebhookConfigurationRef:
        """`validating/NAME` or `mutating/NAME`, optionally `@/path/to/kubeconfig` for another cluster."""
        reference, _, kubeconfig = text.partition("@")
        kind, _, name = reference.partition("/")
        if kind not in {k.value for k in WebhookKind} or not name:
            raise ValueError(f"expected validating/NAME or mutating/NAME[@KUBECONFIG], got {text!r}")
        return cls(kind=WebhookKind(kind), name=name, kubeconfig=Path(kubeconfig) if kubeconfig else None)

    @classmethod
    def parse_managed(cls, text: str) -> WebhookConfigurationRef:
        """`validating/NAME=MANIFEST` or `mutating/NAME=MANIFEST`, optionally `validating/NAME@KUBECONFIG=MANIFEST`
        for a configuration in another cluster."""
        reference, _, template = text.partition("=")
        reference, at, kubeconfig = reference.partition("@")
        kind, _, name = reference.partition("/")
        if kind not in {k.value for k in WebhookKind} or not name or not template or (at and not kubeconfig):
            raise ValueError(
                f"expected validating/NAME[@KUBECONFIG]=FILE or mutating/NAME[@KUBECONFIG]=FILE, got {text!r}"
            )
        return cls(
            kind=WebhookKind(kind),
            name=name,
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            template=Path(template),
        )


@dataclass(frozen=True)
class ManagerSettings:
    secret_namespace: str
    secret_name: str
    cert_dir: Path | None
    identity: ServingIdentity
    policy: RotationPolicy
    configurations: tuple[WebhookConfigurationRef, ...]
    ca_common_name: str
    resync: dt.timedelta = dt.timedelta(seconds=60)
    # (namespace, name) of the Secret that receives only the serving pair; None: no such Secret.
    serving_secret: tuple[str, str] | None = None
    # In a Gardener seed: the name of the ManagedResource that carries the CA to each shoot's API server (its node
    # webhooks); the serving certificate moves to a new CA only once every shoot has applied it. None: no shoots.
    shoot_resource: str | None = None

    def __post_init__(self) -> None:
        targets = [(ref.kind, ref.name, ref.kubeconfig) for ref in self.configurations]
        if len(set(targets)) != len(targets):
            raise ValueError("a webhook configuration is named twice (inject its caBundle or own it, not both)")
        if self.cert_dir is None and self.serving_secret is None:
            raise ValueError("the serving certificate needs a destination: a cert dir or a serving Secret")
        if self.serving_secret == (self.secret_namespace, self.secret_name):
            raise ValueError("the serving Secret must not be the Secret holding the CA key")


class Conflict(RuntimeError):
    """Someone else wrote first; the next pass starts from what they wrote."""


@dataclass(frozen=True)
class PassResult:
    state: CertificateState
    next_check: dt.datetime
    rotated: tuple[str, ...]  # the decision's reasons when this pass changed the Secret
    injected: tuple[str, ...]  # configurations this pass wrote (caBundle patched, or an owned one updated)
    published: bool = False  # this pass wrote a new pair into the serving Secret


def write_cert_dir(cert_dir: Path, data: Mapping[str, bytes]) -> bool:
    """Put the Secret's files into `cert_dir`, each atomically; True if any content changed.

    The key is written before the certificate: a reader that catches the moment in between sees a
    pair that does not match and keeps its previous certificate until the next poll.
    """
    cert_dir.mkdir(parents=True, exist_ok=True)
    changed = False
    for key in (TLS_KEY_KEY, TLS_CERT_KEY, CA_BUNDLE_KEY):
        target = cert_dir / CERT_DIR_FILES[key]
        content = data[key]
        with contextlib.suppress(FileNotFoundError):
            if target.read_bytes() == content:
                continue
        descriptor, temporary = tempfile.mkstemp(dir=cert_dir, prefix=f".{target.name}.")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o600 if key == TLS_KEY_KEY else 0o644)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        changed = True
    return changed


class CertificateManager:
    def __init__(
        self,
        *,
        settings: ManagerSettings,
        api_client: client.ApiClient,
        remote_clients: Mapping[Path, client.ApiClient],
        clock: Clock = system_clock,
    ) -> None:
        self.settings = settings
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._registration = {
            path: client.AdmissionregistrationV1Api(remote) for path, remote in remote_clients.items()
        }
        self._local_registration = client.AdmissionregistrationV1Api(api_client)
        self._clock = clock
        # The last manifest that could be read and checked, per owned configuration.
        self._templates: dict[WebhookConfigurationRef, dict[str, Any]] = {}

    # --- webhook configurations -----------------------------------------------------------------

    def _api_for(self, ref: WebhookConfigurationRef) -> client.AdmissionregistrationV1Api:
        return self._local_registration if ref.kubeconfig is None else self._registration[ref.kubeconfig]

    async def _read_configuration(self, ref: WebhookConfigurationRef) -> dict[str, Any] | None:
        """The configuration, or None when it cannot be read now (or is absent).

        An unreadable configuration (absent, forbidden, its cluster unreachable) only holds back the move of
        the serving certificate to a new CA; the Secret, the cert dir and the other configurations are still
        kept current, so one unreachable remote cluster cannot let the local certificate expire.
        """
        api = self._api_for(ref)
        model: client.V1ValidatingWebhookConfiguration | client.V1MutatingWebhookConfiguration
        try:
            with api_call():
                if ref.kind is WebhookKind.VALIDATING:
                    model = await api.read_validating_webhook_configuration(ref.name)
                else:
                    model = await api.read_mutating_webhook_configuration(ref.name)
        except Failed as error:
            logger.warning("cannot read %s; not injecting there this pass: %s %s", ref, error.status, error.reason)
            return None
        except NoAnswer as error:
            logger.warning("cannot reach the cluster of %s; not injecting there this pass: %s", ref, error)
            return None
        return model.model_dump(by_alias=True, exclude_none=True, mode="json")

    async def _patch_configuration(self, ref: WebhookConfigurationRef, patch: list[dict[str, Any]]) -> None:
        api = self._api_for(ref)
        try:
            with api_call():
                if ref.kind is WebhookKind.VALIDATING:
                    await api.patch_validating_webhook_configuration(ref.name, patch, field_manager=FIELD_MANAGER)
                else:
                    await api.patch_mutating_webhook_configuration(ref.name, patch, field_manager=FIELD_MANAGER)
        except (api_errors.Conflict, Invalid) as error:
            # changed since read, or a `test` failed (webhooks reordered): both mean "read again"
            raise Conflict(f"{ref} changed meanwhile") from error

    def _template(self, ref: WebhookConfigurationRef) -> dict[str, Any] | None:
        """The manifest of an owned configuration as the file holds it now; when the file cannot be read or
        checked, the last good one (a half-updated ConfigMap volume never removes webhooks)."""
        assert ref.template is not None
        try:
            text = ref.template.read_text()
            self._templates[ref] = managed.load_template(text, kind=ref.kind.value, name=ref.name)
        except (OSError, managed.TemplateProblem) as problem:
            keeping = "keeping the last good one" if ref in self._templates else "not writing it this pass"
            logger.warning("manifest %s of %s unusable, %s: %s", ref.template, ref, keeping, problem)
        return self._templates.get(ref)

    async def _reconcile_owned(
        self,
        ref: WebhookConfigurationRef,
        live: dict[str, Any],
        *,
        bundle_pem: bytes,
    ) -> bool:
        """Bring an owned configuration to its manifest; True if it wrote. Without a usable manifest, only the
        caBundle of the live object is kept current."""
        template = self._template(ref)
        if template is None:
            patch = bundle.ca_bundle_patch(live, bundle_pem=bundle_pem)
            if patch:
                await self._patch_configuration(ref, patch)
            return bool(patch)
        step = managed.plan(live, managed.desired(template, bundle_pem=bundle_pem))
        if step.patch:
            await self._patch_configuration(ref, list(step.patch))
            logger.info("updated %s (%s)", ref, ", ".join(step.reasons))
            return True
        return False

    # --- the Secret -----------------------------------------------------------------------------

    async def _read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str | None]:
        """A Secret's data and resourceVersion; ({}, None) when it does not exist."""
        try:
            secret = await call(self._core.read_namespaced_secret(name, namespace))
        except NotFound:
            return {}, None
        data = {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}
        return data, secret.metadata.resource_version if secret.metadata else None

    async def _write_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], *, resource_version: str | None
    ) -> None:
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        try:
            with api_call():
                if resource_version is None:
                    secret = client.V1Secret(
                        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": FIELD_MANAGER}),
                        type="Opaque",
                        data=encoded,
                    )
                    await self._core.create_namespaced_secret(namespace, secret, field_manager=FIELD_MANAGER)
                else:
                    # Re-stating the resourceVersion read makes the patch conditional (409 if it changed).
                    await self._core.patch_namespaced_secret(
                        name,
                        namespace,
                        [
                            {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
                            {"op": "add", "path": "/data", "value": encoded},
                        ],
                        field_manager=FIELD_MANAGER,
                    )
        except api_errors.Conflict as error:
            raise Conflict(f"Secret {namespace}/{name} changed meanwhile") from error

    async def _shoots_pending(self, ca_bundle: bytes) -> tuple[str, ...]:
        """The shoot namespaces whose ManagedResource has not been applied with `ca_bundle` (as stored): listed by
        name across namespaces, the only way the chart's RBAC lets it be read."""
        name = self.settings.shoot_resource
        if name is None:
            return ()
        try:
            listed = await call(
                self._custom.list_cluster_custom_object(
                    "resources.gardener.cloud", "v1alpha1", "managedresources", field_selector=f"metadata.name={name}"
                )
            )
        except NotFound:  # no ManagedResource kind: no shoot to wait for
            return ()
        items = listed.get("items") if isinstance(listed, Mapping) else None
        pending = shoot_resources.bundle_pending(items or [], ca_bundle=ca_bundle)
        if pending:
            shown = ", ".join(pending[:5]) + (", ..." if len(pending) > 5 else "")
            logger.info("%d shoot(s) have not applied the current CA bundle yet: %s", len(pending), shown)
        return pending

    # --- one pass -------------------------------------------------------------------------------

    async def sync_once(self) -> PassResult:
        """Read, decide, write: raises `Conflict` when another writer got in between (just run again)."""
        settings = self.settings
        configurations = {ref: await self._read_configuration(ref) for ref in settings.configurations}
        serving = await self._read_secret(*settings.serving_secret) if settings.serving_secret else None
        data, resource_version = await self._read_secret(settings.secret_namespace, settings.secret_name)
        stored = StoredCertificates.from_secret_data(data)
        now = self._clock()
        injected = stored.ca is not None and all(
            configuration is not None and bundle.trusts(configuration, stored.ca.certificate)
            for configuration in configurations.values()
        )
        pending = await self._shoots_pending(data.get(CA_BUNDLE_KEY, b"")) if injected else ()
        decision = decide(
            stored=stored,
            policy=settings.policy,
            identity=settings.identity,
            now=now,
            injected=injected,
            shoots_pending=pending,
        )
        state = apply(
            stored=stored,
            decision=decision,
            policy=settings.policy,
            identity=settings.identity,
            now=now,
            ca_common_name=settings.ca_common_name,
        )
        stored_data = state.to_secret_data()
        if decision.changes:
            await self._write_secret(
                settings.secret_namespace, settings.secret_name, stored_data, resource_version=resource_version
            )
            logger.info("certificates rotated (%s): %s", "; ".join(decision.reasons), summary(state))
        if settings.cert_dir is not None and write_cert_dir(settings.cert_dir, stored_data):
            logger.info("cert dir %s updated", settings.cert_dir)
        published = serving is not None and await self._publish_serving(serving, stored_data)
        patched = await self._inject(configurations, bundle_pem=state.bundle_pem)
        if patched:
            logger.info("caBundle injected into %s", ", ".join(patched))
        # What we just wrote may make the next step due at once (e.g. the injection gate opened).
        next_check = now if (decision.changes or patched) else decision.next_check
        return PassResult(
            state=state,
            next_check=next_check,
            rotated=decision.reasons if decision.changes else (),
            injected=tuple(patched),
            published=published,
        )

    async def _publish_serving(
        self, serving: tuple[dict[str, bytes], str | None], stored_data: dict[str, bytes]
    ) -> bool:
        """Write the serving pair to the serving Secret (`serving`: its data and resourceVersion as read) where it
        differs; whether it was written."""
        target = self.settings.serving_secret
        pair = {key: stored_data[key] for key in SERVING_SECRET_KEYS}
        served, served_version = serving
        if target is None or served == pair:
            return False
        await self._write_secret(*target, pair, resource_version=served_version)
        logger.info("serving certificate published to Secret %s", "/".join(target))
        return True

    async def _inject(
        self, configurations: Mapping[WebhookConfigurationRef, dict[str, Any] | None], *, bundle_pem: bytes
    ) -> list[str]:
        """Bring each webhook configuration read this pass to the trust bundle (and an owned one to its manifest);
        the ones written."""
        patched = []
        for ref, configuration in configurations.items():
            if configuration is None:  # unreadable, or not created yet (by the chart): left alone this pass
                continue
            if ref.template is not None:
                if await self._reconcile_owned(ref, configuration, bundle_pem=bundle_pem):
                    patched.append(str(ref))
                continue
            patch = bundle.ca_bundle_patch(configuration, bundle_pem=bundle_pem)
            if patch:
                await self._patch_configuration(ref, patch)
                patched.append(str(ref))
        return patched

    async def run(self, *, stop: asyncio.Event, once: bool = False) -> None:
        """Pass after pass until `stop` is set (or, with `once`, until one pass succeeded): at the next
        decision time, and at least every `resync` so changes by other replicas are picked up."""
        failures = 0
        while not stop.is_set():
            try:
                result = await self.sync_once()
            except Conflict as conflict:
                logger.info("%s; syncing again", conflict)
                delay = 0.1
            except RETRYABLE as error:  # e.g. a kept-alive connection the API server closed: try again
                failures += 1
                delay = min(2.0**failures, self.settings.resync.total_seconds())
                logger.warning("certificate sync failed (attempt %d), retrying in %.0fs: %s", failures, delay, error)
            else:
                if once:
                    return
                failures = 0
                until_due = (result.next_check - self._clock()).total_seconds()
                delay = max(0.0, min(until_due, self.settings.resync.total_seconds()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
