"""When to rotate the CA and the serving certificate, and the state after rotating. Pure (given `now`).

The stored state is a signing CA, the trust bundle (the signing CA first, then CAs being retired) and
a serving certificate. Rotation never leaves a moment in which a client holding the previous bundle
meets a serving certificate it does not trust, or a client holding the new bundle meets the previous
serving certificate:

1. the CA is replaced `ca_rotate_before` its expiry: the new CA joins the bundle, the serving
   certificate stays signed by the old CA (both trusted);
2. once the bundle containing the new CA has been injected and `propagation_delay` has passed, the
   serving certificate is re-issued by the new CA (both CAs still trusted);
3. `ca_overlap` after the new CA was issued, the old CA leaves the bundle, but never while the
   serving certificate in the store is still signed by it.

The serving certificate is renewed when less than `serving_renew_fraction` of its lifetime remains,
or at once when it is unusable (expired, untrusted, wrong key, missing names).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography import x509

from machine_preservation.certs.authority import KeyPair, generate_ca, issue_serving_cert, issued_at
from machine_preservation.certs.bundle import compose_bundle
from machine_preservation.certs.pairs import (
    CertificateProblem,
    describe,
    fingerprint,
    issued_by,
    load_certificates,
    load_pair,
    validate_ca,
    validate_serving_pair,
)

# Keys of the Secret that stores the state (and file names in the cert dir, where they overlap).
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
CA_BUNDLE_KEY = "ca-bundle.crt"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"


@dataclass(frozen=True)
class RotationPolicy:
    ca_validity: dt.timedelta = dt.timedelta(days=365)
    ca_rotate_before: dt.timedelta = dt.timedelta(days=30)
    ca_overlap: dt.timedelta = dt.timedelta(hours=24)
    propagation_delay: dt.timedelta = dt.timedelta(minutes=5)
    serving_validity: dt.timedelta = dt.timedelta(days=30)
    serving_renew_fraction: float = 1 / 3
    # How long step 2 waits for shoots that have not applied the new CA (a hibernated shoot's GRM applies nothing)
    # before it moves the serving certificate anyway, well before the old CA expires. None: a quarter of
    # `ca_rotate_before` (7.5 days by default).
    shoot_wait_limit: dt.timedelta | None = None

    def __post_init__(self) -> None:
        problems = []
        if not self.ca_rotate_before < self.ca_validity:
            problems.append("ca_rotate_before must be shorter than ca_validity")
        if not self.propagation_delay < self.ca_overlap:
            problems.append("propagation_delay must be shorter than ca_overlap")
        # The old serving certificate (capped at the old CA's expiry) must outlive step 2.
        if not self.propagation_delay < self.ca_rotate_before:
            problems.append("propagation_delay must be shorter than ca_rotate_before")
        if self.shoot_wait_limit is not None and not self.shoot_wait_limit < self.ca_rotate_before:
            problems.append("shoot_wait_limit must be shorter than ca_rotate_before")
        if not self.serving_validity <= self.ca_validity:
            problems.append("serving_validity must not exceed ca_validity")
        if not 0 < self.serving_renew_fraction < 1:
            problems.append("serving_renew_fraction must be between 0 and 1")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def shoot_wait(self) -> dt.timedelta:
        return self.shoot_wait_limit if self.shoot_wait_limit is not None else self.ca_rotate_before / 4


@dataclass(frozen=True)
class ServingIdentity:
    """The names a serving certificate must carry."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.dns_names, *self.ip_addresses)


@dataclass(frozen=True)
class CertificateState:
    """What the Secret holds. `bundle` starts with `ca`'s certificate; any others are being retired."""

    ca: KeyPair
    bundle: tuple[x509.Certificate, ...]
    serving: KeyPair

    @property
    def bundle_pem(self) -> bytes:
        return compose_bundle(self.bundle)

    def to_secret_data(self) -> dict[str, bytes]:
        return {
            CA_CERT_KEY: self.ca.cert_pem,
            CA_KEY_KEY: self.ca.key_pem,
            CA_BUNDLE_KEY: self.bundle_pem,
            TLS_CERT_KEY: self.serving.cert_pem,
            TLS_KEY_KEY: self.serving.key_pem,
        }


@dataclass(frozen=True)
class StoredCertificates:
    """A best-effort reading of the Secret: whatever is missing or unparseable is None or empty."""

    ca: KeyPair | None = None
    bundle: tuple[x509.Certificate, ...] = ()
    serving: KeyPair | None = None

    @classmethod
    def from_secret_data(cls, data: Mapping[str, bytes]) -> StoredCertificates:
        ca = _pair(data, CA_CERT_KEY, CA_KEY_KEY)
        serving = _pair(data, TLS_CERT_KEY, TLS_KEY_KEY)
        try:
            bundle = tuple(load_certificates(data[CA_BUNDLE_KEY])) if data.get(CA_BUNDLE_KEY) else ()
        except CertificateProblem:
            bundle = ()
        return cls(ca=ca, bundle=bundle, serving=serving)


