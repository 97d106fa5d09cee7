"""Who is MCM and who is the controller when one webhook serves many shoot namespaces: MCM's ServiceAccount
counts only in its own namespace; the controller may have several identities."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.annotations import annotation_errors, judge_annotations
from machine_preservation.core.admission.ca_guard import guard_mcm_marker
from machine_preservation.core.admission.deletion import (
    Assessment,
    DeletionRequest,
    Need,
    Outcome,
    ReadCluster,
    ReadMachineSet,
    Reads,
    assess_machine_deletion,
)
from machine_preservation.core.admission.settings import AdmissionSettings, service_account_username
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.preservation_record import PreservationRecord

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
A, B = "shoot--p--a", "shoot--p--b"
SEED_CONTROLLER = "system:serviceaccount:extension-mp-x1:gardener-extension-machine-preservation"
SHOOT_CONTROLLER = "system:serviceaccount:kube-system:machine-preservation"
SHOOT_MCM = "system:serviceaccount:kube-system:machine-controller-manager"
SETTINGS = AdmissionSettings(
    controller_username=SEED_CONTROLLER,
    more_controller_usernames=frozenset({SHOOT_CONTROLLER}),
    mcm_usernames=frozenset({SHOOT_MCM}),
    mcm_service_accounts=frozenset({"machine-controller-manager"}),
)


def mcm_of(namespace: str) -> str:
    return service_account_username(namespace, "machine-controller-manager")


def preserved_failed_machine(namespace: str, name: str = "m1") -> Machine:
    record = PreservationRecord(
        since=NOW - dt.timedelta(hours=1), until=NOW + dt.timedelta(hours=2), by=v.PreservedBy.USER
    )
    return Machine.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": record.annotations(),
                "ownerReferences": [{"kind": "MachineSet", "name": "ms", "uid": "u", "controller": True}],
            },
            "status": {"currentStatus": {"phase": "Failed"}},
        }
    )


NOTHING_READ = Reads()


def step(
    machine: Machine, username: str, *, namespace: str | None = None, reads: Reads = NOTHING_READ
) -> Assessment | Need:
    """The guard's answer with `reads` read."""
    request = DeletionRequest(machine=machine, username=username, settings=SETTINGS, now=NOW, namespace=namespace)
    return assess_machine_deletion(request, reads)


def judge(machine: Machine, username: str, *, namespace: str | None = None) -> Assessment:
    """The verdict with everything read (there is nothing)."""
    found = step(machine, username, namespace=namespace, reads=Reads(machine_set=None, cluster=None, extension=None))
    assert isinstance(found, Assessment), found
    return found


def test_mcm_of_a_namespace_is_guarded_on_its_own_machine_only() -> None:
    in_a = preserved_failed_machine(A)
    guarded = judge(in_a, mcm_of(A))
    assert guarded.outcome == Outcome.PRESERVED
    assert not guarded.allowed
    assert "preserved until" in guarded.message
    # The same username on namespace B's machine is not MCM's: a plain delete, not guarded.
    in_b = preserved_failed_machine(B)
    assert judge(in_b, mcm_of(A)).outcome == Outcome.NOT_GUARDED
    assert not judge(in_b, mcm_of(B)).allowed


def test_the_requests_namespace_wins_over_the_machines_metadata() -> None:
    """The shell passes the request's namespace; the machine's metadata is only the fallback."""
    in_a = preserved_failed_machine(A)
    assert judge(in_a, mcm_of(A), namespace=B).outcome == Outcome.NOT_GUARDED
    assert not judge(in_a, mcm_of(B), namespace=B).allowed
    # What the guard asks to read agrees with the verdict: nothing for somebody else's machine.
    assert step(in_a, mcm_of(A)) == ReadMachineSet(namespace=A, name="ms")
    assert isinstance(step(in_a, mcm_of(A), namespace=B), Assessment)
    assert step(in_a, mcm_of(A), reads=Reads(machine_set=None)) == ReadCluster(A)
    assert isinstance(step(in_a, mcm_of(A), namespace=B, reads=Reads(machine_set=None)), Assessment)
    # The request's namespace is also where the objects are read.
    assert step(in_a, mcm_of(B), namespace=B) == ReadMachineSet(namespace=B, name="ms")


def test_exact_mcm_usernames_count_in_every_namespace() -> None:
    for namespace in (A, B, None):
        assert SETTINGS.is_mcm(SHOOT_MCM, namespace=namespace)
    assert not judge(preserved_failed_machine(B), SHOOT_MCM).allowed


