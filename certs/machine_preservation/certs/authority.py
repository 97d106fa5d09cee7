"""Generating a CA and certificates it signs.

Pure functions: they take the current time and return PEM bytes, so tests control validity windows
exactly. ECDSA P-256 keys: fast to generate and accepted by Go's TLS stack and Python's ssl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Certificates are backdated a little so that a clock skew between issuer and verifier does not
# make a fresh certificate "not yet valid".
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError("expected an ECDSA private key")
        return key


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


# X.509 caps a common name at 64 characters. Serving and CA certificates are identified by their SANs and
# keys (Go ignores the CN), so their CN is shortened; a client certificate's CN is the user name and is not.
_MAX_COMMON_NAME = 64


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    # ECDSA keys only sign: TLS handshakes (every certificate) and certificates and CRLs (a CA).
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def generate_ca(*, common_name: str, now: dt.datetime, valid_for: dt.timedelta) -> KeyPair:
    key = _new_key()
    subject = _name(common_name[:_MAX_COMMON_NAME])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certificates=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _issue(
    *,
    ca: KeyPair,
    subject: x509.Name,
    usages: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName],
    now: dt.datetime,
    valid_for: dt.timedelta,
) -> KeyPair:
    key = _new_key()
    ca_cert = ca.certificate
    not_after = min(now + valid_for, ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(signs_certificates=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca.private_key(), hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving_cert(
    *,
    ca: KeyPair,
    dns_names: tuple[str, ...],
    ip_addresses: tuple[str, ...] = (),
    now: dt.datetime,
    valid_for: dt.timedelta,
) -> KeyPair:
    """A TLS server certificate. Go ignores the CN, so every name must be a SAN."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = (dns_names[0] if dns_names else ip_addresses[0])[:_MAX_COMMON_NAME]
    return _issue(
        ca=ca,
        subject=_name(common_name),
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
        now=now,
        valid_for=valid_for,
    )


def issue_client_cert(
    *,
    ca: KeyPair,
    user: str,
    groups: tuple[str, ...] = (),
    now: dt.datetime,
    valid_for: dt.timedelta,
) -> KeyPair:
    """A client certificate: Kubernetes reads the user from CN and the groups from O."""
    return _issue(
        ca=ca,
        subject=_name(user, groups),
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=[],
        now=now,
        valid_for=valid_for,
    )


def issued_at(cert: x509.Certificate) -> dt.datetime:
    """When a certificate from this module was issued (its notBefore minus the backdating)."""
    return cert.not_valid_before_utc + BACKDATE


def service_dns_names(*, service: str, namespace: str, cluster_domain: str = "cluster.local") -> tuple[str, ...]:
    """Every name a client may use for a Service: the API server uses `<svc>.<ns>.svc`."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    )


def generate_signing_key() -> tuple[bytes, bytes]:
    """A private/public key pair in PEM, e.g. for signing service-account tokens."""
    key = _new_key()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _key_pem(key), public
