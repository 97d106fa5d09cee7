"""The kubectl plugin's pure parts: a Node's row (every column, malformed and huge values), time left, sorting,
the JSON/YAML structure, the tables, the seed's rows and budgets, the evidence as text, and what an API answer
means (message and exit code)."""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from machine_preservation.cli.kubectl import evidence_view, view
from machine_preservation.cli.kubectl.outcomes import ExitCode, answer_error, cut, denial, status_message
from machine_preservation.cli.kubectl.plugin import build_parser, run
from machine_preservation.core import vocabulary as v
from machine_preservation.core.evidence import Evidence, PodEvidence, build_evidence, pods_of, to_json
from machine_preservation.core.gardener.cluster import ClusterView

NOW = dt.datetime(2026, 11, 29, 10, 0, 0, tzinfo=dt.UTC)
P = v.PRESERVE_ANNOTATION


def node(
    name: str = "n1",
    annotations: dict[str, Any] | None = None,
    *,
    labels: dict[str, Any] | None = None,
    ready: str | None = "True",
    conditions: list[Any] | None = None,
) -> dict[str, Any]:
    found = conditions if conditions is not None else ([{"type": "Ready", "status": ready}] if ready else [])
    return {
        "metadata": {
            "name": name,
            "labels": {v.MCM_MACHINE_NAME_LABEL: f"m-{name}"} if labels is None else labels,
            "annotations": annotations or {},
        },
        "status": {"conditions": found},
    }


def preserved(by: str = "user", until: dt.timedelta = dt.timedelta(hours=2), **more: str) -> dict[str, str]:
    return {
        v.PRESERVED_SINCE_ANNOTATION: "2026-11-29T09:00:00Z",
        v.PRESERVED_UNTIL_ANNOTATION: (NOW + until).strftime("%Y-%m-%dT%H:%M:%SZ"),
        v.PRESERVED_BY_ANNOTATION: by,
        **more,
    }


# --- Times -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (-5, "0s"),
        (59, "59s"),
        (60, "1m"),
        (61, "1m1s"),
        (599, "9m59s"),
        (601, "10m"),
        (3600, "1h"),
        (3660, "1h1m"),
        (86400, "1d"),
        (90000, "1d1h"),
        (30 * 86400 + 59, "30d"),
    ],
)
def test_short_duration_is_kubectls_age(seconds: int, shown: str) -> None:
    assert view.short_duration(seconds) == shown


def test_time_left_says_expired_and_none() -> None:
    assert view.time_left(None) == "-"
    assert view.time_left(0) == "expired"
    assert view.time_left(-10) == "expired"
    assert view.time_left(125) == "2m5s"


# --- A Node's row ------------------------------------------------------------------------------------------


