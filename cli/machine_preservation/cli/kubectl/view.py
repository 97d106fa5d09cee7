"""What `kubectl preservation` shows of a Node, a Machine and a MachineSet, decided without I/O: a row from the
object as the API serves it (a dict) and the time now; time left; sorting; the documented JSON/YAML structure;
the tables.

Shoot owners write Nodes, and the webhook that guards the controller's fields fails open: every value is read
defensively (a malformed one shows as written, cut; it never raises) and cut to a bound before it is shown.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from machine_preservation.cli.kubectl.outcomes import cut
from machine_preservation.core import vocabulary as v
from machine_preservation.core.gardener.cluster import ClusterView
from machine_preservation.core.models import MachineDeployment, MachineSet
from machine_preservation.core.pool_settings import PoolDefaults, resolve_auto_preserve_max
from machine_preservation.core.preservation_record import format_timestamp, parse_timestamp, read_record

# MCM's label on every Node it manages, naming the node's Machine (MCM's `machineutils.MachineLabelKey`).
MACHINE_NAME_LABEL: Final = v.MCM_MACHINE_NAME_LABEL
# The longest value a structured output (JSON/YAML) carries, and a table cell (`-o wide`: STRUCTURED_LIMIT).
STRUCTURED_LIMIT: Final = 256
CELL_LIMIT: Final = 48
NONE: Final = "-"
# The structure's version: a field is only ever added under it.
STRUCTURE_VERSION: Final = "v1"
AUTO: Final = "auto"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: Any) -> dict[str, str]:
    return {key: item for key, item in _mapping(value).items() if isinstance(key, str) and isinstance(item, str)}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return _strings(_mapping(obj.get("metadata")).get("annotations"))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return _strings(_mapping(obj.get("metadata")).get("labels"))


def name_of(obj: Mapping[str, Any]) -> str:
    name = _mapping(obj.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_object_name(name: str) -> bool:
    """Whether `name` can name a Node or a namespace (a DNS subdomain): anything else is not put in a URL path."""
    return len(name) <= 253 and _SUBDOMAIN.fullmatch(name) is not None


def machine_of(node: Mapping[str, Any]) -> str | None:
    """The Machine MCM says the node belongs to; None for a node of no MCM-managed pool."""
    return labels_of(node).get(MACHINE_NAME_LABEL) or None


# --- Times -------------------------------------------------------------------------------------------------


def short_duration(seconds: float) -> str:
    """A duration as kubectl prints ages: `45s`, `12m`, `3h5m`, `2d4h` (two units at most, rounded down)."""
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs and minutes < 10 else f"{minutes}m"
    return f"{secs}s"


def time_left(seconds_left: int | None) -> str:
    if seconds_left is None:
        return NONE
    return "expired" if seconds_left <= 0 else short_duration(seconds_left)


@dataclass(frozen=True)
class Moment:
    """A time a preservation field holds: parsed, or the raw text when it does not parse (shown, never used)."""

    at: dt.datetime | None
    raw: str | None

    @property
    def shown(self) -> str:
        if self.at is not None:
            return format_timestamp(self.at)
        return NONE if self.raw is None else f"invalid: {cut(self.raw, 32)}"


def _moment(raw: str | None) -> Moment:
    return Moment(at=parse_timestamp(raw), raw=raw)


# --- A Node's row ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    """The drain as the Node tells it: its state (NodeDrainState, or the raw value cut), pods left, PDBs."""

    state: str | None
    pods_left: int | None
    blocked_by: tuple[str, ...]

    def cell(self, *, wide: bool) -> str:
        if self.state is None:
            return NONE
        if self.state != v.NodeDrainState.FAILED:
            return self.state
        parts = []
        if self.blocked_by:
            shown = ", ".join(self.blocked_by) if wide else self.blocked_by[0]
            more = len(self.blocked_by) - 1
            parts.append(f"waiting on PDB {shown}" + (f" +{more}" if more and not wide else ""))
        if self.pods_left is not None:
            parts.append(f"{self.pods_left} pod{'' if self.pods_left == 1 else 's'} left")
        return ", ".join(parts) or "failed"

    def structure(self) -> dict[str, Any]:
        return {"state": self.state, "podsLeft": self.pods_left, "blockedBy": list(self.blocked_by)}


def read_drain(annotations: Mapping[str, str]) -> Drain:
    raw = annotations.get(v.PRESERVED_DRAIN_ANNOTATION)
    state = None if raw is None else cut(raw, CELL_LIMIT)
    left_raw = annotations.get(v.PRESERVED_DRAIN_PODS_LEFT_ANNOTATION, "")
    pods_left = int(left_raw) if left_raw.isascii() and left_raw.isdigit() and len(left_raw) <= 9 else None
    blocked = annotations.get(v.PRESERVED_DRAIN_BLOCKED_BY_ANNOTATION, "")
    # Bounded before splitting: the controller writes at most DRAIN_BLOCKED_BY_LIMIT names of at most 507 chars.
    names = [name.strip() for name in blocked[: v.DRAIN_BLOCKED_BY_LIMIT * 600].split(",")]
    blocked_by = tuple(cut(name, STRUCTURED_LIMIT) for name in names if name)[: v.DRAIN_BLOCKED_BY_LIMIT]
    return Drain(state=state, pods_left=pods_left, blocked_by=blocked_by)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition: str

    def structure(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition,
        }


def conditions_of(node: Mapping[str, Any]) -> tuple[Condition, ...]:
    raw = _mapping(node.get("status")).get("conditions")
    found = []
    for item in raw if isinstance(raw, list) else []:
        fields = _strings(item)
        if "type" in fields:
            found.append(
                Condition(
                    type=cut(fields["type"], CELL_LIMIT),
                    status=cut(fields.get("status", ""), CELL_LIMIT),
                    reason=cut(fields.get("reason", ""), CELL_LIMIT),
                    message=cut(fields.get("message", ""), STRUCTURED_LIMIT),
                    last_transition=cut(fields.get("lastTransitionTime", ""), CELL_LIMIT),
                )
            )
    return tuple(found)


def tainted(node: Mapping[str, Any]) -> bool:
    """Whether the node carries the preserved taint (`node.machine.sapcloud.io/preserved:NoSchedule`): a Failed
    preserved machine's node takes no new pods."""
    taints = _mapping(node.get("spec")).get("taints")
    return any(
        _strings(taint).get("key") == v.PRESERVED_TAINT_KEY
        and _strings(taint).get("effect") == v.PRESERVED_TAINT_EFFECT
        for taint in (taints if isinstance(taints, list) else [])
    )


