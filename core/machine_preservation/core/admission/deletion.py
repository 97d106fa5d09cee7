"""Whether MCM may delete a Machine now: never when the delete would only *replace* a machine we keep.

Who is guarded: DELETEs by one of MCM's identities of a machine in phase Failed or carrying our preservation
record, in any phase. MCM deletes the Machine of every Node that is deleted (v0.61.3 and v0.62.1, whoever deletes
the Node: a person, a cloud-controller-manager for a stopped VM), so a preserved healthy machine needs the guard as
much as a Failed one. MCM's identities are its exact usernames and its ServiceAccount in the machine's own
namespace (settings.mcm_service_accounts: Gardener runs one MCM per shoot namespace), so one shoot's MCM is nobody
special to another shoot's machines. A user's delete, the controller's, and a delete of a machine that is neither
Failed nor preserved always pass, without reading anything.

Which machines we keep:
- a *preserved* one: its preservation record (in the Machine's annotations) has not run out. The expiry in
  force is the record's, capped at its start + the maximum preserve timeout. The mirror in
  `status.currentStatus.preserveExpiryTime` is never read: anyone who may write `machines/status` could
  set it to year 9999;
- one *about to be preserved*: no record yet, but its effective preserve value asks for preservation (the
  machine's annotation, or its node's value as last recorded on the machine: the webhook cannot see the
  shoot's nodes), or its MachineSet's auto-preservation budget has room for it. MCM deletes a Failed
  machine within milliseconds of seeing it; the controller needs a moment to start the preservation.
  The budget's max and the timeout a denial announces come from the pool settings as the controller reads
  them (`core.pool_settings`: the MachineSet, its MachineDeployment, the Shoot in the `Cluster`), so both
  agree also where MCM's CRDs drop the max (v0.61).

Replica counts always win: a kept machine's delete passes when
- the Machine is marked for forced deletion (label `force-deletion=True`; Gardener sets it on every machine
  of a Shoot it hibernates or deletes). The webhook configurations keep those deletes away from the webhook
  (`not-force-deletion`), so that an outage of ours cannot block them; this rule answers one that still comes
  (a configuration of an earlier release, during an upgrade);
- its MachineSet, or that set's MachineDeployment, is being deleted;
- its MachineSet (or MachineDeployment) wants fewer machines than it keeps: among the machines not being
  deleted, even once every machine we do not keep is gone more remain than `spec.replicas`. Then the
  surplus of kept machines may go, the first ones in MCM's scale-down order (priority annotation, phase,
  age); the others stay denied, so MCM's parallel deletes cannot take more kept machines than the count
  needs. Scale to zero therefore deletes every machine, preserved ones included;
- the Shoot is being hibernated, deleted or migrated, as its Gardener `Cluster` resource shows;
- (Gardener's extension mode) the extension no longer serves the Shoot: the namespace's `Extension` of type
  machine-preservation is gone or being deleted (the extension is disabled: the controller releases every
  preservation but leaves the users' preserve annotations, and the namespace label that routes MCM's deletes
  here goes only with gardenlet's next namespace update), or it was migrated away (the Shoot moved to another
  seed). Every delete then passes, preserved machines included.
So the guard denies only the delete that would replace a kept machine; the denial names the machine, until
when it is kept, and how to release it.

With an MCM that preserves machines itself (settings.mcm_native_preservation) MCM runs the lifecycle and the
guard is off, except for machines that still carry our record (a preservation handed over while it was
running): those stay guarded until the record is gone.

What it costs: `assess_machine_deletion` answers with a verdict, or with the one object it still needs (a
`Need`), and the shell reads that and asks again. It needs the machine's MachineSet (with the namespace's
machines, MachineSets and MachineDeployments) only when a guarded delete is not decided by the machine alone, the
Gardener `Cluster` only when the answer would otherwise be a denial, or when the budget's max can only come from
the Shoot, and the `Extension` only when the answer with all that is still a denial; each at most once, in that
order, so a review reads at most three objects.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, Final

from machine_preservation.core import vocabulary as v
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.verdict import Verdict, allow, deny
from machine_preservation.core.auto_preservation import is_being_replaced, plan_auto_preservation
from machine_preservation.core.durations import format_go_duration
from machine_preservation.core.gardener.cluster import ClusterView, read_cluster, shoot_lifecycle
from machine_preservation.core.gardener.extension import EXTENSION_TYPE, Extension, is_migrated
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.core.pool_settings import (
    PoolDefaults,
    SettingOrigin,
    carries_max,
    pool_name,
    resolve_auto_preserve_max,
    resolve_preserve_timeout,
)
from machine_preservation.core.preservation_record import PreservationRecord, format_timestamp, read_record
from machine_preservation.core.preserve_value import ValueOrigin, effective_preserve_value, last_known_node
from machine_preservation.core.priority import parse_priority

# MCM's marker for a machine to be deleted at once (no drain); Gardener sets it on hibernation and deletion.
FORCE_DELETION_LABEL: Final = "force-deletion"
FORCE_DELETION_VALUE: Final = "True"

_ASKS_FOR_PRESERVATION = (v.PreserveValue.NOW, v.PreserveValue.WHEN_FAILED, v.PreserveValue.AUTO)
_RELEASE_HINT = (
    f"to release it, annotate the machine (or its node) with {v.PRESERVE_ANNOTATION}=false; "
    "a user's delete is not blocked"
)
# MCM's scale-down order by phase (earlier phases go first); a phase it does not know ranks first, as in MCM.
_PHASE_RANK: Final[dict[str, int]] = {
    v.MachinePhase.TERMINATING: 0,
    v.MachinePhase.FAILED: 1,
    v.MachinePhase.CRASH_LOOP_BACK_OFF: 2,
    v.MachinePhase.UNKNOWN: 3,
    v.MachinePhase.PENDING: 4,
    v.MachinePhase.AVAILABLE: 5,
    v.MachinePhase.RUNNING: 6,
}
_EPOCH = dt.datetime.min.replace(tzinfo=dt.UTC)
# The pool settings' last resort are the controller's flags, which the webhook does not know: the max's default
# is the controller's (0, auto-preservation off); the timeout's is only named, never shown as a value.
_POOL_DEFAULTS: Final = PoolDefaults(preserve_timeout=dt.timedelta(0))
# gardenlet names a shoot's Extension after its type.
EXTENSION_NAME: Final = EXTENSION_TYPE


@dataclass(frozen=True)
class MachineSetView:
    """The machine's MachineSet and what of its namespace the replica counts and the budget need."""

    machine_set: MachineSet
    machines: Sequence[Machine]  # every machine of the namespace
    siblings: Sequence[MachineSet]  # every MachineSet of the namespace, this one included
    machine_deployments: Sequence[MachineDeployment] = ()  # every MachineDeployment of the namespace


