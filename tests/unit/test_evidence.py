"""The evidence document (issue #31 ask 3): its name, and the builder's bounds on any input."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from machine_preservation.core import evidence as e
from machine_preservation.core import vocabulary as v
from machine_preservation.core.models import Machine, Node
from machine_preservation.core.preservation_record import format_timestamp

NOW = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)


def build(**given: Any) -> e.Evidence:
    """The evidence of what the API served (the pods as a list's items, parsed as the controller caches them)."""
    inputs: dict[str, Any] = {"node": {}, "events": [], "pods": [], "machine": {}} | given
    inputs["pods"] = e.pods_of({"items": inputs["pods"]})
    return e.build_evidence(node_name=inputs.pop("node_name", "node-1"), captured_at=NOW, **inputs)


def event(minute: int, **fields: Any) -> dict[str, Any]:
    return {"reason": f"R{minute}", "lastTimestamp": f"2026-11-29T09:{minute:02d}:00Z"} | fields


def pod(index: int, **fields: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": f"pod-{index}",
            "creationTimestamp": f"2026-11-{index % 28 + 1:02d}T00:00:00Z",
        }
    } | fields


def test_a_real_failure_is_kept_whole() -> None:
    node = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastTransitionTime": "2026-11-29T09:50:00Z",
                    "lastHeartbeatTime": "2026-11-29T09:49:00Z",
                }
            ]
        }
    }
    events = [
        {
            "type": "Warning",
            "reason": "NodeNotReady",
            "message": "Node node-1 status is now: NodeNotReady",
            "count": 2,
            "firstTimestamp": "2026-11-29T09:40:00Z",
            "lastTimestamp": "2026-11-29T09:50:00Z",
            "source": {"component": "node-controller"},
        },
        {
            "type": "Normal",
            "reason": "Starting",
            "eventTime": "2026-11-29T09:00:00.123456Z",
            "series": {"count": 5, "lastObservedTime": "2026-11-29T09:30:00.000000Z"},
            "reportingComponent": "kubelet",
        },
    ]
    pods = [
        {
            "metadata": {
                "namespace": "shop",
                "name": "web-1",
                "creationTimestamp": "2026-11-28T00:00:00Z",
                "ownerReferences": [
                    {"kind": "Other", "name": "x"},
                    {"kind": "ReplicaSet", "name": "web-5d8", "controller": True},
                ],
            },
            "status": {
                "phase": "Running",
                "initContainerStatuses": [{"name": "init", "restartCount": 0, "state": {"terminated": {}}}],
                "containerStatuses": [
                    {
                        "name": "app",
                        "restartCount": 7,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {
                            "terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T09:45:00Z"}
                        },
                    }
                ],
            },
        }
    ]
    machine = {
        "metadata": {"name": "machine-1"},
        "status": {
            "currentStatus": {"phase": "Failed"},
            "lastOperation": {
                "description": "Machine machine-1 failed health check",
                "state": "Failed",
                "type": "HealthCheck",
                "lastUpdateTime": "2026-11-29T09:51:00Z",
            },
        },
    }
    evidence = build(node=node, events=events, pods=pods, machine=machine)
    assert evidence.version == e.EVIDENCE_VERSION
    assert evidence.node == "node-1"
    assert evidence.captured_at == NOW
    assert evidence.conditions == (
        e.ConditionEvidence(
            type="Ready",
            status="Unknown",
            reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.",
            last_transition_time=dt.datetime(2026, 11, 29, 9, 50, tzinfo=dt.UTC),
        ),
    )
    assert [x.reason for x in evidence.events] == ["NodeNotReady", "Starting"]
    assert evidence.events[0] == e.EventEvidence(
        type="Warning",
        reason="NodeNotReady",
        message="Node node-1 status is now: NodeNotReady",
        count=2,
        first_time=dt.datetime(2026, 11, 29, 9, 40, tzinfo=dt.UTC),
        last_time=dt.datetime(2026, 11, 29, 9, 50, tzinfo=dt.UTC),
        source="node-controller",
    )
    assert evidence.events[1].count == 5
    assert evidence.events[1].source == "kubelet"
    assert evidence.events[1].first_time == dt.datetime(2026, 11, 29, 9, 0, 0, 123456, tzinfo=dt.UTC)
    assert evidence.events[1].last_time == dt.datetime(2026, 11, 29, 9, 30, tzinfo=dt.UTC)
    (web,) = evidence.pods
    assert (web.namespace, web.name, web.owner_kind, web.owner_name, web.phase) == (
        "shop",
        "web-1",
        "ReplicaSet",
        "web-5d8",
        "Running",
    )
    assert web.containers == (
        e.ContainerEvidence(name="init", init=True, state="terminated"),
        e.ContainerEvidence(
            name="app",
            restart_count=7,
            state="waiting",
            state_reason="CrashLoopBackOff",
            last_termination_reason="OOMKilled",
            last_termination_exit_code=137,
            last_termination_finished_at=dt.datetime(2026, 11, 29, 9, 45, tzinfo=dt.UTC),
        ),
    )
    assert evidence.machine == e.MachineEvidence(
        name="machine-1",
        phase="Failed",
        last_operation=e.LastOperation(
            description="Machine machine-1 failed health check",
            state="Failed",
            type="HealthCheck",
            last_update_time=dt.datetime(2026, 11, 29, 9, 51, tzinfo=dt.UTC),
        ),
    )
    assert evidence.truncated == e.Truncated()