def _condition(node: Mapping[str, Any], kind: str) -> Condition | None:
    return next((c for c in conditions_of(node) if c.type == kind), None)


@dataclass(frozen=True)
class NodeRow:
    """A preserved or marked node as `list` and `show` tell it."""

    node: str
    machine: str | None
    value: str | None  # now, when-failed, false, auto; another value as written (cut); None: not marked
    preserved_by: str | None
    since: Moment
    until: Moment
    seconds_left: int | None
    ready: str
    drain: Drain
    scale_down_protected: bool
    evidence: str | None

    def cells(self, *, wide: bool) -> list[str]:
        limit = STRUCTURED_LIMIT if wide else CELL_LIMIT
        cells = [
            self.node,
            cut(self.value or NONE, limit),
            self.since.shown,
            self.until.shown,
            time_left(self.seconds_left),
            self.ready,
            cut(self.drain.cell(wide=wide), limit if wide else 2 * CELL_LIMIT),
            "yes" if self.scale_down_protected else "no",
        ]
        if wide:
            cells += [self.preserved_by or NONE, self.machine or NONE, self.evidence or NONE]
        return cells

    def structure(self) -> dict[str, Any]:
        """One item of the documented structure (docs/operations.md): every key always present, null if unknown."""
        return {
            "node": self.node,
            "machine": self.machine,
            "value": self.value,
            "preservedBy": self.preserved_by,
            "since": self.since.shown if self.since.raw is not None else None,
            "until": self.until.shown if self.until.raw is not None else None,
            "secondsLeft": self.seconds_left,
            "ready": self.ready,
            "drain": self.drain.structure(),
            "scaleDownProtected": self.scale_down_protected,
            "evidence": self.evidence,
        }


