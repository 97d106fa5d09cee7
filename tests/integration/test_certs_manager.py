"""The certificate manager's I/O shell against the real API server: Secret, serving Secret, cert dir, caBundle
injection, optimistic concurrency between replicas, a full CA rotation driven by a controlled clock, and the
CLI. Every manager runs as the standalone chart's certs manager ServiceAccount under the chart's RBAC
(tests/integration/certs_identity.py): the chart creates its two Secrets empty and the release's webhook
configurations, and the manager only reads and patches them by name. The administrator's client only sets up and
checks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client as sync_client
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.certs import bundle
from machine_preservation.certs.authority import KeyPair
from machine_preservation.certs.manager import (
    CertificateManager,
    Conflict,
    ManagerSettings,
    WebhookConfigurationRef,
    WebhookKind,
)
from machine_preservation.certs.pairs import load_certificates, validate_serving_pair
from machine_preservation.certs.rotation import RotationPolicy, ServingIdentity
from machine_preservation.localcluster.controlplane import ControlPlane, free_port
from tests.integration import kube
from tests.integration.certs_identity import CA_SECRET, SERVING_SECRET, CertsIdentity

POLICY = RotationPolicy(
    ca_validity=dt.timedelta(hours=10),
    ca_rotate_before=dt.timedelta(hours=3),
    ca_overlap=dt.timedelta(hours=1),
    propagation_delay=dt.timedelta(minutes=5),
    serving_validity=dt.timedelta(hours=2),
)
IDENTITY = ServingIdentity(dns_names=("mp.ns.svc",), ip_addresses=("127.0.0.1",))


@pytest.fixture
def configurations(
    kube_client: sync_client.ApiClient, certs: CertsIdentity
) -> Iterator[tuple[WebhookConfigurationRef, ...]]:
    """The release's two webhook configurations, as the chart creates them (without caBundle)."""
    api = sync_client.AdmissionregistrationV1Api(kube_client)
    name = certs.configuration
    api.create_validating_webhook_configuration(
        {"metadata": {"name": name}, "webhooks": [kube.unused_webhook("a.mp.test"), kube.unused_webhook("b.mp.test")]}
    )
    api.create_mutating_webhook_configuration(
        {"metadata": {"name": name}, "webhooks": [kube.unused_webhook("c.mp.test")]}
    )
    yield (
        WebhookConfigurationRef(kind=WebhookKind.VALIDATING, name=name),
        WebhookConfigurationRef(kind=WebhookKind.MUTATING, name=name),
    )
    api.delete_validating_webhook_configuration(name)
    api.delete_mutating_webhook_configuration(name)


@pytest.fixture
async def aio_client(certs: CertsIdentity) -> AsyncIterator[client.ApiClient]:
    """The certs manager's client: its ServiceAccount's token."""
    api_client = await config.new_client_from_config(config_file=str(certs.kubeconfig))
    async with api_client:
        yield api_client


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


def manager(
    *,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
    cert_dir: Path | None,
    clock: Clock | None = None,
    serving_secret: bool = False,
    identity: ServingIdentity = IDENTITY,
) -> CertificateManager:
    settings = ManagerSettings(
        secret_namespace=namespace,
        secret_name=CA_SECRET,
        cert_dir=cert_dir,
        identity=identity,
        policy=POLICY,
        configurations=configurations,
        ca_common_name="mp-test-ca",
        serving_secret=(namespace, SERVING_SECRET) if serving_secret else None,
    )
    if clock is None:
        return CertificateManager(settings=settings, api_client=aio_client, remote_clients={})
    return CertificateManager(settings=settings, api_client=aio_client, remote_clients={}, clock=clock)


def read_secret(kube_client: sync_client.ApiClient, namespace: str, name: str = CA_SECRET) -> dict[str, bytes]:
    secret = sync_client.CoreV1Api(kube_client).read_namespaced_secret(name, namespace)
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


def assert_serving_secret_matches(kube_client: sync_client.ApiClient, namespace: str, data: dict[str, bytes]) -> None:
    """Only the serving pair, nothing of the CA."""
    assert read_secret(kube_client, namespace, SERVING_SECRET) == {
        "tls.crt": data["tls.crt"],
        "tls.key": data["tls.key"],
    }


def injected_bundles(kube_client: sync_client.ApiClient, name: str) -> list[bytes]:
    api = sync_client.AdmissionregistrationV1Api(kube_client)
    webhooks = [
        *api.read_validating_webhook_configuration(name).webhooks,
        *api.read_mutating_webhook_configuration(name).webhooks,
    ]
    return [base64.b64decode(w.client_config.ca_bundle or "") for w in webhooks]