def test_the_stored_json_has_camel_case_keys_leaves_out_defaults_and_reads_back() -> None:
    evidence = build(
        events=[event(1, count=3)], machine={"status": {"lastOperation": {"lastUpdateTime": "2026-11-29T09:51:00Z"}}}
    )
    document = json.loads(e.to_json(evidence))
    assert document["capturedAt"] == "2026-11-29T10:00:00Z"
    assert document["events"][0]["lastTime"] == "2026-11-29T09:01:00Z"
    assert document["machine"]["lastOperation"]["lastUpdateTime"] == "2026-11-29T09:51:00Z"
    assert document["version"] == e.EVIDENCE_VERSION
    assert document["events"][0] == {"reason": "R1", "count": 3, "lastTime": "2026-11-29T09:01:00Z"}
    assert "truncated" not in document  # fields at their defaults are left out: nothing was cut
    cut = json.loads(e.to_json(build(events=[event(1, message="m" * 2000)])))
    assert cut["truncated"] == {"strings": 1}
    assert e.Evidence.model_validate_json(e.to_json(evidence)) == evidence


def test_a_document_of_another_version_still_reads() -> None:
    document = {"version": 2, "node": "n", "future": {"x": 1}, "events": [{"reason": "R", "new": True}]}
    evidence = e.Evidence.model_validate(document)
    assert (evidence.version, evidence.node, evidence.events[0].reason) == (2, "n", "R")


def test_events_are_the_newest_fifty_newest_first() -> None:
    events = [event(minute % 60, message=str(minute)) for minute in range(120)]
    evidence = build(events=events)
    assert len(evidence.events) == e.EVENT_LIMIT
    times = [x.last_time for x in evidence.events]
    assert times == sorted(times, reverse=True)  # type: ignore[type-var]
    assert times[0] == dt.datetime(2026, 11, 29, 9, 59, tzinfo=dt.UTC)
    assert evidence.truncated.events == 70


def test_an_event_without_a_time_comes_last() -> None:
    evidence = build(events=[{"reason": "Timeless"}, event(5)])
    assert [x.reason for x in evidence.events] == ["R5", "Timeless"]
    assert evidence.events[1].last_time is None


def test_pods_are_the_newest_two_hundred_containers_twenty_each() -> None:
    containers = [{"name": f"c{i}"} for i in range(15)]
    pods = [pod(i, status={"initContainerStatuses": containers, "containerStatuses": containers}) for i in range(250)]
    evidence = build(pods=pods)
    assert len(evidence.pods) == e.POD_LIMIT
    assert evidence.truncated.pods == 50
    assert all(len(p.containers) == e.CONTAINER_LIMIT for p in evidence.pods)
    assert [c.init for c in evidence.pods[0].containers] == [True] * 15 + [False] * 5
    assert evidence.truncated.containers == 200 * 10
    created = [p.created_at for p in evidence.pods]
    assert created == sorted(created, reverse=True)  # type: ignore[type-var]