def test_a_user_preservation_fills_every_column() -> None:
    raw = node(annotations={P: "now", v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true", **preserved()})
    row = view.node_row(raw, NOW)
    assert row.cells(wide=False) == [
        "n1",
        "now",
        "2026-11-29T09:00:00Z",
        "2026-11-29T12:00:00Z",
        "2h",
        "True",
        "-",
        "yes",
    ]
    assert row.cells(wide=True)[8:] == ["user", "m-n1", "-"]
    assert row.structure() == {
        "node": "n1",
        "machine": "m-n1",
        "value": "now",
        "preservedBy": "user",
        "since": "2026-11-29T09:00:00Z",
        "until": "2026-11-29T12:00:00Z",
        "secondsLeft": 7200,
        "ready": "True",
        "drain": {"state": None, "podsLeft": None, "blockedBy": []},
        "scaleDownProtected": True,
        "evidence": None,
    }


@pytest.mark.parametrize(
    ("annotations", "value"),
    [
        ({P: "now"}, "now"),
        ({P: "when-failed"}, "when-failed"),
        ({P: "false"}, "false"),
        ({P: "auto-preserve"}, "auto"),
        ({P: "auto-preserved"}, "auto"),
        ({P: "when-failed", v.PRESERVED_BY_ANNOTATION: "auto"}, "auto"),
        ({P: "forever"}, "forever"),
        ({v.PRESERVED_BY_ANNOTATION: "user"}, None),
        ({P: ""}, None),
    ],
)
def test_the_value_column(annotations: dict[str, str], value: str | None) -> None:
    assert view.node_row(node(annotations=annotations), NOW).value == value


@pytest.mark.parametrize(
    ("annotations", "drain", "wide"),
    [
        ({}, "-", "-"),
        ({v.PRESERVED_DRAIN_ANNOTATION: "draining"}, "draining", "draining"),
        ({v.PRESERVED_DRAIN_ANNOTATION: "drained"}, "drained", "drained"),
        ({v.PRESERVED_DRAIN_ANNOTATION: "failed"}, "failed", "failed"),
        (
            {v.PRESERVED_DRAIN_ANNOTATION: "failed", v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "1"},
            "1 pod left",
            "1 pod left",
        ),
        (
            {
                v.PRESERVED_DRAIN_ANNOTATION: "failed",
                v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "3",
                v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: "a/x,b/y",
            },
            "waiting on PDB a/x +1, 3 pods left",
            "waiting on PDB a/x, b/y, 3 pods left",
        ),
        (
            {v.PRESERVED_DRAIN_ANNOTATION: "failed", v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: " web/pdb ,"},
            "waiting on PDB web/pdb",
            "waiting on PDB web/pdb",
        ),
        (
            {v.PRESERVED_DRAIN_ANNOTATION: "failed", v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "-2"},
            "failed",
            "failed",
        ),
        (
            {v.PRESERVED_DRAIN_ANNOTATION: "failed", v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION: "٣"},
            "failed",
            "failed",
        ),
        ({v.PRESERVED_DRAIN_ANNOTATION: "sideways"}, "sideways", "sideways"),
    ],
)
def test_the_drain_column(annotations: dict[str, str], drain: str, wide: str) -> None:
    row = view.node_row(node(annotations=annotations), NOW)
    assert row.drain.cell(wide=False) == drain
    assert row.drain.cell(wide=True) == wide


def test_blocked_by_keeps_at_most_the_controllers_limit() -> None:
    names = ",".join(f"ns/pdb-{index}" for index in range(50))
    drain = view.read_drain({v.PRESERVED_DRAIN_ANNOTATION: "failed", v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: names})
    assert len(drain.blocked_by) == v.DRAIN_BLOCKED_BY_LIMIT


def test_huge_and_malformed_values_are_cut_and_shown_not_raised() -> None:
    huge = "x" * 1_000_000
    raw = node(
        annotations={
            P: huge,
            v.PRESERVED_SINCE_ANNOTATION: "yesterday",
            v.PRESERVED_UNTIL_ANNOTATION: huge,
            v.PRESERVED_BY_ANNOTATION: huge,
            v.PRESERVED_DRAIN_ANNOTATION: huge,
            v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION: huge,
            v.PRESERVED_EVIDENCE_ANNOTATION: huge,
            "ignored": 5,
        },
        labels={v.MCM_MACHINE_NAME_LABEL: huge, "n": None},
    )
    row = view.node_row(raw, NOW)
    assert all(len(cell) <= 2 * view.CELL_LIMIT for cell in row.cells(wide=False))
    assert all(len(cell) <= view.STRUCTURED_LIMIT for cell in row.cells(wide=True))
    assert len(json.dumps(row.structure())) < 4 * 1024
    assert row.since.shown == "invalid: yesterday"
    assert row.seconds_left is None
    assert row.cells(wide=False)[4] == "-"


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"metadata": None, "status": "x"},
        {"metadata": {"annotations": ["a"], "labels": "b", "name": 5}, "status": {"conditions": {"type": "Ready"}}},
        {"metadata": {"name": "n"}, "status": {"conditions": [None, 5, {"status": "True"}]}},
    ],
)
def test_any_shape_of_node_gives_a_row(raw: dict[str, Any]) -> None:
    row = view.node_row(raw, NOW)
    assert row.ready == "Unknown"
    assert row.value is None
    assert not view.is_marked(raw)


@pytest.mark.parametrize(
    ("spec", "tainted"),
    [
        ({"taints": [{"key": v.PRESERVED_TAINT_KEY, "effect": "NoSchedule"}]}, True),
        ({"taints": [{"key": v.PRESERVED_TAINT_KEY, "effect": "NoExecute"}]}, False),
        ({"taints": [None, 5, {"key": 7}]}, False),
        ({"taints": "x"}, False),
        (None, False),
    ],
)
def test_tainted_reads_the_preserved_taint(spec: Any, tainted: bool) -> None:
    assert view.tainted({"spec": spec}) is tainted


def test_ready_reads_the_condition() -> None:
    assert view.node_row(node(ready="False"), NOW).ready == "False"
    assert view.node_row(node(ready=None), NOW).ready == "Unknown"