@dataclass(frozen=True)
class ShootExtension:
    """The shoot namespace's `Extension` of type machine-preservation, as far as the guard needs it (Gardener's
    extension mode): whether the extension still serves the Shoot in this seed."""

    present: bool = True
    deleting: bool = False
    migrated: bool = False

    @classmethod
    def read(cls, extension: Mapping[str, Any] | None) -> ShootExtension:
        """From the object as the API serves it; None: there is none. Raises pydantic's ValidationError for an
        object that does not fit the Extension model."""
        if extension is None:
            return cls(present=False)
        model = Extension.model_validate(extension)
        return cls(deleting=model.deleting, migrated=is_migrated(model))

    def released(self) -> str:
        """Why the extension no longer guards the Shoot's machines, for people; "" while it does."""
        named = f'Extension "{EXTENSION_NAME}"'
        if not self.present:
            return f"the extension is disabled for the Shoot (its {named} is gone)"
        if self.deleting:
            return f"the extension is being disabled for the Shoot (its {named} is being deleted)"
        if self.migrated:
            return f"the Shoot has been migrated to another seed (its {named} was migrated)"
        return ""


@dataclass(frozen=True)
class DeletionRequest:
    """A DELETE of `machine` (the request's oldObject) by `username`. `namespace`: the request's, which decides
    whether a ServiceAccount is MCM's (None: the one in the machine's metadata)."""

    machine: Machine
    username: str
    settings: AdmissionSettings
    now: dt.datetime
    namespace: str | None = None

    @property
    def scope(self) -> str:
        """The namespace whose objects the guard reads."""
        return self.namespace or self.machine.metadata.namespace


@dataclass(frozen=True)
class ReadMachineSet:
    """The MachineSet `name`, with every machine, MachineSet and MachineDeployment of `namespace`."""

    namespace: str
    name: str