def test_our_preserved_condition_is_left_out_as_no_part_of_the_failure() -> None:
    conditions = [{"type": "Ready", "status": "Unknown"}, {"type": v.PRESERVED_CONDITION_TYPE, "status": "True"}]
    evidence = build(node={"status": {"conditions": conditions}})
    assert [c.type for c in evidence.conditions] == ["Ready"]
    assert evidence.truncated.conditions == 0


def test_our_own_events_are_left_out_as_no_part_of_the_failure() -> None:
    ours = {"reason": "PreservationStarted", "source": {"component": v.EVENT_REPORTING_COMPONENT}}
    kubelet = {"reason": "NodeNotReady", "source": {"component": "kubelet"}}
    evidence = build(events=[ours, kubelet, {"reason": "X", "reportingComponent": v.EVENT_REPORTING_COMPONENT}])
    assert [x.reason for x in evidence.events] == ["NodeNotReady"]
    assert evidence.truncated.events == 0


def test_conditions_are_at_most_twenty() -> None:
    evidence = build(node={"status": {"conditions": [{"type": f"T{i}"} for i in range(25)]}})
    assert [c.type for c in evidence.conditions] == [f"T{i}" for i in range(20)]
    assert evidence.truncated.conditions == 5


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("message", "m" * 5000, e.MESSAGE_LIMIT),
        ("reason", "R" * 500, e.WORD_LIMIT),
        ("type", "T" * 500, e.WORD_LIMIT),
    ],
)
def test_strings_are_cut_and_counted(field: str, value: str, limit: int) -> None:
    evidence = build(node={"status": {"conditions": [{field: value}]}})
    assert getattr(evidence.conditions[0], field) == value[:limit]
    assert evidence.truncated.strings == 1


def test_a_long_node_name_is_cut() -> None:
    assert build(node_name="n" * 300).node == "n" * e.NAME_LIMIT


@pytest.mark.parametrize(
    "node",
    [
        None,
        [],
        "node",
        7,
        {"status": None},
        {"status": {"conditions": "many"}},
        {"status": {"conditions": [1, None, "x"]}},
    ],
)
def test_a_malformed_node_leaves_its_part_empty(node: object) -> None:
    evidence = build(node=node)
    assert all(c == e.ConditionEvidence() for c in evidence.conditions)


@pytest.mark.parametrize(
    "value",
    [
        {"type": 5, "reason": ["x"], "message": {"a": 1}, "count": True, "lastTimestamp": 1700000000},
        {"count": 10**100, "lastTimestamp": "yesterday"},
        {"lastTimestamp": "2026-11-29T09:00:00"},  # no zone: ambiguous
        {"lastTimestamp": "0001-01-01T00:00:00+01:00"},  # before year 1 in UTC
        {"lastTimestamp": "2026-11-29T09:00:00Z" + " " * 100},
    ],
)
def test_malformed_event_fields_read_as_empty(value: dict[str, Any]) -> None:
    (built,) = build(events=[value]).events
    assert (built.type, built.reason, built.message, built.count, built.last_time) == ("", "", "", 1, None)


def test_malformed_container_numbers_read_as_empty() -> None:
    status = {"containerStatuses": [{"restartCount": "7", "lastState": {"terminated": {"exitCode": 2**70}}}]}
    (container,) = build(pods=[pod(1, status=status)]).pods[0].containers
    assert (container.restart_count, container.last_termination_exit_code) == (0, None)


def test_a_lone_surrogate_is_replaced() -> None:
    evidence = build(events=[event(1, message="bad \ud800 text")])
    assert evidence.events[0].message == "bad ? text"
    assert e.size(evidence) < 1000


