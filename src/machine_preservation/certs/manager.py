"""The I/O shell around the rotation decision (kubernetes.aio): Secret, cert dir, caBundle injection.

Every webhook replica runs one manager. There is no leader: each pass reads the webhook
configurations, then the Secret, decides, and writes with optimistic concurrency (the Secret and each
configuration are written with the resourceVersion read). When two replicas rotate at once one write
wins, the other gets 409 and its next pass adopts the winner's certificates. Reading the
configurations *before* the Secret makes a lagging replica's caBundle patch fail with 409 instead of
overwriting a newer bundle.

The cert dir contract with the webhook server: `tls.crt`, `tls.key` and `ca.crt` (the trust bundle)
are kept current, each replaced atomically by rename; the server polls their content and reloads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs import bundle
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

logger = logging.getLogger(__name__)

FIELD_MANAGER = "machine-preservation-certs"
# File names in the cert dir; the trust bundle is `ca.crt` there, as in Secrets of type kubernetes.io/tls.
CERT_DIR_FILES = {TLS_CERT_KEY: TLS_CERT_KEY, TLS_KEY_KEY: TLS_KEY_KEY, CA_BUNDLE_KEY: "ca.crt"}


class WebhookKind(StrEnum):
    VALIDATING = "validating"
    MUTATING = "mutating"


@dataclass(frozen=True)
class WebhookConfigurationRef:
    kind: WebhookKind
    name: str
    # The cluster the configuration lives in: None is the cluster holding the Secret.
    kubeconfig: Path | None = None

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


@dataclass(frozen=True)
class ManagerSettings:
    secret_namespace: str
    secret_name: str
    cert_dir: Path
    identity: ServingIdentity
    policy: RotationPolicy
    configurations: tuple[WebhookConfigurationRef, ...]
    ca_common_name: str
    resync: dt.timedelta = dt.timedelta(seconds=60)


class Conflict(RuntimeError):
    """Someone else wrote first; the next pass starts from what they wrote."""


@dataclass(frozen=True)
class PassResult:
    state: CertificateState
    next_check: dt.datetime
    rotated: tuple[str, ...]  # the decision's reasons when this pass changed the Secret
    injected: tuple[str, ...]  # configurations whose caBundle this pass patched


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
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.settings = settings
        self._core = client.CoreV1Api(api_client)
        self._registration = {
            path: client.AdmissionregistrationV1Api(remote) for path, remote in remote_clients.items()
        }
        self._local_registration = client.AdmissionregistrationV1Api(api_client)
        self._clock = clock

    # --- webhook configurations -----------------------------------------------------------------

    def _api_for(self, ref: WebhookConfigurationRef) -> client.AdmissionregistrationV1Api:
        return self._local_registration if ref.kubeconfig is None else self._registration[ref.kubeconfig]

    async def _read_configuration(self, ref: WebhookConfigurationRef) -> dict[str, Any] | None:
        """The configuration, or None when it cannot be read now.

        An unreadable configuration (absent, forbidden, its cluster unreachable) only holds back the move of
        the serving certificate to a new CA; the Secret, the cert dir and the other configurations are still
        kept current, so one unreachable remote cluster cannot let the local certificate expire.
        """
        api = self._api_for(ref)
        model: client.V1ValidatingWebhookConfiguration | client.V1MutatingWebhookConfiguration
        try:
            if ref.kind is WebhookKind.VALIDATING:
                model = await api.read_validating_webhook_configuration(ref.name)
            else:
                model = await api.read_mutating_webhook_configuration(ref.name)
        except ApiException as error:
            logger.warning("cannot read %s; not injecting there this pass: %s %s", ref, error.status, error.reason)
            return None
        except (OSError, TimeoutError) as error:
            logger.warning("cannot reach the cluster of %s; not injecting there this pass: %s", ref, error)
            return None
        return model.model_dump(by_alias=True, exclude_none=True, mode="json")

    async def _patch_configuration(self, ref: WebhookConfigurationRef, patch: list[dict[str, Any]]) -> None:
        api = self._api_for(ref)
        try:
            if ref.kind is WebhookKind.VALIDATING:
                await api.patch_validating_webhook_configuration(ref.name, patch, field_manager=FIELD_MANAGER)
            else:
                await api.patch_mutating_webhook_configuration(ref.name, patch, field_manager=FIELD_MANAGER)
        except ApiException as error:
            # 409: changed since read; 422: a `test` failed (webhooks reordered) — both mean "read again".
            if error.status in (409, 422):
                raise Conflict(f"{ref} changed meanwhile") from error
            raise

    # --- the Secret -----------------------------------------------------------------------------

    async def _read_secret(self) -> tuple[dict[str, bytes], str | None]:
        """The Secret's data and resourceVersion; ({}, None) when it does not exist."""
        try:
            secret = await self._core.read_namespaced_secret(self.settings.secret_name, self.settings.secret_namespace)
        except ApiException as error:
            if error.status == 404:
                return {}, None
            raise
        data = {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}
        return data, secret.metadata.resource_version if secret.metadata else None

    async def _write_secret(self, data: Mapping[str, bytes], *, resource_version: str | None) -> None:
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        try:
            if resource_version is None:
                secret = client.V1Secret(
                    metadata=client.V1ObjectMeta(
                        name=self.settings.secret_name, labels={"app.kubernetes.io/managed-by": FIELD_MANAGER}
                    ),
                    type="Opaque",
                    data=encoded,
                )
                await self._core.create_namespaced_secret(
                    self.settings.secret_namespace, secret, field_manager=FIELD_MANAGER
                )
            else:
                # Re-stating the resourceVersion read makes the patch conditional (409 if it changed).
                await self._core.patch_namespaced_secret(
                    self.settings.secret_name,
                    self.settings.secret_namespace,
                    [
                        {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
                        {"op": "add", "path": "/data", "value": encoded},
                    ],
                    field_manager=FIELD_MANAGER,
                )
        except ApiException as error:
            if error.status == 409:
                secret_ref = f"{self.settings.secret_namespace}/{self.settings.secret_name}"
                raise Conflict(f"Secret {secret_ref} changed meanwhile") from error
            raise

    # --- one pass -------------------------------------------------------------------------------

    async def sync_once(self) -> PassResult:
        """Read, decide, write: raises `Conflict` when another writer got in between (just run again)."""
        settings = self.settings
        configurations = {ref: await self._read_configuration(ref) for ref in settings.configurations}
        data, resource_version = await self._read_secret()
        stored = StoredCertificates.from_secret_data(data)
        now = self._clock()
        injected = stored.ca is not None and all(
            configuration is not None and bundle.trusts(configuration, stored.ca.certificate)
            for configuration in configurations.values()
        )
        decision = decide(stored=stored, policy=settings.policy, identity=settings.identity, now=now, injected=injected)
        state = apply(
            stored=stored,
            decision=decision,
            policy=settings.policy,
            identity=settings.identity,
            now=now,
            ca_common_name=settings.ca_common_name,
        )
        if decision.changes:
            await self._write_secret(state.to_secret_data(), resource_version=resource_version)
            logger.info("certificates rotated (%s): %s", "; ".join(decision.reasons), summary(state))
        if write_cert_dir(settings.cert_dir, state.to_secret_data()):
            logger.info("cert dir %s updated", settings.cert_dir)
        patched = []
        for ref, configuration in configurations.items():
            if configuration is None:
                continue
            patch = bundle.ca_bundle_patch(configuration, bundle_pem=state.bundle_pem)
            if patch:
                await self._patch_configuration(ref, patch)
                patched.append(str(ref))
        if patched:
            logger.info("caBundle injected into %s", ", ".join(patched))
        # What we just wrote may make the next step due at once (e.g. the injection gate opened).
        next_check = now if (decision.changes or patched) else decision.next_check
        return PassResult(
            state=state,
            next_check=next_check,
            rotated=decision.reasons if decision.changes else (),
            injected=tuple(patched),
        )

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
            except (ApiException, OSError, TimeoutError) as error:
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
                await asyncio.wait_for(stop.wait(), timeout=delay)