LIST_COLUMNS: Final = ("NODE", "VALUE", "SINCE", "UNTIL", "LEFT", "READY", "DRAIN", "SCALE-DOWN PROTECTED")
WIDE_COLUMNS: Final = (*LIST_COLUMNS, "PRESERVED-BY", "MACHINE", "EVIDENCE")
_CONTROLLER_FIELDS: Final = (
    *v.NODE_PRESERVATION_ANNOTATIONS,
    *v.NODE_DRAIN_ANNOTATIONS,
    v.PRESERVED_EVIDENCE_ANNOTATION,
)


def is_marked(node: Mapping[str, Any]) -> bool:
    """Whether `list` shows the node: it carries a preserve value, or the controller's preservation fields."""
    annotations = annotations_of(node)
    return bool(annotations.get(v.PRESERVE_ANNOTATION)) or any(key in annotations for key in _CONTROLLER_FIELDS)


def _value(annotations: Mapping[str, str]) -> str | None:
    raw = annotations.get(v.PRESERVE_ANNOTATION)
    if annotations.get(v.PRESERVED_BY_ANNOTATION) == v.PreservedBy.AUTO or raw in v.AUTO_PRESERVE_VALUES:
        return AUTO
    return cut(raw, STRUCTURED_LIMIT) if raw else None


def node_row(node: Mapping[str, Any], now: dt.datetime) -> NodeRow:
    annotations = annotations_of(node)
    since = _moment(annotations.get(v.PRESERVED_SINCE_ANNOTATION))
    until = _moment(annotations.get(v.PRESERVED_UNTIL_ANNOTATION))
    by = annotations.get(v.PRESERVED_BY_ANNOTATION)
    ready = _condition(node, v.NODE_READY_CONDITION_TYPE)
    evidence = annotations.get(v.PRESERVED_EVIDENCE_ANNOTATION)
    return NodeRow(
        node=cut(name_of(node), STRUCTURED_LIMIT),
        machine=None if machine_of(node) is None else cut(machine_of(node) or "", STRUCTURED_LIMIT),
        value=_value(annotations),
        preserved_by=None if by is None else cut(by, CELL_LIMIT),
        since=since,
        until=until,
        seconds_left=None if until.at is None else int((until.at - now).total_seconds()),
        ready=ready.status if ready is not None else "Unknown",
        drain=read_drain(annotations),
        scale_down_protected=annotations.get(v.CA_SCALE_DOWN_DISABLED_ANNOTATION) == v.CA_SCALE_DOWN_DISABLED_VALUE,
        evidence=None if evidence is None else cut(evidence, STRUCTURED_LIMIT),
    )


def marked_rows(nodes: Iterable[Mapping[str, Any]], now: dt.datetime) -> list[NodeRow]:
    """The rows of the marked nodes among `nodes` (one page of a paginated list at a time)."""
    return [node_row(node, now) for node in nodes if is_marked(node)]


SORT_KEYS: Final = ("name", "left")


def sorted_rows(rows: Iterable[NodeRow], by: str) -> list[NodeRow]:
    """By node name; or `left`: the soonest to end first, the rows without an end last (then by name)."""
    if by == "left":
        return sorted(rows, key=lambda r: (r.seconds_left is None, r.seconds_left or 0, r.node))
    return sorted(rows, key=lambda r: r.node)


def list_structure(rows: Sequence[NodeRow]) -> dict[str, Any]:
    return {"kind": "NodePreservationList", "version": STRUCTURE_VERSION, "items": [r.structure() for r in rows]}


# --- Tables ------------------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns as kubectl aligns them: each as wide as its widest cell, three spaces apart."""
    lines = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[index]) for line in lines) for index in range(len(header))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def list_table(rows: Sequence[NodeRow], *, wide: bool) -> str:
    return table(WIDE_COLUMNS if wide else LIST_COLUMNS, [row.cells(wide=wide) for row in rows])


def change_line(row: NodeRow, *, wide: bool, deleted: bool) -> str:
    """A row `--watch` prints when the node changed: its cells tab-separated (the widths of the first table are
    not known to a later line); READY says `deleted` once the node is gone."""
    cells = row.cells(wide=wide)
    if deleted:
        cells[LIST_COLUMNS.index("READY")] = "deleted"
    return "\t".join(cells)