@dataclass(frozen=True)
class ReadCluster:
    """Gardener's `Cluster` named after the control namespace `name` (cluster-scoped)."""

    name: str


@dataclass(frozen=True)
class ReadExtension:
    """The `Extension` of type machine-preservation in `namespace` (Gardener's extension mode)."""

    namespace: str
    name: str = EXTENSION_NAME


# What the guard may still need to read: one of each kind, at most, per request.
Need = ReadMachineSet | ReadCluster | ReadExtension
NEEDS: Final = (ReadMachineSet, ReadCluster, ReadExtension)


class Unread(Enum):
    """Not read yet, as distinct from read and found to be absent (None)."""

    UNREAD = "unread"


UNREAD: Final = Unread.UNREAD


@dataclass(frozen=True)
class Reads:
    """What the shell has read for one request so far: UNREAD, not read yet; None, read and there is none.

    `machine_set`: None also when the machine has no MachineSet. `extension`: None also when not serving as
    Gardener's extension, or when the API server has no Extension kind (not Gardener): no release then."""

    machine_set: MachineSetView | Unread | None = UNREAD
    cluster: Mapping[str, Any] | Unread | None = UNREAD
    extension: ShootExtension | Unread | None = UNREAD


class Outcome(StrEnum):
    """Why a delete passes or is denied."""

    NOT_GUARDED = "not-guarded"  # not MCM's identity, or the machine is neither Failed nor preserved
    NOT_OURS = "not-ours"  # MCM preserves natively and the machine carries no record of ours
    ALREADY_DELETED = "already-deleted"  # a repeated delete changes nothing: the machine is going already
    FORCE_DELETION = "force-deletion"
    EXPIRED = "expired"
    NOT_KEPT = "not-kept"
    MACHINE_SET_DELETED = "machine-set-deleted"
    MACHINE_DEPLOYMENT_DELETED = "machine-deployment-deleted"
    MACHINE_SET_SURPLUS = "machine-set-surplus"
    MACHINE_DEPLOYMENT_SURPLUS = "machine-deployment-surplus"
    SHOOT_GOING_AWAY = "shoot-going-away"
    EXTENSION_RELEASED = "extension-released"  # Gardener: the Extension is gone, being deleted or migrated
    # Denials:
    PRESERVED = "preserved"
    PENDING_BY_VALUE = "pending-by-value"
    PENDING_BY_BUDGET = "pending-by-budget"


DENIALS: Final = frozenset({Outcome.PRESERVED, Outcome.PENDING_BY_VALUE, Outcome.PENDING_BY_BUDGET})
# Passes of a machine we keep: worth a log line, they are the replica counts winning.
RELEASES: Final = frozenset(
    {
        Outcome.FORCE_DELETION,
        Outcome.MACHINE_SET_DELETED,
        Outcome.MACHINE_DEPLOYMENT_DELETED,
        Outcome.MACHINE_SET_SURPLUS,
        Outcome.MACHINE_DEPLOYMENT_SURPLUS,
        Outcome.SHOOT_GOING_AWAY,
        Outcome.EXTENSION_RELEASED,
    }
)


@dataclass(frozen=True)
class Assessment:
    outcome: Outcome
    message: str = ""  # the denial; for a kept machine that may go, why (for the log)

    @property
    def allowed(self) -> bool:
        return self.outcome not in DENIALS

    def verdict(self) -> Verdict:
        return allow() if self.allowed else deny(self.message)


def _first_look(request: DeletionRequest) -> Assessment | PreservationRecord | None:
    """A pass decided by the machine alone, else its record (None: none yet)."""
    machine, settings = request.machine, request.settings
    if not settings.is_mcm(request.username, namespace=request.scope):
        return Assessment(Outcome.NOT_GUARDED)
    record = read_record(machine.metadata.annotations)
    if record is None and machine.phase != v.MachinePhase.FAILED:
        return Assessment(Outcome.NOT_GUARDED)
    if machine.metadata.deletion_timestamp is not None or machine.phase == v.MachinePhase.TERMINATING:
        return Assessment(Outcome.ALREADY_DELETED)
    if record is None and settings.mcm_native_preservation:
        return Assessment(Outcome.NOT_OURS)
    subject = f'machine "{machine.metadata.name}"'
    if machine.metadata.labels.get(FORCE_DELETION_LABEL) == FORCE_DELETION_VALUE:
        return Assessment(Outcome.FORCE_DELETION, f"{subject} is marked for forced deletion")
    if record is not None and record.expired(now=request.now, max_timeout=settings.max_preserve_timeout):
        return Assessment(Outcome.EXPIRED)
    return record