def _pair(data: Mapping[str, bytes], cert_key: str, key_key: str) -> KeyPair | None:
    cert, key = data.get(cert_key), data.get(key_key)
    return KeyPair(cert, key) if cert and key else None


@dataclass(frozen=True)
class Decision:
    """What to change now, why, and (when nothing changes) when to look again."""

    new_ca: bool
    new_serving: bool
    # The CAs to keep trusting besides the signing CA (after a new CA: the old signing CA).
    retiring: tuple[x509.Certificate, ...]
    reasons: tuple[str, ...]
    next_check: dt.datetime
    bundle_changed: bool

    @property
    def changes(self) -> bool:
        return self.new_ca or self.new_serving or self.bundle_changed


def _usable_ca(ca: KeyPair | None, *, now: dt.datetime) -> x509.Certificate | str:
    """The stored CA's certificate, or why it cannot sign."""
    if ca is None:
        return "no CA stored"
    try:
        cert, _ = load_pair(ca)
        validate_ca(cert, now=now)
    except CertificateProblem as problem:
        return f"stored CA unusable ({problem})"
    return cert


def _serving_cert(serving: KeyPair | None) -> tuple[KeyPair, x509.Certificate] | str:
    """The stored serving pair and its certificate, or why it is unusable."""
    if serving is None:
        return "no serving certificate stored"
    try:
        cert, _ = load_pair(serving)
    except CertificateProblem as problem:
        return f"serving certificate unusable ({problem})"
    return serving, cert


def decide(
    *,
    stored: StoredCertificates,
    policy: RotationPolicy,
    identity: ServingIdentity,
    now: dt.datetime,
    injected: bool,
    shoots_pending: tuple[str, ...] = (),
) -> Decision:
    """The rotation decision for `stored` at `now`.

    `injected`: every webhook configuration's caBundle already contains the stored signing CA. Until
    then the serving certificate does not move to a new CA. `shoots_pending`: the shoots (in a Gardener seed)
    whose API servers may not trust the stored bundle yet; the move waits for them too, at most
    `policy.shoot_wait` from the new CA's issuance.
    """
    reasons: list[str] = []
    checks: list[dt.datetime] = []
    ca = _usable_ca(stored.ca, now=now)
    current = _ca_to_keep(ca, policy=policy, now=now, reasons=reasons, checks=checks)
    serving = _serving_cert(stored.serving)
    retiring = _cas_to_keep_trusting(
        stored, ca=ca, current=current, serving=serving, policy=policy, now=now, checks=checks
    )
    bundle_changed = current is not None and [fingerprint(c) for c in stored.bundle] != [
        fingerprint(c) for c in (current, *retiring)
    ]
    if bundle_changed:
        reasons.append("trust bundle out of date: composing it anew")
    new_serving = _serving_due(
        serving,
        current=current,
        retiring=retiring,
        policy=policy,
        identity=identity,
        now=now,
        injected=injected,
        shoots_pending=shoots_pending,
        reasons=reasons,
        checks=checks,
    )
    return Decision(
        new_ca=current is None,
        new_serving=new_serving,
        retiring=retiring,
        reasons=tuple(reasons),
        next_check=min(checks, default=now),
        bundle_changed=bundle_changed,
    )


# The helpers of `decide` add why they decide as they do to `reasons`, and when to look again to `checks`.


def _ca_to_keep(
    ca: x509.Certificate | str,
    *,
    policy: RotationPolicy,
    now: dt.datetime,
    reasons: list[str],
    checks: list[dt.datetime],
) -> x509.Certificate | None:
    """The signing CA to keep, or None when a new one is due (none usable, or it expires within `ca_rotate_before`)."""
    if isinstance(ca, str):
        reasons.append(ca)
        return None
    rotate_at = ca.not_valid_after_utc - policy.ca_rotate_before
    if now >= rotate_at:
        reasons.append(f"CA expires at {ca.not_valid_after_utc.isoformat()}: rotating with overlap")
        return None
    checks.append(rotate_at)
    return ca