@dataclass(frozen=True)
class Change:
    """A row `--watch` prints: ADDED, MODIFIED (also when a node stops being marked) or DELETED."""

    kind: str
    row: NodeRow


def follow(
    event: Mapping[str, Any], shown: dict[str, NodeRow], version: str, now: dt.datetime
) -> tuple[str, Change | None]:
    """One watch event applied to the rows shown (`shown`, updated): the resourceVersion to watch on from (""
    when the watch must list again: an ERROR such as 410 Gone), and the change to print, if any."""
    kind, obj = event.get("type"), _mapping(event.get("object"))
    if kind == "ERROR":
        return "", None
    found = _mapping(obj.get("metadata")).get("resourceVersion")
    version = found if isinstance(found, str) and found else version
    if kind not in ("ADDED", "MODIFIED", "DELETED"):  # BOOKMARK: only the version moves
        return version, None
    name, row = name_of(obj), node_row(obj, now)
    if kind == "DELETED" or not is_marked(obj):
        gone = shown.pop(name, None) is not None
        return version, Change("DELETED" if kind == "DELETED" else "MODIFIED", row) if gone else None
    if shown.get(name) == row:
        return version, None  # a change to what no column shows
    changed = Change("MODIFIED" if name in shown else "ADDED", row)
    shown[name] = row
    return version, changed


def relisted(shown: dict[str, NodeRow], listed: Iterable[NodeRow]) -> list[Change]:
    """After a new list (`listed`): the rows that changed meanwhile, and as DELETED those no longer listed (gone, or
    no longer marked); `shown` replaced by the new rows."""
    current = {row.node: row for row in listed}
    changes = [Change("MODIFIED", row) for name, row in sorted(current.items()) if shown.get(name) != row]
    changes += [Change("DELETED", row) for name, row in sorted(shown.items()) if name not in current]
    shown.clear()
    shown.update(current)
    return changes


def registers_webhook(configurations: Iterable[Mapping[str, Any]], names: frozenset[str]) -> bool:
    """Whether one of the ValidatingWebhookConfigurations registers a webhook named in `names`."""
    for configuration in configurations:
        webhooks = configuration.get("webhooks")
        for webhook in webhooks if isinstance(webhooks, list) else []:
            if isinstance(webhook, Mapping) and webhook.get("name") in names:
                return True
    return False


# --- The seed: Machines and their MachineSets' budgets -------------------------------------------------------


@dataclass(frozen=True)
class MachineRow:
    machine: str
    node: str | None
    phase: str
    machine_set: str | None
    value: str | None
    preserved_by: str | None
    since: str | None
    until: str | None
    seconds_left: int | None
    drain: str | None
    damaged: bool

    def cells(self) -> list[str]:
        return [
            self.machine,
            self.node or NONE,
            self.phase or NONE,
            self.value or NONE,
            self.preserved_by or NONE,
            self.since or NONE,
            self.until or NONE,
            "damaged record" if self.damaged else time_left(self.seconds_left),
            self.drain or NONE,
            self.machine_set or NONE,
        ]

    def structure(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "node": self.node,
            "phase": self.phase,
            "machineSet": self.machine_set,
            "value": self.value,
            "preservedBy": self.preserved_by,
            "since": self.since,
            "until": self.until,
            "secondsLeft": self.seconds_left,
            "drain": self.drain,
            "damagedRecord": self.damaged,
        }


MACHINE_COLUMNS: Final = ("MACHINE", "NODE", "PHASE", "VALUE", "BY", "SINCE", "UNTIL", "LEFT", "DRAIN", "MACHINESET")


def _controller(obj: Mapping[str, Any], kind: str) -> str | None:
    owners = _mapping(obj.get("metadata")).get("ownerReferences")
    for owner in owners if isinstance(owners, list) else []:
        fields = _mapping(owner)
        if fields.get("controller") is True and fields.get("kind") == kind and isinstance(fields.get("name"), str):
            return str(fields["name"])
    return None


def _phase(machine: Mapping[str, Any]) -> str:
    phase = _mapping(_mapping(machine.get("status")).get("currentStatus")).get("phase")
    return cut(phase, CELL_LIMIT) if isinstance(phase, str) else ""


