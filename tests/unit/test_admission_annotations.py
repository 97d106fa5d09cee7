"""Who may write which preserve-related annotation (core.admission.annotations)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.annotations import annotation_errors, judge_annotations
from machine_preservation.core.admission.settings import AdmissionSettings

CONTROLLER = "system:serviceaccount:mp:controller"
MCM = "system:serviceaccount:kube-system:machine-controller-manager"
USER = "alice"
SETTINGS = AdmissionSettings(controller_username=CONTROLLER, mcm_usernames=frozenset({MCM}))
P = v.PRESERVE_ANNOTATION


def errors(old: dict[str, str] | None, new: dict[str, str], username: str = USER) -> list[str]:
    return [e.render() for e in annotation_errors(old=old, new=new, username=username, settings=SETTINGS)]


@pytest.mark.parametrize("value", ["", "now", "when-failed", "false"])
@pytest.mark.parametrize("username", [USER, CONTROLLER, MCM])
def test_user_values_are_allowed_for_everyone(value: str, username: str) -> None:
    assert errors(None, {P: value}, username) == []
    assert errors({}, {P: value}, username) == []


@pytest.mark.parametrize("value", ["Now", "NOW", " now", "now ", "when_failed", "true", "auto", "yes", "\t", "nöw"])
def test_anything_else_is_unsupported_and_listed(value: str) -> None:
    [message] = errors({}, {P: value})
    assert message.startswith(f"metadata.annotations[{P}]: Unsupported value: ")
    assert message.endswith('supported values: "", "now", "when-failed", "false"')


@pytest.mark.parametrize("value", ["auto-preserve", "auto-preserved"])
def test_the_auto_value_is_reserved_for_the_controller(value: str) -> None:
    assert errors({}, {P: value}, CONTROLLER) == []
    for username in (USER, MCM):
        [message] = errors({}, {P: value}, username)
        assert message == (
            f'metadata.annotations[{P}]: Forbidden: the value "{value}" is reserved for the preservation '
            f'controller ({CONTROLLER}); supported values: "", "now", "when-failed", "false"'
        )


def test_the_controller_may_not_write_garbage_either() -> None:
    assert len(errors({}, {P: "garbage"}, CONTROLLER)) == 1


def test_removing_the_annotation_is_always_allowed() -> None:
    assert errors({P: "auto-preserve"}, {}) == []
    assert errors({P: "now"}, {}) == []


@pytest.mark.parametrize("old_value", ["garbage", "auto-preserved", "Now"])
def test_unchanged_values_are_not_judged_again(old_value: str) -> None:
    assert errors({P: old_value, "other": "1"}, {P: old_value, "other": "2"}) == []


@pytest.mark.parametrize("key", v.CONTROLLER_OWNED_ANNOTATIONS)
@pytest.mark.parametrize(
    ("old", "new"),
    [({}, {"k": "x"}), ({"k": "x"}, {"k": "y"}), ({"k": "x"}, {}), (None, {"k": ""})],
)
def test_controller_markers_change_only_through_the_controller(
    key: str, old: dict[str, str] | None, new: dict[str, str]
) -> None:
    before = {key: old["k"]} if old else ({} if old is not None else None)
    after = {key: new["k"]} if new else {}
    assert errors(before, after, CONTROLLER) == []
    [message] = errors(before, after, USER)
    assert message == (
        f"metadata.annotations[{key}]: Forbidden: only the preservation controller ({CONTROLLER}) "
        "may set, change or remove it"
    )
    assert errors(before, after, MCM) == ([] if key == v.CA_SCALE_DOWN_DISABLED_BY_MCM_ANNOTATION else [message])


@pytest.mark.parametrize("key", v.CONTROLLER_OWNED_ANNOTATIONS)
def test_unchanged_markers_pass(key: str) -> None:
    assert errors({key: "3"}, {key: "3", P: "now"}) == []


def test_every_error_is_reported_at_once_and_the_object_named() -> None:
    verdict = judge_annotations(
        subject='Node "n1"',
        old={},
        new={P: "forever", v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "now"},
        username=USER,
        settings=SETTINGS,
    )
    assert not verdict.allowed
    assert verdict.code == 403
    assert verdict.message.startswith('Node "n1": [metadata.annotations[node.machine.sapcloud.io/preserve]: ')
    assert '"forever"' in verdict.message
    assert f"metadata.annotations[{v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION}]: Forbidden" in verdict.message


def test_an_allowed_change_gives_an_allowed_verdict() -> None:
    verdict = judge_annotations(subject='Machine "m"', old=None, new={P: "now"}, username=USER, settings=SETTINGS)
    assert verdict.allowed
    assert verdict.message == ""


annotation_maps = st.dictionaries(
    st.sampled_from([P, *v.CONTROLLER_OWNED_ANNOTATIONS, "other", "x/y"]),
    st.sampled_from(["", "now", "when-failed", "false", "auto-preserve", "auto-preserved", "Now", " ", "1"]),
)


@given(old=annotation_maps, new=annotation_maps, username=st.sampled_from([USER, CONTROLLER, MCM]))
def test_properties_of_the_annotation_rules(old: dict[str, str], new: dict[str, str], username: str) -> None:
    found = annotation_errors(old=old, new=new, username=username, settings=SETTINGS)
    # deterministic
    assert found == annotation_errors(old=old, new=new, username=username, settings=SETTINGS)
    # the controller is only ever refused invalid preserve values
    if username == CONTROLLER:
        assert all(str(e.path).endswith(f"[{P}]") for e in found)
    # no change, no error
    assert annotation_errors(old=new, new=new, username=username, settings=SETTINGS) == ()
    # only keys that changed are mentioned
    changed = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
    assert {str(e.path)[len("metadata.annotations[") : -1] for e in found} <= changed


NATIVE = SETTINGS.model_copy(update={"mcm_native_preservation": True})


def test_a_native_mcm_may_write_its_own_auto_value_and_last_applied_record() -> None:
    def native(old: dict[str, str] | None, new: dict[str, str], username: str) -> list[str]:
        return [e.render() for e in annotation_errors(old=old, new=new, username=username, settings=NATIVE)]

    own = {P: "auto-preserved", v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: "when-failed"}
    assert native({}, own, MCM) == []
    assert native(own, {P: "auto-preserved", v.LAST_APPLIED_NODE_PRESERVE_ANNOTATION: ""}, MCM) == []
    assert native(own, {}, MCM) == []
    # Our spelling, our record and our other markers stay the controller's; users are refused as before.
    assert len(native({}, {P: "auto-preserve"}, MCM)) == 1
    for key in (v.PRESERVED_SINCE_ANNOTATION, v.LAST_MACHINE_PRIORITY_ANNOTATION):
        assert len(native({}, {key: "x"}, MCM)) == 1
    assert len(native({}, own, USER)) == 2
    # Without native preservation, MCM is refused both, as any user is.
    assert len(errors({}, own, MCM)) == 2


@given(old=annotation_maps, new=annotation_maps, username=st.sampled_from([USER, CONTROLLER, MCM]))
def test_native_mode_only_ever_widens_what_mcm_may_do(old: dict[str, str], new: dict[str, str], username: str) -> None:
    native = annotation_errors(old=old, new=new, username=username, settings=NATIVE)
    classic = annotation_errors(old=old, new=new, username=username, settings=SETTINGS)
    if username == MCM:
        assert set(native) <= set(classic)
    else:
        assert native == classic