def _owner_set_name(machine: Machine) -> str:
    return machine.metadata.controller_name("MachineSet") or ""


def _asks_for_preservation(machine: Machine) -> tuple[str, str] | None:
    """The value asking for preservation as it is written where it comes from (`auto-preserved` stays
    upstream's spelling), and that place; None when no value asks for it."""
    effective = effective_preserve_value(machine=machine, node=last_known_node(machine))
    if effective.value not in _ASKS_FOR_PRESERVATION:
        return None
    if effective.source == ValueOrigin.NODE:
        written = effective.node_raw or ""
    else:
        written = machine.metadata.annotations.get(v.PRESERVE_ANNOTATION, "")
    return written, effective.source.value


def _owned_by(machine: Machine, machine_set: MachineSet) -> bool:
    return machine.metadata.controller_name("MachineSet") == machine_set.metadata.name


def _deployment_of(view: MachineSetView, machine_set: MachineSet) -> MachineDeployment | None:
    name = machine_set.metadata.controller_name("MachineDeployment")
    if name is None:
        return None
    return next((d for d in view.machine_deployments if d.metadata.name == name), None)


def _auto_candidates(
    view: MachineSetView,
    machine_set: MachineSet,
    cluster: ClusterView | None,
    now: dt.datetime,
    max_timeout: dt.timedelta,
) -> set[str]:
    """The machines of `machine_set` its auto-preservation budget would grant the auto value now."""
    owned = [m for m in view.machines if _owned_by(m, machine_set)]
    nodes = {m.node_name: node for m in owned if (node := last_known_node(m)) is not None}
    limit = resolve_auto_preserve_max(
        machine_set=machine_set,
        machine_deployment=_deployment_of(view, machine_set),
        cluster=cluster,
        defaults=_POOL_DEFAULTS,
    )
    plan = plan_auto_preservation(
        machine_set=machine_set,
        machines=owned,
        nodes=nodes,
        being_replaced=is_being_replaced(machine_set, view.siblings),
        now=now,
        max_timeout=max_timeout,
        limit=limit.value,
    )
    return set(plan.annotate)


class _Keeping:
    """Which machines of the namespace we keep, with each MachineSet's budget worked out once."""

    def __init__(
        self, *, view: MachineSetView, cluster: ClusterView | None, settings: AdmissionSettings, now: dt.datetime
    ) -> None:
        self._view, self._cluster, self._settings, self._now = view, cluster, settings, now
        self._budgets: dict[str, set[str]] = {}

    def budget_has_room(self, machine: Machine, machine_set: MachineSet) -> bool:
        name = machine_set.metadata.name
        if name not in self._budgets:
            self._budgets[name] = _auto_candidates(
                self._view, machine_set, self._cluster, self._now, self._settings.max_preserve_timeout
            )
        return machine.metadata.name in self._budgets[name]

    def kept(self, machine: Machine, machine_set: MachineSet) -> bool:
        record = read_record(machine.metadata.annotations)
        if record is not None:
            return not record.expired(now=self._now, max_timeout=self._settings.max_preserve_timeout)
        if self._settings.mcm_native_preservation or machine.phase != v.MachinePhase.FAILED:
            return False
        return _asks_for_preservation(machine) is not None or self.budget_has_room(machine, machine_set)


def _scale_down_order(machine: Machine) -> tuple[int, int, dt.datetime, str]:
    return (
        parse_priority(machine.metadata.annotations.get(v.MACHINE_PRIORITY_ANNOTATION)),
        _PHASE_RANK.get(machine.phase, 0),
        machine.metadata.creation_timestamp or _EPOCH,
        machine.metadata.name,
    )


def _counted(machine: Machine) -> bool:
    """A machine that still counts toward its set's replicas (not on its way out already)."""
    return machine.metadata.deletion_timestamp is None and machine.phase != v.MachinePhase.TERMINATING