def test_oldest_events_and_pods_are_dropped_to_fit_and_said() -> None:
    events = [event(i % 60, message="\x00" * e.MESSAGE_LIMIT) for i in range(50)]  # ~6 KiB each as JSON
    pods = [pod(i, status={"containerStatuses": [{"name": "c" * 253}] * 20}) for i in range(200)]  # ~5 KiB each
    evidence = build(events=events, pods=pods)
    assert e.size(evidence) <= v.EVIDENCE_MAX_BYTES
    assert e.size(evidence) > v.EVIDENCE_MAX_BYTES - 10_000  # dropped only what it had to
    assert evidence.truncated.to_fit_size
    assert evidence.truncated.events == 50 - len(evidence.events) > 0
    assert evidence.truncated.pods == 200 - len(evidence.pods) > 0
    kept = build(events=events).events
    assert evidence.events == kept[: len(evidence.events)]  # the newest kept


def test_the_worst_input_fits_quickly() -> None:
    nul = "\x00" * 10_000  # six bytes each as JSON
    node = {"status": {"conditions": [{"type": nul, "status": nul, "reason": nul, "message": nul}] * 100}}
    events = [event(i % 60, type=nul, reason=nul, message=nul) for i in range(1_000_000)]
    containers = [{"name": nul, "state": {"waiting": {"reason": nul}}, "lastState": {"terminated": {"reason": nul}}}]
    pods = [{"metadata": {"namespace": nul, "name": nul}, "status": {"containerStatuses": containers * 50}}] * 100_000
    operation = {"description": nul, "state": nul, "type": nul}
    machine = {"metadata": {"name": nul}, "status": {"currentStatus": {"phase": nul}, "lastOperation": operation}}
    started = time.monotonic()
    evidence = build(node_name=nul, node=node, events=events, pods=pods, machine=machine, unavailable=[nul] * 100)
    elapsed = time.monotonic() - started
    assert e.size(evidence) <= v.EVIDENCE_MAX_BYTES
    assert evidence.truncated.to_fit_size
    assert len(evidence.unavailable) == e.UNAVAILABLE_LIMIT
    # Not a timing assertion on the machine's speed: the cut before any work is what bounds it (seconds, not
    # the minutes a million built events would take).
    assert elapsed < 60


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
_KEYS = st.sampled_from(
    [
        "type", "status", "reason", "message", "count", "lastTimestamp", "firstTimestamp", "eventTime", "series",
        "lastObservedTime", "source", "component", "metadata", "name", "namespace", "ownerReferences", "controller",
        "kind", "creationTimestamp", "phase", "containerStatuses", "initContainerStatuses", "restartCount", "state",
        "lastState", "terminated", "waiting", "exitCode", "finishedAt", "conditions", "lastTransitionTime",
        "currentStatus", "lastOperation", "description", "lastUpdateTime",
    ]
)  # fmt: skip
# Shapes close to the real ones, so the generated inputs reach past the first type checks.
_SHAPED = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=40)
    | st.sampled_from(["2026-11-29T09:00:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    node_name=st.text(max_size=300),
    node=_SHAPED | _JSON,
    events=_SHAPED | _JSON,
    pods=_SHAPED | _JSON,
    machine=_SHAPED | _JSON,
    unavailable=st.lists(st.text(max_size=40), max_size=12),
)
def test_any_input_gives_a_bounded_valid_document(
    node_name: str, node: object, events: object, pods: object, machine: object, unavailable: list[str]
) -> None:
    evidence = e.build_evidence(
        node_name=node_name,
        captured_at=NOW,
        node=node,
        events=events,
        pods=e.pods_of({"items": pods}),  # any list served, parsed as the controller caches pods
        machine=machine,
        unavailable=unavailable,
    )
    stored = e.to_json(evidence)
    assert len(stored.encode()) <= v.EVIDENCE_MAX_BYTES
    assert e.Evidence.model_validate(json.loads(stored)) == evidence


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    text=st.text(min_size=1, max_size=3000),
    events=st.integers(0, 300),
    pods=st.integers(0, 400),
    containers=st.integers(0, 30),
)
def test_big_inputs_always_fit(text: str, events: int, pods: int, containers: int) -> None:
    statuses = [{"name": text, "state": {"waiting": {"reason": text}}}] * containers
    evidence = build(
        node={"status": {"conditions": [{"message": text, "reason": text}] * 30}},
        events=[event(i % 60, message=text, reason=text) for i in range(events)],
        pods=[pod(i, status={"containerStatuses": statuses, "reason": text}) for i in range(pods)],
    )
    assert e.size(evidence) <= v.EVIDENCE_MAX_BYTES
    assert len(evidence.events) + evidence.truncated.events == events
    assert len(evidence.pods) + evidence.truncated.pods == pods