def test_marked_nodes_carry_a_value_or_a_controller_field() -> None:
    assert view.is_marked(node(annotations={P: "now"}))
    assert view.is_marked(node(annotations={P: "false"}))
    assert not view.is_marked(node(annotations={P: ""}))
    assert not view.is_marked(node(annotations={v.CA_SCALE_DOWN_DISABLED_ANNOTATION: "true"}))
    for key in (*v.NODE_PRESERVATION_ANNOTATIONS, *v.NODE_DRAIN_ANNOTATIONS, v.PRESERVED_EVIDENCE_ANNOTATION):
        assert view.is_marked(node(annotations={key: ""})), key
    rows = view.marked_rows([node("a", {P: "now"}), node("b"), node("c", preserved())], NOW)
    assert [r.node for r in rows] == ["a", "c"]


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("n1", True),
        ("ip-10-0-0-1.eu-west-1.compute.internal", True),
        ("shoot--p--s", True),
        ("a" * 253, True),
        ("a" * 254, False),
        ("", False),
        ("../namespaces/kube-system/secrets/x", False),
        ("n1?dryRun=All", False),
        ("N1", False),
        ("-n1", False),
    ],
)
def test_only_object_names_go_into_a_url(name: str, valid: bool) -> None:
    assert view.is_object_name(name) is valid


def test_the_command_line_refuses_what_is_no_object_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(["show", "../secrets"])
    assert exit_info.value.code == ExitCode.USAGE
    assert "'../secrets' is not a valid node name" in capsys.readouterr().err


def test_machine_of_needs_mcms_label() -> None:
    assert view.machine_of(node(labels={v.MCM_MACHINE_NAME_LABEL: "m"})) == "m"
    assert view.machine_of(node(labels={})) is None
    assert view.machine_of(node(labels={v.MCM_MACHINE_NAME_LABEL: ""})) is None


def test_sorting_by_name_and_by_time_left() -> None:
    rows = [
        view.node_row(node("c", preserved(until=dt.timedelta(hours=1))), NOW),
        view.node_row(node("a", {P: "when-failed"}), NOW),
        view.node_row(node("b", preserved(until=dt.timedelta(minutes=5))), NOW),
        view.node_row(node("d", preserved(until=dt.timedelta(minutes=-5))), NOW),
    ]
    assert [r.node for r in view.sorted_rows(rows, "name")] == ["a", "b", "c", "d"]
    assert [r.node for r in view.sorted_rows(rows, "left")] == ["d", "b", "c", "a"]


def test_the_list_structure_is_versioned() -> None:
    rows = [view.node_row(node(annotations={P: "now"}), NOW)]
    document = view.list_structure(rows)
    assert document["kind"] == "NodePreservationList"
    assert document["version"] == "v1"
    assert [item["node"] for item in document["items"]] == ["n1"]


# --- Tables ------------------------------------------------------------------------------------------------


def test_tables_align_columns_three_spaces_apart() -> None:
    assert view.table(("A", "BB"), [["xyz", "1"], ["q", "22"]]) == "A     BB\nxyz   1\nq     22"
    assert view.table(("A", "B"), []) == "A   B"


def test_the_list_table_and_a_watch_line() -> None:
    row = view.node_row(node(annotations={P: "now"}), NOW)
    lines = view.list_table([row], wide=False).splitlines()
    assert lines[0].split("   ")[:2] == ["NODE", "VALUE"]
    assert "PRESERVED-BY" in view.list_table([row], wide=True)
    assert view.change_line(row, wide=False, deleted=False).split("\t") == row.cells(wide=False)
    assert view.change_line(row, wide=False, deleted=True).split("\t")[5] == "deleted"


def event(kind: str, obj: dict[str, Any], version: str = "7") -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = version
    return {"type": kind, "object": obj}


def test_a_watch_prints_a_row_only_when_a_column_changes() -> None:
    shown: dict[str, view.NodeRow] = {}
    version, change = view.follow(event("ADDED", node("a")), shown, "1", NOW)
    assert (version, change, shown) == ("7", None, {})  # not marked: nothing to show
    version, change = view.follow(event("MODIFIED", node("a", {P: "now"}), "8"), shown, version, NOW)
    assert version == "8"
    assert change is not None
    assert (change.kind, change.row.value) == ("ADDED", "now")
    marked = node("a", {P: "now"})
    marked["metadata"]["labels"]["unrelated"] = "x"
    assert view.follow(event("MODIFIED", marked, "9"), shown, version, NOW) == ("9", None)
    version, change = view.follow(event("MODIFIED", node("a", {P: "when-failed"}), "10"), shown, "9", NOW)
    assert change is not None
    assert (change.kind, change.row.value) == ("MODIFIED", "when-failed")
    version, change = view.follow(event("MODIFIED", node("a"), "11"), shown, version, NOW)
    assert change is not None
    assert (change.kind, change.row.value, shown) == ("MODIFIED", None, {})  # no longer marked: said once
    assert view.follow(event("MODIFIED", node("a"), "12"), shown, version, NOW) == ("12", None)