def _in_surplus(
    *, machine: Machine, members: Iterable[tuple[Machine, MachineSet]], replicas: int, keeping: _Keeping
) -> bool:
    """Whether `machine` (kept) is among the kept machines the replica target needs gone, in MCM's order."""
    kept = [m for m, owner in members if m.metadata.name == machine.metadata.name or keeping.kept(m, owner)]
    surplus = len(kept) - max(replicas, 0)
    if surplus <= 0:
        return False
    kept.sort(key=_scale_down_order)
    return any(m.metadata.name == machine.metadata.name for m in kept[:surplus])


def _members(machine: Machine, view: MachineSetView, sets: Sequence[MachineSet]) -> list[tuple[Machine, MachineSet]]:
    """The counted machines of `sets`, each with its set; the judged machine as the request shows it."""
    members: list[tuple[Machine, MachineSet]] = []
    found = False
    for machine_set in sets:
        for member in view.machines:
            if not _owned_by(member, machine_set):
                continue
            if member.metadata.name == machine.metadata.name:
                member, found = machine, True
            if _counted(member):
                members.append((member, machine_set))
    if not found and _counted(machine) and _owned_by(machine, view.machine_set):
        members.append((machine, view.machine_set))
    return members


def _deployment_sets(view: MachineSetView, deployment: MachineDeployment) -> list[MachineSet]:
    owned = [s for s in view.siblings if s.metadata.controller_name("MachineDeployment") == deployment.metadata.name]
    return owned or [view.machine_set]


def _replica_release(*, machine: Machine, view: MachineSetView, keeping: _Keeping, subject: str) -> Assessment | None:
    machine_set = view.machine_set
    set_name = f'MachineSet "{machine_set.metadata.name}"'
    if machine_set.metadata.deletion_timestamp is not None:
        return Assessment(Outcome.MACHINE_SET_DELETED, f"{subject}: its {set_name} is being deleted")
    deployment = _deployment_of(view, machine_set)
    deployment_name = f'MachineDeployment "{deployment.metadata.name}"' if deployment is not None else ""
    if deployment is not None and deployment.metadata.deletion_timestamp is not None:
        return Assessment(Outcome.MACHINE_DEPLOYMENT_DELETED, f"{subject}: its {deployment_name} is being deleted")
    replicas = machine_set.spec.replicas
    if _in_surplus(machine=machine, members=_members(machine, view, [machine_set]), replicas=replicas, keeping=keeping):
        return Assessment(
            Outcome.MACHINE_SET_SURPLUS,
            f"{subject}: its {set_name} wants {replicas} machine(s), fewer than it keeps",
        )
    if deployment is not None:
        replicas = deployment.spec.replicas
        members = _members(machine, view, _deployment_sets(view, deployment))
        if _in_surplus(machine=machine, members=members, replicas=replicas, keeping=keeping):
            return Assessment(
                Outcome.MACHINE_DEPLOYMENT_SURPLUS,
                f"{subject}: its {deployment_name} wants {replicas} machine(s), fewer than it keeps",
            )
    return None


def _kept_for(
    machine: Machine, view: MachineSetView | None, cluster: ClusterView | None, settings: AdmissionSettings
) -> str:
    """How long a machine about to be preserved will be kept: its pool's timeout, as the controller reads it."""
    timeout = resolve_preserve_timeout(
        machine=machine,
        machine_set=view.machine_set if view is not None else None,
        machine_deployment=_deployment_of(view, view.machine_set) if view is not None else None,
        cluster=cluster,
        defaults=_POOL_DEFAULTS,
    )
    if timeout.source == SettingOrigin.FLAGS:
        return "the configured machinePreserveTimeout"
    if timeout.value > settings.max_preserve_timeout:
        return f"{format_go_duration(settings.max_preserve_timeout)} (the maximum preserve timeout)"
    return format_go_duration(timeout.value)


