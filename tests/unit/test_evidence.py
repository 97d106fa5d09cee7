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

NOW = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)


def build(**given: Any) -> e.Evidence:
    inputs: dict[str, Any] = {"node": {}, "events": [], "pods": [], "machine": {}} | given
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
        pods=pods,
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