@pytest.mark.parametrize(
    ("node", "name"),
    [
        ("ip-10-0-1-2.eu-west-1.compute.internal", v.EVIDENCE_NAME_PREFIX + "ip-10-0-1-2.eu-west-1.compute.internal"),
        ("shoot--p--s-worker-z1-5d8-abcde", v.EVIDENCE_NAME_PREFIX + "shoot--p--s-worker-z1-5d8-abcde"),
    ],
)
def test_evidence_is_named_after_its_node(node: str, name: str) -> None:
    assert e.evidence_name(node) == name


@pytest.mark.parametrize("node", ["n" * 230, "Upper", "under_score", "trailing-", "", "a..b", "ü"])
def test_a_name_that_would_not_be_valid_is_hashed(node: str) -> None:
    name = e.evidence_name(node)
    assert name.startswith(v.EVIDENCE_NAME_PREFIX)
    assert len(name) == len(v.EVIDENCE_NAME_PREFIX) + 16
    assert e.evidence_name(node) == name
    assert e.evidence_name(node + "x") != name


def test_the_longest_name_that_fits_is_kept() -> None:
    node = "n" * (e.NAME_LIMIT - len(v.EVIDENCE_NAME_PREFIX))
    assert e.evidence_name(node) == v.EVIDENCE_NAME_PREFIX + node
    assert e.evidence_name(node + "n") != v.EVIDENCE_NAME_PREFIX + node + "n"


@given(st.text(max_size=300))
def test_any_node_gets_a_valid_configmap_name(node: str) -> None:
    name = e.evidence_name(node)
    assert len(name) <= 253
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name)


# --- keeping it -----------------------------------------------------------------------------------------------

NODE = "ip-10-0-1-2.ec2.internal"


def metadata(**changes: Any) -> dict[str, Any]:
    """An evidence ConfigMap's metadata as the controller writes it (then `changes`)."""
    written = e.evidence_config_map(node_name=NODE, node_uid="uid-1", evidence=build())["metadata"]
    return written | {"resourceVersion": "7"} | changes


def test_the_configmap_is_labelled_annotated_named_and_owned_by_the_node() -> None:
    evidence = build(node_name=NODE)
    config_map = e.evidence_config_map(node_name=NODE, node_uid="uid-1", evidence=evidence)
    assert config_map["metadata"] == {
        "name": v.EVIDENCE_NAME_PREFIX + NODE,
        "namespace": v.EVIDENCE_NAMESPACE,
        "labels": {v.EVIDENCE_LABEL: "true"},
        "annotations": {v.EVIDENCE_NODE_KEY: NODE},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}],
    }
    assert config_map["data"] == {v.EVIDENCE_DATA_KEY: e.to_json(evidence)}
    assert e.evidence_reference(NODE) == f"kube-system/{v.EVIDENCE_NAME_PREFIX}{NODE}"