def _denial(
    *,
    machine: Machine,
    record: PreservationRecord | None,
    view: MachineSetView | None,
    cluster: ClusterView | None,
    keeping: _Keeping | None,
    settings: AdmissionSettings,
) -> Assessment | None:
    """The denial for a machine we keep; None when we do not keep it."""
    subject = f'machine "{machine.metadata.name}"'
    replacing = ""
    if view is not None:
        wanted = view.machine_set.spec.replicas
        replacing = (
            f'; its MachineSet "{view.machine_set.metadata.name}" wants {wanted} machine(s) and keeps it among '
            "them, so deleting it would only replace it"
        )
    if record is not None:
        until = format_timestamp(record.expiry(max_timeout=settings.max_preserve_timeout))
        phase = f"{machine.phase} and " if machine.phase else ""
        return Assessment(Outcome.PRESERVED, f"{subject} is {phase}preserved until {until}{replacing}; {_RELEASE_HINT}")
    kept_for = _kept_for(machine, view, cluster, settings)
    asked = _asks_for_preservation(machine)
    if asked is not None:
        value, source = asked
        return Assessment(
            Outcome.PENDING_BY_VALUE,
            f'{subject} is Failed and about to be preserved (preserve value "{value}" from its {source}); it is '
            f"kept for {kept_for} from the start of its preservation{replacing}; {_RELEASE_HINT}",
        )
    if view is not None and keeping is not None and keeping.budget_has_room(machine, view.machine_set):
        name = view.machine_set.metadata.name
        return Assessment(
            Outcome.PENDING_BY_BUDGET,
            f'{subject} is Failed and about to be auto-preserved (MachineSet "{name}" has room in its '
            f"autoPreserveFailedMachineMax); it is kept for {kept_for} from the start of its preservation"
            f"{replacing}; {_RELEASE_HINT}",
        )
    return None


def _judge(
    request: DeletionRequest,
    record: PreservationRecord | None,
    view: MachineSetView | None,
    cluster: Mapping[str, Any] | None,
    extension: ShootExtension | None,
) -> Assessment:
    """The verdict on a guarded delete with what has been read (None: not read, or there is none)."""
    machine, settings = request.machine, request.settings
    pools = read_cluster(cluster) if cluster is not None else None
    keeping = _Keeping(view=view, cluster=pools, settings=settings, now=request.now) if view is not None else None
    denial = _denial(machine=machine, record=record, view=view, cluster=pools, keeping=keeping, settings=settings)
    if denial is None:
        return Assessment(Outcome.NOT_KEPT)
    subject = f'machine "{machine.metadata.name}"'
    if view is not None and keeping is not None:
        release = _replica_release(machine=machine, view=view, keeping=keeping, subject=subject)
        if release is not None:
            return release
    if cluster is not None and (why := shoot_lifecycle(cluster).going_away()):
        return Assessment(Outcome.SHOOT_GOING_AWAY, f"{subject}: {why}")
    if extension is not None and (why := extension.released()):
        return Assessment(Outcome.EXTENSION_RELEASED, f"{subject}: {why}")
    return denial


def _cluster_may_change(machine: Machine, view: MachineSetView | None, assessment: Assessment) -> bool:
    """Whether the Gardener `Cluster` may change `assessment` (made without it): it is a denial (the Shoot may be
    going away), or the machine's budget has no max but what the Shoot may say (MCM's CRDs drop the field)."""
    if not assessment.allowed:
        return True
    if assessment.outcome != Outcome.NOT_KEPT or view is None:
        return False
    if read_record(machine.metadata.annotations) is not None:
        return False
    if effective_preserve_value(machine=machine, node=last_known_node(machine)).value != v.PreserveValue.NONE:
        return False  # asks for preservation (then denied above) or opted out: no budget involved
    own = view.machine_set
    deployment = _deployment_of(view, own)
    if carries_max(own) or carries_max(deployment):
        return False
    return pool_name(machine_set=own, machine_deployment=deployment) is not None


def assess_machine_deletion(request: DeletionRequest, reads: Reads) -> Assessment | Need:
    """The verdict on `request` with what has been read so far, or the next object to read before there is one.

    Each Need is asked for only while its kind is unread in `reads`, in the order MachineSet, Cluster,
    Extension: a shell that reads what is asked and asks again reads each object at most once and gets a verdict
    after at most `len(NEEDS)` reads.
    """
    first = _first_look(request)
    if isinstance(first, Assessment):
        return first
    machine, scope = request.machine, request.scope
    view = reads.machine_set
    if view is UNREAD:
        owner = _owner_set_name(machine)
        if owner:
            return ReadMachineSet(namespace=scope, name=owner)
        view = None
    cluster = None if reads.cluster is UNREAD else reads.cluster
    extension = None if reads.extension is UNREAD else reads.extension
    assessment = _judge(request, first, view, cluster, extension)
    if reads.cluster is UNREAD and _cluster_may_change(machine, view, assessment):
        return ReadCluster(name=scope)
    if reads.extension is UNREAD and not assessment.allowed:
        return ReadExtension(namespace=scope)
    return assessment
