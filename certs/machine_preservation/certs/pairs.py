"""Loading and validating PEM material: a serving pair against the CAs that must trust it.

Pure functions; `now` is always a parameter. A problem is reported as `CertificateProblem` carrying a
`Problem` kind, so callers (the rotation decision, the webhook's readiness) can react per kind
instead of parsing messages.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from machine_preservation.certs.authority import KeyPair


class Problem(StrEnum):
    MALFORMED = "malformed"
    KEY_MISMATCH = "key-mismatch"
    EXPIRED = "expired"
    NOT_YET_VALID = "not-yet-valid"
    UNTRUSTED = "untrusted"
    MISSING_NAMES = "missing-names"
    NOT_A_CA = "not-a-ca"


class CertificateProblem(ValueError):
    """A certificate or key cannot be used; `problem` says why, the message says what exactly."""

    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(f"{problem.value}: {message}")
        self.problem = problem


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle, in order; at least one."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as error:
        raise CertificateProblem(Problem.MALFORMED, f"not a PEM certificate bundle ({error})") from error
    return certificates


def load_private_key(pem: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:
        raise CertificateProblem(Problem.MALFORMED, f"not an unencrypted PEM private key ({error})") from error


def _public_der(key: object) -> bytes:
    public_bytes = getattr(key, "public_bytes", None)
    if public_bytes is None:
        raise CertificateProblem(Problem.MALFORMED, f"unsupported key type {type(key).__name__}")
    der: bytes = public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def load_pair(pair: KeyPair) -> tuple[x509.Certificate, PrivateKeyTypes]:
    """The leaf certificate (first in the PEM) and the key; the key must belong to the certificate."""
    cert = load_certificates(pair.cert_pem)[0]
    key = load_private_key(pair.key_pem)
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        raise CertificateProblem(Problem.KEY_MISMATCH, f"the private key does not belong to {describe(cert)}")
    return cert, key


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def describe(cert: x509.Certificate) -> str:
    """Subject and validity, for messages and logs (never key material)."""
    return (
        f"certificate {cert.subject.rfc4514_string()!r} "
        f"(valid {cert.not_valid_before_utc.isoformat()} to {cert.not_valid_after_utc.isoformat()})"
    )


def check_validity_window(cert: x509.Certificate, *, now: dt.datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise CertificateProblem(Problem.NOT_YET_VALID, f"{describe(cert)} is not valid before {now.isoformat()}")
    if now > cert.not_valid_after_utc:
        raise CertificateProblem(Problem.EXPIRED, f"{describe(cert)} expired before {now.isoformat()}")


def is_ca(cert: x509.Certificate) -> bool:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return constraints.ca


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether `ca` signed `cert` (name chaining and signature)."""
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def san_names(cert: x509.Certificate) -> set[str]:
    """DNS names and IP addresses (as text) of the subjectAltName extension."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    names = set(sans.get_values_for_type(x509.DNSName))
    names.update(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    return names


def _normalise(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def validate_ca(cert: x509.Certificate, *, now: dt.datetime) -> None:
    if not is_ca(cert):
        raise CertificateProblem(Problem.NOT_A_CA, f"{describe(cert)} is not a CA (basicConstraints ca=false)")
    check_validity_window(cert, now=now)


def validate_serving_pair(
    *,
    pair: KeyPair,
    trusted: Sequence[x509.Certificate],
    names: Sequence[str],
    now: dt.datetime,
) -> x509.Certificate:
    """The leaf of a serving pair that a client trusting `trusted` accepts for every name in `names`.

    Checks, in order: parseable, key matches, inside its validity window, signed by a currently valid
    CA of `trusted`, SANs cover `names`. Raises `CertificateProblem` at the first failure.
    """
    cert, _ = load_pair(pair)
    check_validity_window(cert, now=now)
    issuers = [ca for ca in trusted if issued_by(cert, ca)]
    if not issuers:
        raise CertificateProblem(Problem.UNTRUSTED, f"{describe(cert)} is not signed by any trusted CA")
    if not any(ca.not_valid_before_utc <= now <= ca.not_valid_after_utc for ca in issuers):
        raise CertificateProblem(Problem.UNTRUSTED, f"the CA that signed {describe(cert)} is not valid now")
    missing = {_normalise(n) for n in names} - {_normalise(n) for n in san_names(cert)}
    if missing:
        raise CertificateProblem(
            Problem.MISSING_NAMES, f"{describe(cert)} lacks subjectAltNames {', '.join(sorted(missing))}"
        )
    return cert