def test_the_controllers_own_configmap_is_read_back() -> None:
    expires = "2026-11-30T10:00:00Z"
    found = e.stored_evidence(metadata(annotations={v.EVIDENCE_NODE_KEY: NODE, v.EVIDENCE_EXPIRES_KEY: expires}))
    assert found == e.StoredEvidence(
        name=v.EVIDENCE_NAME_PREFIX + NODE,
        node=NODE,
        resource_version="7",
        expires=dt.datetime(2026, 11, 30, 10, tzinfo=dt.UTC),
    )
    assert e.stored_evidence(metadata(annotations={v.EVIDENCE_NODE_KEY: NODE, v.EVIDENCE_EXPIRES_KEY: "soon"})) == (
        e.StoredEvidence(name=v.EVIDENCE_NAME_PREFIX + NODE, node=NODE, resource_version="7", expires=None)
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"labels": {}},
        {"labels": {v.EVIDENCE_LABEL: "yes"}},
        {"annotations": {}},
        {"annotations": {v.EVIDENCE_NODE_KEY: 5}},
        {"annotations": {v.EVIDENCE_NODE_KEY: "another-node"}},  # not named after its node
        {"name": "machine-preservation-evidence-x"},
        {"namespace": "default"},
        {"ownerReferences": []},
        {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "another-node"}]},
        {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": NODE}]},
        {"ownerReferences": "Node"},
    ],
)
def test_a_configmap_not_the_controllers_is_left_alone(changes: dict[str, Any]) -> None:
    assert e.stored_evidence(metadata(**changes)) is None


@pytest.mark.parametrize("value", [None, [], "metadata", 1])
def test_malformed_metadata_is_left_alone(value: object) -> None:
    assert e.stored_evidence(value) is None


def stored_evidence(node: str, expires: dt.datetime | None = None) -> e.StoredEvidence:
    return e.StoredEvidence(name=e.evidence_name(node), node=node, resource_version="1", expires=expires)


GRACE = dt.timedelta(hours=24)


def test_the_sweep_keeps_the_evidence_of_a_preserved_node() -> None:
    assert e.plan_sweep([stored_evidence("a")], preserved={"a"}, now=NOW, grace=GRACE) == []


def test_the_sweep_sets_the_expiry_once_the_preservation_ended() -> None:
    (sweep,) = e.plan_sweep([stored_evidence("a")], preserved=set(), now=NOW, grace=GRACE)
    assert sweep == e.Sweep(e.SweepAction.EXPIRE, stored_evidence("a"), expires=NOW + GRACE)


def test_the_sweep_waits_for_the_expiry_then_deletes() -> None:
    expiring = stored_evidence("a", expires=NOW + dt.timedelta(seconds=1))
    assert e.plan_sweep([expiring], preserved=set(), now=NOW, grace=GRACE) == []
    expired = stored_evidence("a", expires=NOW)
    assert e.plan_sweep([expired], preserved=set(), now=NOW, grace=GRACE) == [e.Sweep(e.SweepAction.DELETE, expired)]


def test_a_node_preserved_again_clears_the_expiry() -> None:
    expired = stored_evidence("a", expires=NOW - dt.timedelta(hours=1))
    assert e.plan_sweep([expired], preserved={"a"}, now=NOW, grace=GRACE) == [e.Sweep(e.SweepAction.RENEW, expired)]


def test_a_zero_grace_deletes_once_the_preservation_ended() -> None:
    ended = stored_evidence("a")
    assert e.plan_sweep([ended], preserved=set(), now=NOW, grace=dt.timedelta(0)) == [
        e.Sweep(e.SweepAction.DELETE, ended)
    ]


def test_the_sweep_judges_each_configmap_on_its_own() -> None:
    kept, ended = stored_evidence("kept"), stored_evidence("ended")
    expired = stored_evidence("expired", expires=NOW - dt.timedelta(seconds=1))
    sweeps = e.plan_sweep([kept, ended, expired], preserved={"kept"}, now=NOW, grace=GRACE)
    assert [(s.action, s.evidence.node) for s in sweeps] == [
        (e.SweepAction.EXPIRE, "ended"),
        (e.SweepAction.DELETE, "expired"),
    ]


@pytest.mark.parametrize(
    ("grace", "period"),
    [
        (dt.timedelta(hours=24), dt.timedelta(minutes=1)),
        (dt.timedelta(minutes=5), dt.timedelta(seconds=30)),
        (dt.timedelta(seconds=3), dt.timedelta(seconds=1)),
        (dt.timedelta(0), dt.timedelta(minutes=1)),
    ],
)
def test_the_sweep_period_follows_the_grace(grace: dt.timedelta, period: dt.timedelta) -> None:
    assert e.sweep_period(grace) == period