def _cas_to_keep_trusting(
    stored: StoredCertificates,
    *,
    ca: x509.Certificate | str,
    current: x509.Certificate | None,
    serving: tuple[KeyPair, x509.Certificate] | str,
    policy: RotationPolicy,
    now: dt.datetime,
    checks: list[dt.datetime],
) -> tuple[x509.Certificate, ...]:
    """Which CAs stay trusted besides the signing CA (`current`, None when a new one is due; `ca` the stored one)."""
    if current is None:
        # A new CA: only the CA being replaced is worth keeping, any older one is past its overlap.
        return () if isinstance(ca, str) else (ca,)
    others = [
        c
        for c in stored.bundle
        if fingerprint(c) != fingerprint(current) and c.not_valid_before_utc <= now <= c.not_valid_after_utc
    ]
    retire_at = issued_at(current) + policy.ca_overlap
    if now < retire_at:
        retiring = tuple(others)
        if others:
            checks.append(retire_at)
    else:
        # Never drop the CA that signed the serving certificate still in use.
        retiring = tuple(c for c in others if not isinstance(serving, str) and issued_by(serving[1], c))
    checks.extend(c.not_valid_after_utc for c in retiring)
    return retiring


def _serving_due(
    serving: tuple[KeyPair, x509.Certificate] | str,
    *,
    current: x509.Certificate | None,
    retiring: tuple[x509.Certificate, ...],
    policy: RotationPolicy,
    identity: ServingIdentity,
    now: dt.datetime,
    injected: bool,
    shoots_pending: tuple[str, ...],
    reasons: list[str],
    checks: list[dt.datetime],
) -> bool:
    """Whether a new serving certificate is due: the stored one is unusable, due for renewal, or (step 2 of a
    rotation) to move to the new CA."""
    if isinstance(serving, str):
        reasons.append(serving)
        return True
    pair, cert = serving
    trusted = retiring if current is None else (current, *retiring)
    try:
        validate_serving_pair(pair=pair, trusted=trusted, names=identity.names, now=now)
    except CertificateProblem as problem:
        reasons.append(f"serving certificate unusable ({problem})")
        return True
    if current is None:
        return False
    if issued_by(cert, current):
        # Lifetime from issuance, not from the backdated notBefore, so short lifetimes work as set.
        lifetime = cert.not_valid_after_utc - issued_at(cert)
        renew_at = cert.not_valid_after_utc - lifetime * policy.serving_renew_fraction
        if now >= renew_at:
            reasons.append(f"serving certificate expires at {cert.not_valid_after_utc.isoformat()}")
            return True
        checks.append(renew_at)
        return False
    return _serving_moves_to_new_ca(
        current,
        policy=policy,
        now=now,
        injected=injected,
        shoots_pending=shoots_pending,
        reasons=reasons,
        checks=checks,
    )


def _serving_moves_to_new_ca(
    current: x509.Certificate,
    *,
    policy: RotationPolicy,
    now: dt.datetime,
    injected: bool,
    shoots_pending: tuple[str, ...],
    reasons: list[str],
    checks: list[dt.datetime],
) -> bool:
    """Step 2 of the rotation: only once clients have had time to learn the new CA (`current`)."""
    propagated_at = issued_at(current) + policy.propagation_delay
    waited_out = now >= issued_at(current) + policy.shoot_wait
    if not (injected and now >= propagated_at and (not shoots_pending or waited_out)):
        checks.append(max(propagated_at, now + policy.propagation_delay / 10))
        return False
    reasons.append("moving the serving certificate to the new CA")
    if shoots_pending:
        named = ", ".join(shoots_pending[:5]) + (", ..." if len(shoots_pending) > 5 else "")
        waited = policy.shoot_wait
        reasons.append(f"{len(shoots_pending)} shoot(s) have not applied it after {waited} ({named})")
    return True


def apply(
    *,
    stored: StoredCertificates,
    decision: Decision,
    policy: RotationPolicy,
    identity: ServingIdentity,
    now: dt.datetime,
    ca_common_name: str,
) -> CertificateState:
    """The state after carrying out `decision` (generates keys; no I/O)."""
    ca = stored.ca
    if decision.new_ca or ca is None:
        ca = generate_ca(common_name=ca_common_name, now=now, valid_for=policy.ca_validity)
    serving = stored.serving
    if decision.new_serving or serving is None:
        serving = issue_serving_cert(
            ca=ca,
            dns_names=identity.dns_names,
            ip_addresses=identity.ip_addresses,
            now=now,
            valid_for=policy.serving_validity,
        )
    return CertificateState(ca=ca, bundle=(ca.certificate, *decision.retiring), serving=serving)


def summary(state: CertificateState) -> str:
    """One log line: what is trusted and served (no key material)."""
    serving = state.serving.certificate
    return f"serving {describe(serving)}; trusting {len(state.bundle)} CA(s): " + ", ".join(
        f"{c.subject.rfc4514_string()} until {c.not_valid_after_utc.isoformat()}" for c in state.bundle
    )


def split_names(names: tuple[str, ...]) -> ServingIdentity:
    """Separate DNS names from IP addresses (both may be given on one command-line option)."""
    ips, dns = [], []
    for name in names:
        try:
            ips.append(str(ipaddress.ip_address(name)))
        except ValueError:
            dns.append(name)
    return ServingIdentity(dns_names=tuple(dns), ip_addresses=tuple(ips))