def assert_cert_dir_matches(cert_dir: Path, data: dict[str, bytes]) -> None:
    assert (cert_dir / "tls.crt").read_bytes() == data["tls.crt"]
    assert (cert_dir / "tls.key").read_bytes() == data["tls.key"]
    assert (cert_dir / "ca.crt").read_bytes() == data["ca-bundle.crt"]
    assert (cert_dir / "tls.key").stat().st_mode & 0o077 == 0, "the private key must not be group/world readable"
    assert not [p for p in cert_dir.iterdir() if p.name.startswith(".")], "no temporary files left behind"


async def test_first_pass_fills_the_secret_and_cert_dir_and_injects_every_webhook(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
    tmp_path: Path,
) -> None:
    first = manager(aio_client=aio_client, namespace=namespace, configurations=configurations, cert_dir=tmp_path / "a")
    result = await first.sync_once()
    assert result.rotated == ("no CA stored", "no serving certificate stored")
    assert set(result.injected) == {f"validating/{configurations[0].name}", f"mutating/{configurations[1].name}"}

    data = read_secret(kube_client, namespace)
    assert set(data) == {"ca.crt", "ca.key", "ca-bundle.crt", "tls.crt", "tls.key"}
    assert_cert_dir_matches(tmp_path / "a", data)
    assert injected_bundles(kube_client, configurations[0].name) == [data["ca-bundle.crt"]] * 3
    validate_serving_pair(
        pair=KeyPair(data["tls.crt"], data["tls.key"]),
        trusted=load_certificates(data["ca-bundle.crt"]),
        names=IDENTITY.names,
        now=dt.datetime.now(dt.UTC),
    )

    # Another replica adopts the same certificates and writes nothing to the API.
    resource_version = sync_client.CoreV1Api(kube_client).read_namespaced_secret(CA_SECRET, namespace)
    second = manager(aio_client=aio_client, namespace=namespace, configurations=configurations, cert_dir=tmp_path / "b")
    again = await second.sync_once()
    assert (again.rotated, again.injected) == ((), ())
    assert_cert_dir_matches(tmp_path / "b", data)
    after = sync_client.CoreV1Api(kube_client).read_namespaced_secret(CA_SECRET, namespace)
    assert after.metadata.resource_version == resource_version.metadata.resource_version


async def test_replicas_racing_on_an_empty_secret_converge_on_one_certificate(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
    tmp_path: Path,
) -> None:
    # The chart renders the Secret empty, so the managers only ever need to patch it.
    replicas = [
        manager(aio_client=aio_client, namespace=namespace, configurations=configurations, cert_dir=tmp_path / str(i))
        for i in range(3)
    ]
    outcomes = await asyncio.gather(*(r.sync_once() for r in replicas), return_exceptions=True)
    conflicts = [o for o in outcomes if isinstance(o, Conflict)]
    assert len(conflicts) == 2, outcomes
    stop = asyncio.Event()
    await asyncio.gather(*(r.run(stop=stop, once=True) for r in replicas))
    data = read_secret(kube_client, namespace)
    for i in range(3):
        assert_cert_dir_matches(tmp_path / str(i), data)
    assert injected_bundles(kube_client, configurations[0].name) == [data["ca-bundle.crt"]] * 3