def machine(node: str, *, record: bool = False, expiry: dt.datetime | None = None) -> Machine:
    annotations = (
        {
            v.PRESERVED_SINCE_ANNOTATION: "2026-11-29T09:00:00Z",
            v.PRESERVED_UNTIL_ANNOTATION: "2026-11-30T09:00:00Z",
            v.PRESERVED_BY_ANNOTATION: v.PreservedBy.USER.value,
        }
        if record
        else {}
    )
    status = {"currentStatus": {"preserveExpiryTime": format_timestamp(expiry)}} if expiry else {}
    return Machine.model_validate(
        {"metadata": {"labels": {v.NODE_LABEL: node}, "annotations": annotations}, "status": status}
    )


def test_preserved_nodes_are_those_with_our_record_or_mcms_expiry_when_native() -> None:
    machines = [
        machine("ours", record=True),
        machine("mcms", expiry=NOW + dt.timedelta(hours=1)),
        machine("mcms-ended", expiry=NOW - dt.timedelta(seconds=1)),
        machine("none"),
        machine("", record=True),
    ]
    assert e.preserved_nodes(machines, now=NOW, native=True) == {"ours", "mcms"}
    assert e.preserved_nodes(machines, now=NOW, native=False) == {"ours"}


def test_evidence_captured_during_the_preservation_is_kept() -> None:
    since = NOW - dt.timedelta(minutes=5)
    assert e.captured_since(e.to_json(build()), since=since)
    assert e.captured_since(e.to_json(build()), since=NOW)
    assert not e.captured_since(e.to_json(build()), since=NOW + dt.timedelta(seconds=1))


@pytest.mark.parametrize("data", [None, 5, "", "not json", "[]", '{"capturedAt": "yesterday"}', "x" * 600_000])
def test_evidence_that_does_not_say_when_it_was_captured_is_replaced(data: object) -> None:
    assert not e.captured_since(data, since=NOW)


def test_an_objects_resource_version() -> None:
    assert e.resource_version({"metadata": {"resourceVersion": "42"}}) == "42"
    for obj in ({}, {"metadata": {"resourceVersion": 42}}, {"metadata": {"resourceVersion": ""}}, None):
        with pytest.raises(ValueError, match="resourceVersion"):
            e.resource_version(obj)


def native_machine(phase: str, expiry: dt.datetime | None) -> Machine:
    current: dict[str, Any] = {"phase": phase}
    if expiry is not None:
        current["preserveExpiryTime"] = format_timestamp(expiry)
    return Machine.model_validate({"status": {"currentStatus": current}})


def preserved_node(condition: dict[str, Any] | None) -> Node:
    return Node.model_validate({"metadata": {"name": "n"}, "status": {"conditions": [condition] if condition else []}})


SHOWN = {"type": v.PRESERVED_CONDITION_TYPE, "status": "True", "lastTransitionTime": "2026-11-29T09:30:00Z"}


def test_mcms_preservation_started_when_its_condition_turned() -> None:
    machine = native_machine("Failed", NOW + dt.timedelta(hours=1))
    assert e.natively_preserved_since(machine, preserved_node(SHOWN), now=NOW) == dt.datetime(
        2026, 11, 29, 9, 30, tzinfo=dt.UTC
    )
    assert e.natively_preserved_since(machine, preserved_node(None), now=NOW) == NOW  # not shown yet
    stopped = SHOWN | {"status": "False", "reason": v.ConditionReason.PRESERVATION_STOPPED.value}
    assert e.natively_preserved_since(machine, preserved_node(stopped), now=NOW) == NOW


@pytest.mark.parametrize(
    "machine",
    [
        native_machine("Running", NOW + dt.timedelta(hours=1)),  # preserved, not failed: nothing to capture
        native_machine("Failed", None),
        native_machine("Failed", NOW),  # expired
    ],
)
def test_no_capture_without_mcms_preservation_of_a_failed_machine(machine: Machine) -> None:
    assert e.natively_preserved_since(machine, preserved_node(SHOWN), now=NOW) is None