def test_a_watch_says_deleted_and_follows_bookmarks_and_errors() -> None:
    shown = {"a": view.node_row(node("a", {P: "now"}), NOW)}
    version, change = view.follow(event("DELETED", node("a", {P: "now"}), "20"), shown, "19", NOW)
    assert change is not None
    assert (version, change.kind, shown) == ("20", "DELETED", {})
    assert view.follow(event("DELETED", node("b"), "21"), shown, version, NOW) == ("21", None)
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "30"}}}
    assert view.follow(bookmark, shown, "21", NOW) == ("30", None)
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
    assert view.follow(gone, shown, "30", NOW) == ("", None)
    assert view.follow({"type": "MODIFIED", "object": None}, shown, "30", NOW) == ("30", None)


def test_a_new_list_reports_what_changed_meanwhile() -> None:
    kept, changed, gone = (view.node_row(node(n, {P: "now"}), NOW) for n in ("a", "b", "c"))
    shown = {"a": kept, "b": changed, "c": gone}
    new_b = view.node_row(node("b", {P: "false"}), NOW)
    new_d = view.node_row(node("d", {P: "now"}), NOW)
    changes = view.relisted(shown, [kept, new_b, new_d])
    assert [(c.kind, c.row.node) for c in changes] == [("MODIFIED", "b"), ("MODIFIED", "d"), ("DELETED", "c")]
    assert shown == {"a": kept, "b": new_b, "d": new_d}


def test_registers_webhook_looks_at_every_configuration() -> None:
    names = frozenset({"w.example"})
    assert view.registers_webhook([{"webhooks": [{"name": "other"}]}, {"webhooks": [{"name": "w.example"}]}], names)
    assert not view.registers_webhook([{"webhooks": None}, {}, {"webhooks": ["x", {"name": "other"}]}], names)


# --- The seed ----------------------------------------------------------------------------------------------


def machine(
    name: str, annotations: dict[str, str], *, machine_set: str = "ms", phase: str = "Running"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": {v.NODE_LABEL: f"node-{name}"},
            "ownerReferences": [{"kind": "MachineSet", "name": machine_set, "controller": True}],
        },
        "status": {"currentStatus": {"phase": phase}},
    }


def test_machine_rows_show_records_and_marks_only() -> None:
    record = preserved(by="auto", **{v.PRESERVED_DRAIN_ANNOTATION: "drained"})
    auto = view.machine_row(machine("m1", record, phase="Failed"), NOW)
    assert auto is not None
    assert auto.cells() == [
        "m1",
        "node-m1",
        "Failed",
        "-",
        "auto",
        "2026-11-29T09:00:00Z",
        "2026-11-29T12:00:00Z",
        "2h",
        "drained",
        "ms",
    ]
    assert view.machine_row(machine("m2", {}), NOW) is None
    marked = view.machine_row(machine("m3", {P: "auto-preserved"}), NOW)
    assert marked is not None
    assert marked.value == "auto"
    damaged = view.machine_row(machine("m4", {v.PRESERVED_SINCE_ANNOTATION: "x"}), NOW)
    assert damaged is not None
    assert damaged.cells()[7] == "damaged record"
    assert damaged.structure()["damagedRecord"] is True