def machine_row(machine: Mapping[str, Any], now: dt.datetime) -> MachineRow | None:
    """The Machine's row when it carries a preserve value or a preservation record, else None."""
    annotations = annotations_of(machine)
    record = read_record(annotations)
    raw = annotations.get(v.PRESERVE_ANNOTATION)
    if record is None and not raw:
        return None
    damaged = record is not None and record.damaged
    live = record if record is not None and not damaged else None
    return MachineRow(
        machine=name_of(machine),
        node=labels_of(machine).get(v.NODE_LABEL) or None,
        phase=_phase(machine),
        machine_set=_controller(machine, "MachineSet"),
        value=AUTO if raw in v.AUTO_PRESERVE_VALUES else (cut(raw, CELL_LIMIT) if raw else None),
        preserved_by=None if record is None else record.by.value,
        since=None if live is None else format_timestamp(live.since),
        until=None if live is None else format_timestamp(live.until),
        seconds_left=None if live is None else int((live.until - now).total_seconds()),
        drain=None if live is None or live.drain is None else live.drain.outcome.value,
        damaged=damaged,
    )


@dataclass(frozen=True)
class BudgetRow:
    """A MachineSet's auto-preservation budget: its max (and where it comes from) and how much of it is in use."""

    machine_set: str
    maximum: int
    source: str
    in_use: int
    mcm_count: int | None  # MCM's own `status.autoPreserveFailedMachineCount`, where its CRD keeps it

    def cells(self) -> list[str]:
        mcm = NONE if self.mcm_count is None else str(self.mcm_count)
        return [self.machine_set, str(self.maximum), str(self.in_use), mcm, cut(self.source, 2 * CELL_LIMIT)]

    def structure(self) -> dict[str, Any]:
        return {
            "machineSet": self.machine_set,
            "autoPreserveFailedMachineMax": self.maximum,
            "source": self.source,
            "autoPreserved": self.in_use,
            "mcmAutoPreservedCount": self.mcm_count,
        }


BUDGET_COLUMNS: Final = ("MACHINESET", "MAX", "AUTO-PRESERVED", "MCM COUNT", "MAX FROM")
# The CLI does not know the controller's flags; the default max there is 0 (auto-preservation off).
_FLAGS: Final = PoolDefaults(preserve_timeout=dt.timedelta(0))


def budget_rows(
    *,
    machine_sets: Sequence[Mapping[str, Any]],
    machine_deployments: Sequence[Mapping[str, Any]],
    machines: Sequence[MachineRow],
    cluster: ClusterView | None,
) -> list[BudgetRow]:
    """Each MachineSet's budget, resolved as the controller resolves it (pool_settings), with the Machines that
    are auto-preserved in it now; only the MachineSets with a max or an auto-preserved machine."""
    deployments = {name_of(d): d for d in machine_deployments}
    rows = []
    for raw in machine_sets:
        machine_set = MachineSet.model_validate(raw)
        deployment_raw = deployments.get(_controller(raw, "MachineDeployment") or "")
        deployment = None if deployment_raw is None else MachineDeployment.model_validate(deployment_raw)
        setting = resolve_auto_preserve_max(
            machine_set=machine_set, machine_deployment=deployment, cluster=cluster, defaults=_FLAGS
        )
        name = name_of(raw)
        in_use = sum(
            1 for m in machines if m.machine_set == name and m.preserved_by == v.PreservedBy.AUTO and not m.damaged
        )
        status = _mapping(raw.get("status"))
        count = status.get("autoPreserveFailedMachineCount")
        if setting.value or in_use:
            rows.append(
                BudgetRow(
                    machine_set=name,
                    maximum=setting.value,
                    source=setting.detail,
                    in_use=in_use,
                    mcm_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
                )
            )
    return sorted(rows, key=lambda r: r.machine_set)


def seed_structure(namespace: str, machines: Sequence[MachineRow], budgets: Sequence[BudgetRow]) -> dict[str, Any]:
    return {
        "kind": "MachinePreservationList",
        "version": STRUCTURE_VERSION,
        "namespace": namespace,
        "machines": [m.structure() for m in machines],
        "machineSets": [b.structure() for b in budgets],
    }