@pytest.mark.parametrize(
    ("username", "namespace", "expected"),
    [
        (mcm_of(A), A, True),
        (mcm_of(A), B, False),
        (mcm_of(A), None, False),  # a Node: no namespace, only exact usernames
        (mcm_of(A), "", False),
        (service_account_username(A, "someone-else"), A, False),
        (f"{mcm_of(A)}:x", A, False),
        ("system:serviceaccount:shoot--p--a:machine-controller-manager-x", A, False),
        ("system:serviceaccounts:shoot--p--a:machine-controller-manager", A, False),
        ("machine-controller-manager", A, False),
        (SHOOT_MCM, A, True),
    ],
)
def test_is_mcm_table(username: str, namespace: str | None, expected: bool) -> None:
    assert SETTINGS.is_mcm(username, namespace=namespace) is expected


def test_without_service_accounts_only_exact_usernames_count() -> None:
    plain = SETTINGS.model_copy(update={"mcm_service_accounts": frozenset()})
    assert not plain.is_mcm(mcm_of(A), namespace=A)
    assert plain.is_mcm(SHOOT_MCM, namespace=A)


namespaces = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)


@given(namespace=namespaces, other=namespaces, name=names, other_name=names)
def test_a_service_account_is_mcm_exactly_in_its_own_namespace(
    namespace: str, other: str, name: str, other_name: str
) -> None:
    settings = AdmissionSettings(mcm_usernames=frozenset(), mcm_service_accounts=frozenset({name}))
    assert settings.is_mcm(service_account_username(namespace, name), namespace=namespace)
    assert settings.is_mcm(service_account_username(namespace, name), namespace=other) is (other == namespace)
    assert settings.is_mcm(service_account_username(namespace, other_name), namespace=namespace) is (other_name == name)
    assert not settings.is_mcm(service_account_username(namespace, name), namespace=None)


def test_mcm_of_the_machines_namespace_may_change_its_marker_on_machines_only_there() -> None:
    marker = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    new = {marker: "true"}
    assert annotation_errors(old={}, new=new, username=mcm_of(A), settings=SETTINGS, namespace=A) == ()
    errors = annotation_errors(old={}, new=new, username=mcm_of(A), settings=SETTINGS, namespace=B)
    assert [str(e.path) for e in errors] == [f"metadata.annotations[{marker}]"]
    # A native MCM writes its own auto value on its own namespace's machines.
    native = SETTINGS.model_copy(update={"mcm_native_preservation": True})
    auto = {v.PRESERVE_ANNOTATION: v.UPSTREAM_AUTO_PRESERVE_VALUE}
    assert judge_annotations(
        subject='Machine "m1"', old={}, new=auto, username=mcm_of(A), settings=native, namespace=A
    ).allowed
    assert not judge_annotations(
        subject='Machine "m1"', old={}, new=auto, username=mcm_of(A), settings=native, namespace=B
    ).allowed


def test_a_namespaced_service_account_is_not_mcm_on_nodes() -> None:
    ours = v.CA_SCALE_DOWN_DISABLED_BY_PRESERVATION_ANNOTATION
    marker = v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION
    old = Node.model_validate({"metadata": {"name": "n1", "annotations": {ours: "true"}}})
    new = Node.model_validate({"metadata": {"name": "n1", "annotations": {ours: "true", marker: "true"}}})
    assert guard_mcm_marker(old_node=old, new_node=new, username=SHOOT_MCM, settings=SETTINGS).patch
    assert not guard_mcm_marker(old_node=old, new_node=new, username=mcm_of(A), settings=SETTINGS).patch


def test_every_controller_identity_is_the_controller_and_denials_name_them_all() -> None:
    assert SETTINGS.is_controller(SEED_CONTROLLER)
    assert SETTINGS.is_controller(SHOOT_CONTROLLER)
    assert not SETTINGS.is_controller(mcm_of(A))
    assert SETTINGS.controller_usernames == {SEED_CONTROLLER, SHOOT_CONTROLLER}
    auto = {v.PRESERVE_ANNOTATION: v.PreserveValue.AUTO.value}
    for controller in (SEED_CONTROLLER, SHOOT_CONTROLLER):
        assert judge_annotations(subject='Node "n1"', old={}, new=auto, username=controller, settings=SETTINGS).allowed
    denied = judge_annotations(subject='Node "n1"', old={}, new=auto, username="someone", settings=SETTINGS)
    assert f"({SEED_CONTROLLER}, {SHOOT_CONTROLLER})" in denied.message


def test_one_controller_identity_reads_as_before() -> None:
    single = AdmissionSettings(controller_username=SEED_CONTROLLER)
    assert single.controller_shown == SEED_CONTROLLER
    assert single.controller_usernames == {SEED_CONTROLLER}
    assert not single.is_controller(SHOOT_CONTROLLER)
    # Repeating the primary among the others changes nothing.
    repeated = single.model_copy(update={"more_controller_usernames": frozenset({SEED_CONTROLLER})})
    assert repeated.controller_shown == SEED_CONTROLLER
