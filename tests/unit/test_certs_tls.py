"""The certs package's verdicts against real TLS handshakes (`ssl`, server and client on 127.0.0.1).

Every case is judged twice: by `validate_serving_pair` and by OpenSSL in a handshake between a server
presenting the pair and a client trusting the bundle. Both must agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509

from machine_preservation.certs.authority import KeyPair, generate_ca, issue_serving_cert, service_dns_names
from machine_preservation.certs.bundle import compose_bundle
from machine_preservation.certs.pairs import CertificateProblem, Problem, load_certificates, validate_serving_pair
from tests.certificates import install

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)
NAMES = service_dns_names(service="mp-webhook", namespace="mp-system")
IPS = ("127.0.0.1",)


def serving(ca: KeyPair, *, now: dt.datetime = NOW, valid_for: dt.timedelta = DAY) -> KeyPair:
    return issue_serving_cert(ca=ca, dns_names=NAMES, ip_addresses=IPS, now=now, valid_for=valid_for)


OLD_CA = generate_ca(common_name="old-ca", now=NOW - 10 * DAY, valid_for=30 * DAY)
NEW_CA = generate_ca(common_name="new-ca", now=NOW, valid_for=30 * DAY)
OTHER_CA = generate_ca(common_name="other-ca", now=NOW, valid_for=30 * DAY)


@dataclass(frozen=True)
class Case:
    pair: KeyPair
    trusted: tuple[KeyPair, ...]
    problem: Problem | None


def _mismatched() -> KeyPair:
    return KeyPair(serving(NEW_CA).cert_pem, serving(NEW_CA).key_pem)


CASES = {
    "valid": Case(serving(NEW_CA), (NEW_CA,), None),
    "expired": Case(serving(NEW_CA, now=NOW - 3 * DAY, valid_for=DAY), (NEW_CA,), Problem.EXPIRED),
    "not-yet-valid": Case(serving(NEW_CA, now=NOW + 2 * DAY), (NEW_CA,), Problem.NOT_YET_VALID),
    "mismatched-key": Case(_mismatched(), (NEW_CA,), Problem.KEY_MISMATCH),
    "different-ca": Case(serving(OTHER_CA), (NEW_CA,), Problem.UNTRUSTED),
    "overlap-old-ca-signed": Case(serving(OLD_CA), (NEW_CA, OLD_CA), None),
    "overlap-new-ca-signed": Case(serving(NEW_CA), (NEW_CA, OLD_CA), None),
    "old-ca-dropped": Case(serving(OLD_CA), (NEW_CA,), Problem.UNTRUSTED),
}


async def handshake(*, pair: KeyPair, bundle: bytes, server_hostname: str, directory: Path) -> None:
    """Serve `pair` on 127.0.0.1 and connect with a client trusting `bundle`; raise what the client sees."""
    install(directory, pair)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.minimum_version = ssl.TLSVersion.TLSv1_2
    server_context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    client_context = ssl.create_default_context(cadata=bundle.decode())

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # When the client rejects the certificate the server side just ends.
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.write(await reader.readexactly(4))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname=server_hostname
        )
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


def _bundle(cas: tuple[KeyPair, ...]) -> bytes:
    return compose_bundle([ca.certificate for ca in cas])


@pytest.mark.parametrize("name", sorted(CASES))
async def test_validation_and_tls_handshake_agree(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    trusted = [ca.certificate for ca in case.trusted]
    if case.problem is None:
        cert = validate_serving_pair(pair=case.pair, trusted=trusted, names=(*NAMES, *IPS), now=NOW)
        assert cert.serial_number == case.pair.certificate.serial_number
        for hostname in ("127.0.0.1", "mp-webhook.mp-system.svc"):
            await handshake(pair=case.pair, bundle=_bundle(case.trusted), server_hostname=hostname, directory=tmp_path)
        return
    with pytest.raises(CertificateProblem) as verdict:
        validate_serving_pair(pair=case.pair, trusted=trusted, names=(*NAMES, *IPS), now=NOW)
    assert verdict.value.problem is case.problem
    if case.problem is Problem.KEY_MISMATCH:
        # OpenSSL refuses to even load such a pair into a server context.
        with pytest.raises(ssl.SSLError, match=r"KEY_VALUES_MISMATCH|key values mismatch"):
            await handshake(
                pair=case.pair, bundle=_bundle(case.trusted), server_hostname="127.0.0.1", directory=tmp_path
            )
        return
    expected = {
        Problem.EXPIRED: "certificate has expired",
        Problem.NOT_YET_VALID: "certificate is not yet valid",
        Problem.UNTRUSTED: "unable to get local issuer certificate",
    }[case.problem]
    with pytest.raises(ssl.SSLCertVerificationError, match=expected):
        await handshake(pair=case.pair, bundle=_bundle(case.trusted), server_hostname="127.0.0.1", directory=tmp_path)


async def test_a_name_outside_the_sans_fails_both_checks(tmp_path: Path) -> None:
    pair = serving(NEW_CA)
    with pytest.raises(CertificateProblem) as verdict:
        validate_serving_pair(pair=pair, trusted=[NEW_CA.certificate], names=("other.mp-system.svc",), now=NOW)
    assert verdict.value.problem is Problem.MISSING_NAMES
    assert "other.mp-system.svc" in str(verdict.value)
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        await handshake(pair=pair, bundle=_bundle((NEW_CA,)), server_hostname="other.mp-system.svc", directory=tmp_path)


def test_serving_certificate_carries_every_service_name_and_loopback() -> None:
    cert = serving(NEW_CA).certificate
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "mp-webhook",
        "mp-webhook.mp-system",
        "mp-webhook.mp-system.svc",
        "mp-webhook.mp-system.svc.cluster.local",
    ]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_long_names_fit_into_the_certificates() -> None:
    long_service = "a-very-long-release-name-machine-preservation-webhook"
    long_namespace = "shoot--a-long-project--a-long-shoot-name"
    names = service_dns_names(service=long_service, namespace=long_namespace)
    ca = generate_ca(common_name=f"{long_service}.{long_namespace}-ca", now=NOW, valid_for=DAY)
    pair = issue_serving_cert(ca=ca, dns_names=names, ip_addresses=IPS, now=NOW, valid_for=DAY)
    cert = validate_serving_pair(pair=pair, trusted=[ca.certificate], names=(*names, *IPS), now=NOW)
    assert len(cert.subject.rfc4514_string()) <= 3 + 64
    assert names[-1] in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )


def test_serving_certificate_never_outlives_its_ca() -> None:
    short_ca = generate_ca(common_name="short", now=NOW, valid_for=DAY)
    cert = serving(short_ca, valid_for=30 * DAY).certificate
    assert cert.not_valid_after_utc == short_ca.certificate.not_valid_after_utc


def test_compose_bundle_keeps_order_and_drops_duplicates() -> None:
    bundle = compose_bundle([NEW_CA.certificate, OLD_CA.certificate, NEW_CA.certificate])
    assert [c.subject.rfc4514_string() for c in load_certificates(bundle)] == ["CN=new-ca", "CN=old-ca"]


def test_malformed_pem_is_reported_as_such() -> None:
    with pytest.raises(CertificateProblem) as verdict:
        validate_serving_pair(pair=KeyPair(b"garbage", NEW_CA.key_pem), trusted=[], names=(), now=NOW)
    assert verdict.value.problem is Problem.MALFORMED