def test_budgets_count_the_auto_preserved_machines_of_each_machine_set() -> None:
    machines = [
        row
        for row in (
            view.machine_row(machine("a", preserved(by="auto"), machine_set="ms-1"), NOW),
            view.machine_row(machine("b", preserved(by="user"), machine_set="ms-1"), NOW),
            view.machine_row(machine("c", preserved(by="auto"), machine_set="ms-2"), NOW),
        )
        if row is not None
    ]
    machine_sets = [
        {"metadata": {"name": "ms-1"}, "spec": {"autoPreserveFailedMachineMax": 2}, "status": {}},
        {"metadata": {"name": "ms-2"}, "spec": {}, "status": {"autoPreserveFailedMachineCount": 1}},
        {"metadata": {"name": "ms-3"}, "spec": {}},
        {
            "metadata": {
                "name": "ms-4",
                "ownerReferences": [{"kind": "MachineDeployment", "name": "md", "controller": True}],
            },
            "spec": {},
        },
    ]
    deployments = [{"metadata": {"name": "md"}, "spec": {"autoPreserveFailedMachineMax": 1}}]
    rows = view.budget_rows(
        machine_sets=machine_sets, machine_deployments=deployments, machines=machines, cluster=ClusterView()
    )
    assert [r.cells() for r in rows] == [
        ["ms-1", "2", "1", "-", "MachineSet ms-1 spec.autoPreserveFailedMachineMax: 2"],
        ["ms-2", "0", "1", "1", "default: 0"],
        ["ms-4", "1", "0", "-", "MachineDeployment md spec.autoPreserveFailedMachineMax: 1"],
    ]
    structure = view.seed_structure("shoot--p--s", machines, rows)
    assert structure["kind"] == "MachinePreservationList"
    assert structure["machineSets"][0] == {
        "machineSet": "ms-1",
        "autoPreserveFailedMachineMax": 2,
        "source": "MachineSet ms-1 spec.autoPreserveFailedMachineMax: 2",
        "autoPreserved": 1,
        "mcmAutoPreservedCount": None,
    }


# --- The evidence ------------------------------------------------------------------------------------------


def config_map(data: Any, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"annotations": annotations or {}}, "data": data}


def test_read_evidence_says_why_there_is_none() -> None:
    assert evidence_view.read_evidence("ns/x", None).problem == "none recorded"
    assert evidence_view.read_evidence("ns/x", config_map({})).problem == f"cannot be read: no {v.EVIDENCE_DATA_KEY}"
    bad = evidence_view.read_evidence("ns/x", config_map({v.EVIDENCE_DATA_KEY: "{"}))
    assert bad.problem is not None
    assert bad.problem.startswith("cannot be read: ")
    wrong = evidence_view.read_evidence("ns/x", config_map({v.EVIDENCE_DATA_KEY: '{"pods": 5}'}))
    assert wrong.evidence is None
    assert wrong.problem is not None


def sample_evidence() -> str:
    stamp = "2026-11-29T09:30:00Z"
    return to_json(
        build_evidence(
            node_name="n1",
            captured_at=dt.datetime(2026, 11, 29, 9, 30, tzinfo=dt.UTC),
            node={"status": {"conditions": [{"type": "Ready", "status": "False", "message": "PLEG is not healthy"}]}},
            events=[{"type": "Warning", "reason": "NodeNotReady", "message": "not ready", "lastTimestamp": stamp}],
            pods=pods_of(
                {
                    "items": [
                        {
                            "metadata": {"namespace": "web", "name": "web-0"},
                            "status": {
                                "phase": "Running",
                                "containerStatuses": [
                                    {
                                        "name": "app",
                                        "restartCount": 4,
                                        "state": {"running": {}},
                                        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                                    },
                                    {"name": "quiet", "restartCount": 0, "state": {"running": {}}},
                                ],
                            },
                        }
                    ]
                }
            ),
            machine={"status": {"lastOperation": {"type": "HealthCheck", "state": "Failed", "description": "down"}}},
            unavailable=["events: forbidden"],
        )
    )


def test_the_evidence_as_text() -> None:
    state = evidence_view.read_evidence(
        "kube-system/e",
        config_map({v.EVIDENCE_DATA_KEY: sample_evidence()}, {v.EVIDENCE_EXPIRES_KEY: "2026-12-01T00:00:00Z"}),
    )
    raw = node(annotations={P: "when-failed", **preserved()})
    raw["status"]["conditions"].append({"type": "Preserved", "status": "True", "reason": "Preserved by user."})
    raw["spec"] = {
        "taints": [{"key": "other", "effect": "NoSchedule"}, {"key": v.PRESERVED_TAINT_KEY, "effect": "NoSchedule"}]
    }
    text = evidence_view.show_text(view.node_row(raw, NOW), raw, state, NOW)
    for expected in (
        "Node:                  n1",
        "Since:                 2026-11-29T09:00:00Z (1h ago)",
        "Until:                 2026-11-29T12:00:00Z (2h left)",
        "Preserved condition:   True, Preserved by user.",
        f"Tainted:               {v.PRESERVED_TAINT_KEY}:NoSchedule",
        "Evidence:              kube-system/e, captured 2026-11-29T09:30:00Z (30m ago)",
        "Evidence deleted at:   2026-12-01T00:00:00Z",
        "PLEG is not healthy",
        "NodeNotReady",
        "web/web-0",
        "app: running, last OOMKilled (137)",
        "HealthCheck Failed at -",
        "  down",
        "Not recorded:",
        "  events: forbidden",
    ):
        assert expected in text, expected
    assert "quiet" not in text  # a container that never restarted has no termination to tell


