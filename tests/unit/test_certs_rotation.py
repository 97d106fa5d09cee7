"""The rotation decision: table tests for each rule, and a hypothesis simulation of months of rotations
in which every client/server pairing that can occur during a rollout keeps trusting each other."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from machine_preservation.certs.authority import KeyPair, generate_ca
from machine_preservation.certs.pairs import CertificateProblem, validate_serving_pair
from machine_preservation.certs.rotation import (
    CA_BUNDLE_KEY,
    CA_CERT_KEY,
    TLS_CERT_KEY,
    TLS_KEY_KEY,
    CertificateState,
    Decision,
    RotationPolicy,
    ServingIdentity,
    StoredCertificates,
    apply,
    decide,
    split_names,
)

T0 = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
POLICY = RotationPolicy(
    ca_validity=dt.timedelta(hours=10),
    ca_rotate_before=dt.timedelta(hours=3),
    ca_overlap=dt.timedelta(hours=1),
    propagation_delay=dt.timedelta(minutes=5),
    serving_validity=dt.timedelta(hours=2),
    serving_renew_fraction=1 / 3,
)
IDENTITY = ServingIdentity(
    dns_names=("svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"), ip_addresses=("127.0.0.1",)
)


def step(
    state: StoredCertificates, *, now: dt.datetime, injected: bool = True, identity: ServingIdentity = IDENTITY
) -> tuple[CertificateState, bool]:
    decision = decide(stored=state, policy=POLICY, identity=identity, now=now, injected=injected)
    new = apply(
        stored=state, decision=decision, policy=POLICY, identity=identity, now=now, ca_common_name="mp-webhook-ca"
    )
    return new, decision.changes


def stored_as(state: CertificateState) -> StoredCertificates:
    """What the manager reads back after writing `state`."""
    return StoredCertificates(ca=state.ca, bundle=state.bundle, serving=state.serving)


def fresh() -> CertificateState:
    state, changed = step(StoredCertificates(), now=T0)
    assert changed
    return state


def serial(pair: KeyPair) -> int:
    return pair.certificate.serial_number


def test_empty_store_gets_a_ca_and_a_serving_certificate_trusted_by_it() -> None:
    decision = decide(stored=StoredCertificates(), policy=POLICY, identity=IDENTITY, now=T0, injected=False)
    assert (decision.new_ca, decision.new_serving) == (True, True)
    assert decision.reasons == ("no CA stored", "no serving certificate stored")
    state = fresh()
    assert len(state.bundle) == 1
    validate_serving_pair(pair=state.serving, trusted=state.bundle, names=IDENTITY.names, now=T0)


def test_a_fresh_state_is_a_fixed_point_until_the_serving_renewal_time() -> None:
    state = fresh()
    decision = decide(stored=stored_as(state), policy=POLICY, identity=IDENTITY, now=T0, injected=False)
    assert not decision.changes
    renew_at = T0 + POLICY.serving_validity - POLICY.serving_validity / 3
    assert decision.next_check == renew_at
    before = decide(
        stored=stored_as(state),
        policy=POLICY,
        identity=IDENTITY,
        now=renew_at - dt.timedelta(seconds=1),
        injected=True,
    )
    assert not before.changes
    at = decide(stored=stored_as(state), policy=POLICY, identity=IDENTITY, now=renew_at, injected=True)
    assert (at.new_ca, at.new_serving, at.bundle_changed) == (False, True, False)


def test_ca_rotation_runs_in_three_steps_with_both_cas_trusted_in_between() -> None:
    state = fresh()
    # Keep the serving certificate fresh up to the CA's rotation time, as the loop would.
    rotate_at = state.ca.certificate.not_valid_after_utc - POLICY.ca_rotate_before
    state, _ = step(stored_as(state), now=rotate_at - dt.timedelta(minutes=30))
    old_ca, old_serving = state.ca, state.serving

    # Step 1: new CA, old one kept in the bundle, serving certificate untouched.
    state, changed = step(stored_as(state), now=rotate_at)
    assert changed
    assert serial(state.ca) != serial(old_ca)
    assert [c.serial_number for c in state.bundle] == [serial(state.ca), serial(old_ca)]
    assert serial(state.serving) == serial(old_serving)

    # Before the propagation delay, or before injection, the serving certificate stays.
    for now, injected in ((rotate_at + dt.timedelta(minutes=4), True), (rotate_at + dt.timedelta(minutes=6), False)):
        decision = decide(stored=stored_as(state), policy=POLICY, identity=IDENTITY, now=now, injected=injected)
        assert not decision.changes, (now, injected)

    # Step 2: serving certificate moves to the new CA; both CAs still trusted.
    moved, changed = step(stored_as(state), now=rotate_at + dt.timedelta(minutes=6))
    assert changed
    assert moved.serving.certificate.issuer.rfc4514_string() == "CN=mp-webhook-ca"
    assert moved.serving.certificate.serial_number != serial(old_serving)
    assert len(moved.bundle) == 2

    # Step 3: after the overlap the old CA leaves the bundle...
    end_of_overlap = rotate_at + POLICY.ca_overlap + dt.timedelta(seconds=1)
    dropped, changed = step(stored_as(moved), now=end_of_overlap)
    assert changed
    assert [c.serial_number for c in dropped.bundle] == [serial(moved.ca)]
    # ... but never while the stored serving certificate still depends on it (injection never happened).
    kept = decide(stored=stored_as(state), policy=POLICY, identity=IDENTITY, now=end_of_overlap, injected=False)
    assert not kept.changes
    assert [c.serial_number for c in kept.retiring] == [serial(old_ca)]


def test_an_expired_ca_is_replaced_with_no_overlap_and_a_new_serving_certificate() -> None:
    state = fresh()
    later = state.ca.certificate.not_valid_after_utc + dt.timedelta(seconds=1)
    decision = decide(stored=stored_as(state), policy=POLICY, identity=IDENTITY, now=later, injected=True)
    assert (decision.new_ca, decision.new_serving, decision.retiring) == (True, True, ())
    assert any("expired" in reason for reason in decision.reasons)


@pytest.mark.parametrize(
    ("breakage", "expected_reason"),
    [
        ({TLS_KEY_KEY: generate_ca(common_name="x", now=T0, valid_for=POLICY.ca_validity).key_pem}, "key-mismatch"),
        ({TLS_CERT_KEY: b"not pem"}, "malformed"),
        ({CA_BUNDLE_KEY: b"not pem"}, "trust bundle out of date"),
    ],
)
def test_broken_secret_content_is_repaired(breakage: dict[str, bytes], expected_reason: str) -> None:
    data = {**fresh().to_secret_data(), **breakage}
    stored = StoredCertificates.from_secret_data(data)
    decision = decide(stored=stored, policy=POLICY, identity=IDENTITY, now=T0, injected=True)
    assert decision.changes
    assert not decision.new_ca
    assert any(expected_reason in reason for reason in decision.reasons), decision.reasons
    repaired, _ = step(stored, now=T0)
    validate_serving_pair(pair=repaired.serving, trusted=repaired.bundle, names=IDENTITY.names, now=T0)


def test_a_garbage_ca_starts_over() -> None:
    data = {**fresh().to_secret_data(), CA_CERT_KEY: b"garbage"}
    decision = decide(
        stored=StoredCertificates.from_secret_data(data), policy=POLICY, identity=IDENTITY, now=T0, injected=True
    )
    assert (decision.new_ca, decision.new_serving) == (True, True)


def test_a_changed_service_name_reissues_the_serving_certificate() -> None:
    state = fresh()
    renamed = ServingIdentity(dns_names=("other.ns.svc",), ip_addresses=("127.0.0.1",))
    decision = decide(stored=stored_as(state), policy=POLICY, identity=renamed, now=T0, injected=True)
    assert (decision.new_ca, decision.new_serving) == (False, True)
    assert "missing-names" in decision.reasons[0]


def test_secret_data_round_trip_is_a_fixed_point() -> None:
    state = fresh()
    stored = StoredCertificates.from_secret_data(state.to_secret_data())
    assert not decide(stored=stored, policy=POLICY, identity=IDENTITY, now=T0, injected=True).changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ca_rotate_before": dt.timedelta(hours=10)}, "ca_rotate_before must be shorter than ca_validity"),
        ({"propagation_delay": dt.timedelta(hours=1)}, "propagation_delay must be shorter than ca_overlap"),
        ({"serving_validity": dt.timedelta(hours=11)}, "serving_validity must not exceed ca_validity"),
        ({"serving_renew_fraction": 1.0}, "serving_renew_fraction must be between 0 and 1"),
    ],
)
def test_inconsistent_policies_are_rejected(changes: dict[str, object], message: str) -> None:
    arguments = {**POLICY.__dict__, **changes}
    with pytest.raises(ValueError, match=message):
        RotationPolicy(**arguments)  # type: ignore[arg-type]


def test_split_names_separates_ip_addresses() -> None:
    assert split_names(("svc", "127.0.0.1", "svc.ns.svc", "::1")) == ServingIdentity(
        dns_names=("svc", "svc.ns.svc"), ip_addresses=("127.0.0.1", "::1")
    )


def _trusts(bundle_state: CertificateState, serving_state: CertificateState, now: dt.datetime) -> bool:
    try:
        validate_serving_pair(pair=serving_state.serving, trusted=bundle_state.bundle, names=IDENTITY.names, now=now)
    except CertificateProblem:
        return False
    return True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.integers(min_value=1, max_value=20 * 60), min_size=60, max_size=120))
def test_rollouts_never_meet_an_untrusted_certificate(steps: list[int]) -> None:
    """Between two loop passes, the API server may still hold the previous bundle and a replica may still
    serve the previous certificate. Every such pairing must verify, across several CA rotations."""
    previous = fresh()
    now = T0
    cas_seen = {serial(previous.ca)}
    for seconds in steps:
        now += dt.timedelta(seconds=seconds)
        # The loop injects after each pass, so the decision sees the previous state's bundle injected.
        current, _ = step(stored_as(previous), now=now, injected=True)
        for bundle_state in (previous, current):
            for serving_state in (previous, current):
                assert _trusts(bundle_state, serving_state, now), (now, bundle_state.bundle, serving_state.serving)
        assert 1 <= len(current.bundle) <= 2
        again = decide(stored=stored_as(current), policy=POLICY, identity=IDENTITY, now=now, injected=True)
        assert not again.changes, again.reasons
        assert again.next_check > now
        cas_seen.add(serial(current.ca))
        previous = current
    if now - T0 > POLICY.ca_validity:
        assert len(cas_seen) >= 2, "the CA must have been rotated at least once"


def test_the_serving_certificate_moves_to_a_new_ca_only_once_every_shoot_has_applied_it() -> None:
    state = fresh()
    rotate_at = state.ca.certificate.not_valid_after_utc - POLICY.ca_rotate_before
    state, _ = step(stored_as(state), now=rotate_at - dt.timedelta(minutes=30))
    state, _ = step(stored_as(state), now=rotate_at)  # step 1: the new CA joins the bundle
    propagated = rotate_at + dt.timedelta(minutes=6)

    def at(now: dt.datetime, pending: tuple[str, ...]) -> Decision:
        stored = stored_as(state)
        return decide(stored=stored, policy=POLICY, identity=IDENTITY, now=now, injected=True, shoots_pending=pending)

    # A shoot whose API server may still hold the old bundle keeps the serving certificate on the old CA ...
    waiting = at(propagated, ("shoot--p--a",))
    assert not waiting.changes
    assert waiting.next_check <= propagated + POLICY.propagation_delay
    # ... until every shoot has applied it,
    assert at(propagated, ()).new_serving
    # ... or, for a shoot that never does (hibernated), until the wait's limit: well before the old CA expires.
    limit = rotate_at + POLICY.shoot_wait
    assert POLICY.shoot_wait == POLICY.ca_rotate_before / 4
    assert not at(limit - dt.timedelta(seconds=1), ("shoot--p--a",)).changes
    late = at(limit + dt.timedelta(seconds=1), ("shoot--p--a",))
    assert late.new_serving
    assert any("1 shoot(s) have not applied it" in reason and "shoot--p--a" in reason for reason in late.reasons)


def test_a_shoot_wait_limit_beyond_the_rotation_time_is_rejected() -> None:
    with pytest.raises(ValueError, match="shoot_wait_limit must be shorter than ca_rotate_before"):
        RotationPolicy(**{**POLICY.__dict__, "shoot_wait_limit": POLICY.ca_rotate_before})