async def test_a_stale_bundle_patch_is_rejected_by_the_api_server(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    configurations: tuple[WebhookConfigurationRef, ...],
) -> None:
    api = client.AdmissionregistrationV1Api(aio_client)
    name = configurations[0].name
    stale = (await api.read_validating_webhook_configuration(name)).model_dump(by_alias=True, mode="json")
    await api.patch_validating_webhook_configuration(name, {"metadata": {"labels": {"touched": "yes"}}})
    patch = bundle.ca_bundle_patch(stale, bundle_pem=b"-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ApiException) as rejected:
        await api.patch_validating_webhook_configuration(name, patch)
    assert rejected.value.status == 409
    assert injected_bundles(kube_client, name)[0] == b""


async def test_ca_rotation_with_overlap_against_the_real_api(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
    tmp_path: Path,
) -> None:
    clock = Clock()
    replica = manager(
        aio_client=aio_client, namespace=namespace, configurations=configurations, cert_dir=tmp_path, clock=clock
    )
    await replica.sync_once()
    old_ca = load_certificates(read_secret(kube_client, namespace)["ca.crt"])[0]
    rotate_at = old_ca.not_valid_after_utc - POLICY.ca_rotate_before
    # Half an hour before, a pass re-issues the serving certificate (expired in the jump) by the old CA.
    clock.now = rotate_at - dt.timedelta(minutes=30)
    renewed = await replica.sync_once()
    assert not renewed.rotated[0].startswith("CA")
    first = read_secret(kube_client, namespace)
    assert load_certificates(first["tls.crt"])[0].issuer == old_ca.subject

    clock.now = rotate_at
    step1 = await replica.sync_once()
    assert any("rotating with overlap" in r for r in step1.rotated)
    data = read_secret(kube_client, namespace)
    assert len(load_certificates(data["ca-bundle.crt"])) == 2
    assert data["tls.crt"] == first["tls.crt"], "the serving certificate waits for the new CA to propagate"
    assert injected_bundles(kube_client, configurations[0].name) == [data["ca-bundle.crt"]] * 3
    assert_cert_dir_matches(tmp_path, data)
    assert step1.next_check == clock.now, "the injection just done may open the next step"
    waiting = await replica.sync_once()
    assert (waiting.rotated, waiting.injected) == ((), ())
    assert waiting.next_check > clock.now

    clock.now = waiting.next_check
    step2 = await replica.sync_once()
    assert step2.rotated == ("moving the serving certificate to the new CA",)
    moved = read_secret(kube_client, namespace)
    new_ca = load_certificates(moved["ca.crt"])[0]
    assert load_certificates(moved["tls.crt"])[0].issuer == new_ca.subject
    assert_cert_dir_matches(tmp_path, moved)

    clock.now += POLICY.ca_overlap
    step3 = await replica.sync_once()
    assert step3.rotated
    final = read_secret(kube_client, namespace)
    assert load_certificates(final["ca-bundle.crt"]) == [new_ca]
    assert injected_bundles(kube_client, configurations[0].name) == [final["ca-bundle.crt"]] * 3
    assert_cert_dir_matches(tmp_path, final)


def test_cli_once_fills_the_cert_dir_and_exits(
    certs: CertsIdentity,
    kube_client: sync_client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
    tmp_path: Path,
) -> None:
    command = [
        sys.executable,
        "-m",
        "machine_preservation.cli",
        "certs",
        "run",
        "--once",
        f"--kubeconfig={certs.kubeconfig}",
        f"--secret={namespace}/{CA_SECRET}",
        f"--cert-dir={tmp_path}",
        "--service=mp-webhook",
        f"--namespace={namespace}",
        f"--webhook-configuration=validating/{configurations[0].name}",
        f"--webhook-configuration=mutating/{configurations[1].name}@{certs.kubeconfig}",
        "--serving-validity=1h",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=os.environ, check=False)
    assert result.returncode == 0, result.stderr
    data = read_secret(kube_client, namespace)
    assert_cert_dir_matches(tmp_path, data)
    assert injected_bundles(kube_client, configurations[0].name) == [data["ca-bundle.crt"]] * 3
    served = load_certificates(data["tls.crt"])[0]
    assert served.not_valid_after_utc - served.not_valid_before_utc < dt.timedelta(hours=1, minutes=6)
    validate_serving_pair(
        pair=KeyPair(data["tls.crt"], data["tls.key"]),
        trusted=load_certificates(data["ca-bundle.crt"]),
        names=(
            "mp-webhook",
            f"mp-webhook.{namespace}",
            f"mp-webhook.{namespace}.svc",
            f"mp-webhook.{namespace}.svc.cluster.local",
            "127.0.0.1",
        ),
        now=dt.datetime.now(dt.UTC),
    )
    assert "BEGIN" not in result.stderr, "no key material in logs"


async def test_an_unreachable_remote_cluster_does_not_stop_the_local_work(
    control_plane: ControlPlane,
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
    tmp_path: Path,
) -> None:
    # A kubeconfig for a cluster nobody listens for.
    unreachable = tmp_path / "remote.kubeconfig"
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    unreachable.write_text(yaml.safe_dump(kubeconfig))
    remote_ref = WebhookConfigurationRef(kind=WebhookKind.VALIDATING, name="remote", kubeconfig=unreachable)
    remote_client = await config.new_client_from_config(config_file=str(unreachable))
    async with remote_client:
        settings = ManagerSettings(
            secret_namespace=namespace,
            secret_name=CA_SECRET,
            cert_dir=tmp_path / "certs",
            identity=IDENTITY,
            policy=POLICY,
            configurations=(*configurations, remote_ref),
            ca_common_name="mp-test-ca",
        )
        replica = CertificateManager(
            settings=settings, api_client=aio_client, remote_clients={unreachable: remote_client}
        )
        result = await replica.sync_once()
    assert result.rotated, "the Secret is still filled"
    assert sorted(result.injected) == sorted(str(ref) for ref in configurations)
    data = read_secret(kube_client, namespace)
    assert_cert_dir_matches(tmp_path / "certs", data)
    assert injected_bundles(kube_client, configurations[0].name) == [data["ca-bundle.crt"]] * 3


async def test_the_serving_secret_gets_only_the_serving_pair_and_only_when_it_changes(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
) -> None:
    # The chart renders both Secrets empty, so the manager only ever needs `get` and `patch` on them.
    core = sync_client.CoreV1Api(kube_client)
    replica = manager(
        aio_client=aio_client, namespace=namespace, configurations=configurations, cert_dir=None, serving_secret=True
    )
    first = await replica.sync_once()
    assert first.published
    data = read_secret(kube_client, namespace)
    assert "ca.key" in data
    assert_serving_secret_matches(kube_client, namespace, data)

    version = core.read_namespaced_secret(SERVING_SECRET, namespace).metadata.resource_version
    again = await replica.sync_once()
    assert (again.rotated, again.injected, again.published) == ((), (), False)
    assert core.read_namespaced_secret(SERVING_SECRET, namespace).metadata.resource_version == version

    # Someone (or an older chart) put other content there: the next pass puts the pair back.
    core.patch_namespaced_secret(SERVING_SECRET, namespace, {"data": {"tls.crt": base64.b64encode(b"x").decode()}})
    assert (await replica.sync_once()).published
    assert_serving_secret_matches(kube_client, namespace, data)


async def test_the_serving_secret_follows_a_ca_rotation(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
) -> None:
    clock = Clock()
    replica = manager(
        aio_client=aio_client,
        namespace=namespace,
        configurations=configurations,
        cert_dir=None,
        clock=clock,
        serving_secret=True,
    )
    await replica.sync_once()
    old_ca = load_certificates(read_secret(kube_client, namespace)["ca.crt"])[0]
    rotate_at = old_ca.not_valid_after_utc - POLICY.ca_rotate_before
    clock.now = rotate_at - dt.timedelta(minutes=30)
    assert (await replica.sync_once()).published, "the serving certificate (expired in the jump) re-issued"
    clock.now = rotate_at
    step1 = await replica.sync_once()
    assert not step1.published, "the serving certificate waits for the new CA to propagate"
    waiting = await replica.sync_once()
    clock.now = waiting.next_check
    step2 = await replica.sync_once()
    assert step2.rotated == ("moving the serving certificate to the new CA",)
    assert step2.published
    moved = read_secret(kube_client, namespace)
    assert_serving_secret_matches(kube_client, namespace, moved)
    new_ca = load_certificates(moved["ca.crt"])[0]
    served = load_certificates(read_secret(kube_client, namespace, SERVING_SECRET)["tls.crt"])[0]
    assert served.issuer == new_ca.subject


class InterleavingManager(CertificateManager):
    """Runs another manager's whole pass right after this one has read the Secret."""

    def __init__(self, *, other: CertificateManager, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.other = other
        self.other_result: Any = None

    async def _read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str | None]:
        result = await super()._read_secret(namespace, name)
        if name == self.settings.secret_name and self.other_result is None:
            self.other_result = await self.other.sync_once()
        return result


async def test_a_lagging_manager_never_puts_an_older_serving_pair_back(
    kube_client: sync_client.ApiClient,
    aio_client: client.ApiClient,
    namespace: str,
    configurations: tuple[WebhookConfigurationRef, ...],
) -> None:
    """Two managers during a rolling update: a newer one re-issues the serving certificate (it needs one more
    name) between the older one's read of the Secret and its write of the serving Secret."""
    base = manager(
        aio_client=aio_client, namespace=namespace, configurations=configurations, cert_dir=None, serving_secret=True
    )
    await base.sync_once()
    newer = manager(
        aio_client=aio_client,
        namespace=namespace,
        configurations=configurations,
        cert_dir=None,
        serving_secret=True,
        identity=ServingIdentity(dns_names=(*IDENTITY.dns_names, "new.mp.ns.svc"), ip_addresses=IDENTITY.ip_addresses),
    )
    lagging = InterleavingManager(other=newer, settings=base.settings, api_client=aio_client, remote_clients={})
    # A 409 would be a fine answer too: what matters is what the serving Secret holds afterwards.
    with contextlib.suppress(Conflict):
        await lagging.sync_once()
    assert lagging.other_result is not None
    assert lagging.other_result.published, "the newer manager re-issued and published"
    data = read_secret(kube_client, namespace)
    assert "new.mp.ns.svc" in load_certificates(data["tls.crt"])[0].extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)
    assert_serving_secret_matches(kube_client, namespace, data)