def test_a_pod_already_terminating_at_the_failure_is_said() -> None:
    pod = PodEvidence(
        namespace="web", name="web-1", phase="Running", deleted_at=dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
    )
    state = evidence_view.EvidenceState(where="kube-system/e", evidence=Evidence(version=1, node="n1", pods=(pod,)))
    lines = evidence_view.evidence_lines(state, dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC))
    assert "Running, terminating" in "\n".join(lines)


def test_no_evidence_and_truncation_are_said() -> None:
    raw = node(annotations={P: "now"})
    row = view.node_row(raw, NOW)
    none = evidence_view.show_text(row, raw, evidence_view.read_evidence("kube-system/e", None), NOW)
    assert "Evidence:              none recorded (kube-system/e)" in none
    assert "Tainted:               no" in none
    document = json.loads(sample_evidence())
    document["truncated"] = {"events": 3, "toFitSize": True}
    document["events"], document["pods"] = [], []
    state = evidence_view.read_evidence("kube-system/e", config_map({v.EVIDENCE_DATA_KEY: json.dumps(document)}))
    text = evidence_view.show_text(row, raw, state, NOW)
    assert "Left out of the evidence (to fit the size limit): 3 events" in text
    assert "Events (newest first):\n  none" in text


def test_the_show_structure() -> None:
    raw = node(annotations={P: "now"})
    state = evidence_view.read_evidence("kube-system/e", config_map({v.EVIDENCE_DATA_KEY: sample_evidence()}))
    document = evidence_view.show_structure(view.node_row(raw, NOW), raw, state)
    assert document["kind"] == "NodePreservation"
    assert document["tainted"] is False
    assert document["conditions"][0]["type"] == "Ready"
    assert document["evidence"]["configMap"] == "kube-system/e"
    assert document["evidence"]["document"]["pods"][0]["name"] == "web-0"
    json.dumps(document)


# --- Answers and exit codes --------------------------------------------------------------------------------


def status(message: str, code: int) -> bytes:
    return json.dumps({"kind": "Status", "message": message, "code": code}).encode()


@pytest.mark.parametrize(
    ("code", "message", "exit_code"),
    [
        (401, "error: you must be logged in to the server (Unauthorized)", ExitCode.FORBIDDEN),
        (403, 'you may not get configmaps "e" in namespace "kube-system": no', ExitCode.FORBIDDEN),
        (404, 'configmaps "e" in namespace "kube-system" not found', ExitCode.NOT_FOUND),
        (500, 'get configmaps "e" in namespace "kube-system": the server answered 500: no', ExitCode.ERROR),
    ],
)
def test_an_answer_maps_to_its_message_and_exit_code(code: int, message: str, exit_code: ExitCode) -> None:
    error = answer_error(code, status("no", code), verb="get", resource="configmaps", name="e", namespace="kube-system")
    assert error.code == exit_code
    assert error.message == message.removeprefix("error: ")


def test_a_collection_is_named_without_an_object() -> None:
    assert answer_error(403, b"x", verb="list", resource="nodes").message == "you may not list nodes: x"


def test_denials_are_verbatim_and_bodies_are_cut() -> None:
    error = denial(status('admission webhook "w" denied the request: Node "n": bad', 403))
    assert error.code == ExitCode.DENIED
    assert error.message == 'the change was denied: admission webhook "w" denied the request: Node "n": bad'
    assert status_message(b"plain text \xff") == "plain text \ufffd"
    assert len(status_message(b"y" * 100_000)) == 2000
    assert cut("abcdef", 4) == "abc…"
    assert cut("abc", 4) == "abc"


def test_the_exit_codes_are_distinct_and_in_the_help() -> None:
    assert len({code.value for code in ExitCode}) == len(ExitCode)
    text = build_parser().format_help()
    for code in ExitCode:
        assert f"  {code.value}  " in text


def test_the_console_script_is_installed_for_kubectl_to_find() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["kubectl-preservation"] == "machine_preservation.cli.kubectl.plugin:main"
