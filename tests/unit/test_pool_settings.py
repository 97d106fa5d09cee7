"""Pool settings from the Machine, MachineSet, MachineDeployment, the Cluster's Shoot, its extension
providerConfig or the flags."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.gardener.cluster import (
    WORKER_POOL_LABEL,
    ZONE_LABEL,
    ClusterView,
    distribute_over_zones,
    read_cluster,
    zone_share,
)
from machine_preservation.core.gardener.provider_config import API_VERSION, EXTENSION_TYPE, KIND
from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.core.pool_settings import (
    PoolDefaults,
    Setting,
    SettingOrigin,
    carries_max,
    pool_name,
    resolve_auto_preserve_max,
    resolve_preserve_timeout,
    zone_of,
)

from .pool_settings_helpers import resolve_pool_settings

DEFAULTS = PoolDefaults(preserve_timeout=dt.timedelta(hours=72), auto_preserve_failed_machine_max=0)
ABSENT: Any = object()
HOURS = dt.timedelta(hours=1)


def machine(timeout: Any = ABSENT) -> Machine:
    spec = {} if timeout is ABSENT else {"machinePreserveTimeout": timeout}
    return Machine.model_validate({"metadata": {"name": "m1"}, "spec": spec})


def _template(timeout: Any, node_labels: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if timeout is not ABSENT:
        spec["machinePreserveTimeout"] = timeout
    if node_labels is not None:
        spec["nodeTemplate"] = {"metadata": {"labels": node_labels}}
    return {"spec": spec}


def machine_set(
    *, maximum: Any = ABSENT, timeout: Any = ABSENT, node_labels: dict[str, str] | None = None
) -> MachineSet:
    spec: dict[str, Any] = {"replicas": 2, "template": _template(timeout, node_labels)}
    if maximum is not ABSENT:
        spec["autoPreserveFailedMachineMax"] = maximum
    return MachineSet.model_validate({"metadata": {"name": "ms1"}, "spec": spec})


def machine_deployment(
    *,
    pool: str | None = "cpu",
    maximum: Any = ABSENT,
    timeout: Any = ABSENT,
    labels: dict[str, str] | None = None,
    node_labels: dict[str, str] | None = None,
) -> MachineDeployment:
    metadata_labels = dict(labels or {})
    if pool is not None:
        metadata_labels[WORKER_POOL_LABEL] = pool
    spec: dict[str, Any] = {"replicas": 2, "template": _template(timeout, node_labels)}
    if maximum is not ABSENT:
        spec["autoPreserveFailedMachineMax"] = maximum
    return MachineDeployment.model_validate({"metadata": {"name": "md1", "labels": metadata_labels}, "spec": spec})


def worker(
    name: str = "cpu",
    *,
    zones: Any = ABSENT,
    maximum: Any = ABSENT,
    timeout: Any = ABSENT,
    worker_level_max: Any = ABSENT,
) -> dict[str, Any]:
    document: dict[str, Any] = {"name": name, "minimum": 1, "maximum": 10}
    if zones is not ABSENT:
        document["zones"] = zones
    settings: dict[str, Any] = {}
    if maximum is not ABSENT:
        settings["autoPreserveFailedMachineMax"] = maximum
    if timeout is not ABSENT:
        settings["machinePreserveTimeout"] = timeout
    if settings:
        document["machineControllerManager"] = settings
    if worker_level_max is not ABSENT:
        document["autoPreserveFailedMachineMax"] = worker_level_max
    return document


def cluster_object(*workers: Any, shoot: Any = ABSENT, extensions: Any = ABSENT) -> dict[str, Any]:
    if shoot is ABSENT:
        shoot = {"apiVersion": "core.gardener.cloud/v1beta1", "kind": "Shoot", "metadata": {"name": "s"}}
        shoot["spec"] = {"provider": {"type": "aws", "workers": list(workers)}}
        if extensions is not ABSENT:
            shoot["spec"]["extensions"] = extensions
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "shoot--p--s"},
        "spec": {"cloudProfile": {}, "seed": {}, "shoot": shoot},
    }


def cluster(*workers: Any, extensions: Any = ABSENT) -> ClusterView:
    return read_cluster(cluster_object(*workers, extensions=extensions))


def entry(name: str = "cpu", *, maximum: Any = ABSENT, timeout: Any = ABSENT) -> dict[str, Any]:
    """A pool's entry in the providerConfig's `workers`."""
    document: dict[str, Any] = {"name": name}
    if maximum is not ABSENT:
        document["autoPreserveFailedMachineMax"] = maximum
    if timeout is not ABSENT:
        document["machinePreserveTimeout"] = timeout
    return document


def preservation(*entries: dict[str, Any], disabled: bool | None = None, **extra: Any) -> list[dict[str, Any]]:
    """`spec.extensions` with an unrelated extension first and this one second, its providerConfig listing
    `entries`."""
    config = {"apiVersion": API_VERSION, "kind": KIND, "workers": list(entries), **extra}
    ours: dict[str, Any] = {"type": EXTENSION_TYPE, "providerConfig": config}
    if disabled is not None:
        ours["disabled"] = disabled
    return [{"type": "shoot-dns-service"}, ours]


# --- The Cluster resource ----------------------------------------------------------------------------------


def test_a_cluster_is_read_with_its_shoot() -> None:
    view = cluster(worker(zones=["a", "b"], maximum=3, timeout="48h"))
    assert view.name == "shoot--p--s"
    assert view.problem is None
    assert view.shoot is not None
    found = view.shoot.worker("cpu")
    assert found is not None
    assert found.zones == ["a", "b"]
    assert found.machine_controller_manager == {"autoPreserveFailedMachineMax": 3, "machinePreserveTimeout": "48h"}
    assert view.shoot.worker("gpu") is None


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (None, "the Cluster is not a JSON object"),
        ([], "the Cluster is not a JSON object"),
        ({"metadata": {"name": "c"}}, "Cluster c has no spec.shoot"),
        ({"metadata": {"name": "c"}, "spec": {"shoot": None}}, "Cluster c has no spec.shoot"),
        ({"metadata": {"name": "c"}, "spec": {"shoot": "{not json"}}, "Cluster c: spec.shoot is not valid JSON"),
        ({"metadata": {"name": "c"}, "spec": {"shoot": [1, 2]}}, "Cluster c: spec.shoot is not a JSON object"),
        ({"metadata": {"name": "c"}, "spec": {"shoot": "[1]"}}, "Cluster c: spec.shoot is not a JSON object"),
        (
            {"metadata": {"name": "c"}, "spec": {"shoot": {"metadata": {"labels": 5}}}},
            "Cluster c: spec.shoot cannot be read (",
        ),
    ],
)
def test_an_unreadable_cluster_has_no_shoot_and_says_why(raw: Any, problem: str) -> None:
    view = read_cluster(raw)
    assert view.shoot is None
    assert view.problem is not None
    assert view.problem.startswith(problem)


def test_a_shoot_given_as_a_json_string_is_read() -> None:
    shoot = {"metadata": {"name": "s"}, "spec": {"provider": {"workers": [worker(maximum=1)]}}}
    view = read_cluster({"metadata": {"name": "c"}, "spec": {"shoot": json.dumps(shoot)}})
    assert view.shoot is not None
    assert view.shoot.worker("cpu") is not None


def test_malformed_parts_of_a_shoot_are_dropped_not_fatal() -> None:
    view = cluster(
        "not a worker",
        {"name": 7, "machineControllerManager": {"autoPreserveFailedMachineMax": 1}},
        {"name": "cpu", "zones": "a,b", "machineControllerManager": "x"},
        {"name": "gpu", "zones": None},
    )
    assert view.shoot is not None
    assert [w.name for w in view.shoot.spec.provider.workers] == ["", "cpu", "gpu"]
    cpu, gpu = view.shoot.worker("cpu"), view.shoot.worker("gpu")
    assert cpu is not None
    assert gpu is not None
    assert (cpu.zones, cpu.machine_controller_manager) == (None, None)
    assert gpu.zones == []
    for spec in ({"provider": "x"}, {"provider": {"workers": {"a": 1}}}, "x"):
        other = read_cluster(cluster_object(shoot={"metadata": {"name": "s"}, "spec": spec}))
        assert other.shoot is not None
        assert other.shoot.spec.provider.workers == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
shaped_shoots = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries({}, optional={"name": json_values, "labels": json_values}),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "provider": st.fixed_dictionaries(
                    {},
                    optional={
                        "workers": st.lists(
                            st.fixed_dictionaries(
                                {"name": st.sampled_from(["cpu", "gpu"]) | json_values},
                                optional={
                                    "zones": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3) | json_values,
                                    "machineControllerManager": st.fixed_dictionaries(
                                        {},
                                        optional={
                                            "autoPreserveFailedMachineMax": st.integers(-2, 9) | json_values,
                                            "machinePreserveTimeout": st.sampled_from(["1h", "-1ns", "x"])
                                            | json_values,
                                        },
                                    )
                                    | json_values,
                                    "autoPreserveFailedMachineMax": st.integers(-2, 9) | json_values,
                                },
                            )
                            | json_values,
                            max_size=3,
                        )
                        | json_values
                    },
                )
                | json_values
            },
        )
        | json_values,
    },
)


@given(shoot=shaped_shoots | json_values, as_text=st.booleans())
def test_any_cluster_gives_an_answer_never_an_exception(shoot: Any, as_text: bool) -> None:
    raw = cluster_object(shoot=json.dumps(shoot) if as_text else shoot)
    view = read_cluster(raw)
    assert (view.shoot is None) == (view.problem is not None)
    settings = resolve_pool_settings(
        machine=machine(),
        machine_set=machine_set(),
        machine_deployment=machine_deployment(labels={ZONE_LABEL: "b"}),
        cluster=view,
        defaults=DEFAULTS,
    )
    assert settings.preserve_timeout.value >= dt.timedelta(0)
    assert 0 <= settings.auto_preserve_failed_machine_max.value <= 2**31 - 1


# --- Pool and zone -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("md", "ms", "pool"),
    [
        (machine_deployment(pool="cpu"), machine_set(), "cpu"),
        (machine_deployment(pool=None, node_labels={WORKER_POOL_LABEL: "gpu"}), machine_set(), "gpu"),
        (machine_deployment(pool="cpu", node_labels={WORKER_POOL_LABEL: "gpu"}), machine_set(), "cpu"),
        (None, machine_set(node_labels={WORKER_POOL_LABEL: "edge"}), "edge"),
        (machine_deployment(pool=None), machine_set(node_labels={WORKER_POOL_LABEL: "edge"}), "edge"),
        (machine_deployment(pool=None), machine_set(), None),
        (machine_deployment(pool=""), machine_set(), None),
        (None, None, None),
    ],
)
def test_the_pool_comes_from_labels_never_from_names(
    md: MachineDeployment | None, ms: MachineSet | None, pool: str | None
) -> None:
    assert pool_name(machine_set=ms, machine_deployment=md) == pool


ZONES = ["eu-1a", "eu-1b", "eu-1c"]


@pytest.mark.parametrize(
    ("md", "ms", "given", "index"),
    [
        (machine_deployment(labels={ZONE_LABEL: "eu-1b"}), None, None, 1),
        (machine_deployment(node_labels={ZONE_LABEL: "eu-1c"}), None, None, 2),
        (machine_deployment(node_labels={"topology.ebs.csi.aws.com/zone": "eu-1a"}), None, None, 0),
        (machine_deployment(node_labels={"failure-domain.beta.kubernetes.io/zone": "eu-1b"}), None, None, 1),
        (machine_deployment(), machine_set(node_labels={ZONE_LABEL: "eu-1c"}), None, 2),
        # the caller's zone (e.g. the MachineClass's nodeTemplate.zone) comes first
        (machine_deployment(labels={ZONE_LABEL: "eu-1b"}), None, "eu-1a", 0),
        # a given zone that is not the pool's is ignored; the labels still decide
        (machine_deployment(labels={ZONE_LABEL: "eu-1b"}), None, "elsewhere", 1),
        # two labels agreeing
        (
            machine_deployment(labels={ZONE_LABEL: "eu-1b"}, node_labels={"topology.gke.io/zone": "eu-1b"}),
            None,
            None,
            1,
        ),
        # labels that disagree cannot be trusted
        (machine_deployment(labels={ZONE_LABEL: "eu-1b"}, node_labels={ZONE_LABEL: "eu-1c"}), None, None, None),
        # a zone label naming no zone of the pool, or not a zone label at all
        (machine_deployment(labels={ZONE_LABEL: "us-2"}), None, None, None),
        (machine_deployment(labels={"zone-name": "eu-1a"}), None, None, None),
        (machine_deployment(), machine_set(), None, None),
        (None, None, None, None),
    ],
)
def test_the_zone_comes_from_zone_labels(
    md: MachineDeployment | None, ms: MachineSet | None, given: str | None, index: int | None
) -> None:
    assert zone_of(zones=ZONES, machine_set=ms, machine_deployment=md, zone=given).index == index


def test_azure_style_zone_labels_match_the_zone_number() -> None:
    zones = ["1", "2", "3"]
    md = machine_deployment(node_labels={"topology.disk.csi.azure.com/zone": "westeurope-2"})
    assert zone_of(zones=zones, machine_set=None, machine_deployment=md).index == 1
    # "-1" must not match "westeurope-11": only a whole zone name after the dash counts
    md = machine_deployment(node_labels={ZONE_LABEL: "westeurope-11"})
    assert zone_of(zones=zones, machine_set=None, machine_deployment=md).index is None


@pytest.mark.parametrize(
    ("total", "zones", "index", "share"),
    [
        (5, 3, 0, 2),
        (5, 3, 1, 2),
        (5, 3, 2, 1),  # the remainder goes to the first zones
        (2, 3, 0, 1),
        (2, 3, 2, 0),
        (2, 3, None, 0),  # zone unknown: the smallest share
        (6, 3, None, 2),
        (4, 1, 0, 4),
        (4, 0, None, 4),  # no zones: one MachineDeployment for the pool
        (0, 3, 1, 0),
    ],
)
def test_zone_shares_follow_gardener(total: int, zones: int, index: int | None, share: int) -> None:
    assert zone_share(total=total, zone_count=zones, index=index) == share


@given(total=st.integers(0, 2**31 - 1), zone_count=st.integers(1, 12))
def test_the_shares_always_sum_to_the_pool_value(total: int, zone_count: int) -> None:
    shares = [zone_share(total=total, zone_count=zone_count, index=i) for i in range(zone_count)]
    assert sum(shares) == total
    assert shares == sorted(shares, reverse=True)  # extra units only in the first zones
    assert max(shares) - min(shares) <= 1
    assert zone_share(total=total, zone_count=zone_count, index=None) == min(shares)


@given(
    total=st.integers(0, 9),  # within the pool's bound (maximum 10 less one)
    zones=st.lists(st.from_regex(r"[a-z]{1,3}-[0-9]", fullmatch=True), min_size=1, max_size=5, unique=True),
)
def test_every_zone_of_a_pool_gets_its_share_from_the_shoot(total: int, zones: list[str]) -> None:
    view = cluster(worker(zones=zones, maximum=total))
    shares = []
    for zone in zones:
        md = machine_deployment(node_labels={ZONE_LABEL: zone})
        setting = resolve_auto_preserve_max(
            machine_set=machine_set(), machine_deployment=md, cluster=view, defaults=DEFAULTS
        )
        assert setting.source == SettingOrigin.SHOOT
        shares.append(setting.value)
    assert shares == list(distribute_over_zones(total=total, zone_count=len(zones)))
    assert sum(shares) == total


# --- Precedence --------------------------------------------------------------------------------------------


def test_absent_is_not_zero() -> None:
    assert not carries_max(machine_set())
    assert carries_max(machine_set(maximum=0))
    assert not carries_max(None)
    view = cluster(worker(zones=["a"], maximum=3))
    from_shoot = resolve_auto_preserve_max(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert (from_shoot.value, from_shoot.source) == (3, SettingOrigin.SHOOT)
    zero = resolve_auto_preserve_max(
        machine_set=machine_set(maximum=0), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert (zero.value, zero.source) == (0, SettingOrigin.MACHINE_SET)


@pytest.mark.parametrize(
    ("shoot_worker", "value", "field"),
    [
        (
            worker(zones=["a"], maximum=2, worker_level_max=5),
            2,
            "machineControllerManager.autoPreserveFailedMachineMax",
        ),
        (worker(zones=["a"], worker_level_max=5), 5, "].autoPreserveFailedMachineMax"),
        (worker(zones=["a"], maximum=-1, worker_level_max=5), 5, "].autoPreserveFailedMachineMax"),
        (
            worker(zones=["a"], maximum=0, worker_level_max=5),
            0,
            "machineControllerManager.autoPreserveFailedMachineMax",
        ),
    ],
)
def test_the_shoot_max_is_read_from_both_locations_released_api_first(
    shoot_worker: dict[str, Any], value: int, field: str
) -> None:
    setting = resolve_auto_preserve_max(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(),
        cluster=cluster(shoot_worker),
        defaults=DEFAULTS,
    )
    assert (setting.value, setting.source) == (value, SettingOrigin.SHOOT)
    assert field in setting.detail


def test_a_preserve_timeout_from_each_source() -> None:
    view = cluster(worker(timeout="5h"))
    resolve = resolve_preserve_timeout
    assert resolve(
        machine=machine("1h"),
        machine_set=machine_set(timeout="2h"),
        machine_deployment=machine_deployment(timeout="3h"),
        cluster=view,
        defaults=DEFAULTS,
    ) == resolve(machine=machine("1h"), machine_set=None, machine_deployment=None, cluster=None, defaults=DEFAULTS)
    cases = [
        (machine("1h"), machine_set(timeout="2h"), machine_deployment(timeout="3h"), SettingOrigin.MACHINE, 1),
        (machine(), machine_set(timeout="2h"), machine_deployment(timeout="3h"), SettingOrigin.MACHINE_SET, 2),
        (machine(), machine_set(), machine_deployment(timeout="3h"), SettingOrigin.MACHINE_DEPLOYMENT, 3),
        (machine(), machine_set(), machine_deployment(), SettingOrigin.SHOOT, 5),
        (None, None, machine_deployment(), SettingOrigin.SHOOT, 5),
    ]
    for m, ms, md, source, hours in cases:
        setting = resolve(machine=m, machine_set=ms, machine_deployment=md, cluster=view, defaults=DEFAULTS)
        assert (setting.source, setting.value) == (source, hours * HOURS)
    flags = resolve(
        machine=machine(), machine_set=machine_set(), machine_deployment=None, cluster=None, defaults=DEFAULTS
    )
    assert (flags.source, flags.value, flags.detail) == (
        SettingOrigin.FLAGS,
        72 * HOURS,
        "--machine-preserve-timeout: 72h0m0s",
    )


@pytest.mark.parametrize(
    ("raw", "note"),
    [
        ("-1ns", 'Machine m1 spec.machinePreserveTimeout "-1ns" is negative: ignored'),
        ("3d", 'Machine m1 spec.machinePreserveTimeout "3d" is not a duration (time: unknown unit "d" in duration'),
        ("", 'Machine m1 spec.machinePreserveTimeout "" is not a duration'),
    ],
)
def test_an_invalid_timeout_falls_to_the_next_source_with_a_note(raw: str, note: str) -> None:
    settings = resolve_pool_settings(
        machine=machine(raw),
        machine_set=machine_set(timeout="2h"),
        machine_deployment=machine_deployment(),
        cluster=None,
        defaults=DEFAULTS,
    )
    assert (settings.preserve_timeout.source, settings.preserve_timeout.value) == (SettingOrigin.MACHINE_SET, 2 * HOURS)
    assert settings.notes[0].startswith(note)


def test_a_zero_timeout_is_a_value() -> None:
    setting = resolve_preserve_timeout(
        machine=machine("0s"),
        machine_set=machine_set(timeout="2h"),
        machine_deployment=None,
        cluster=None,
        defaults=DEFAULTS,
    )
    assert (setting.source, setting.value) == (SettingOrigin.MACHINE, dt.timedelta(0))


# The MachineSet model already coerces what the CRD's integer type lets through; the range is ours to check.
@pytest.mark.parametrize("bad", [-1, 2**31])
def test_an_invalid_max_falls_to_the_next_source_with_a_note(bad: int) -> None:
    settings = resolve_pool_settings(
        machine_set=machine_set(maximum=bad),
        machine_deployment=machine_deployment(maximum=1),
        cluster=None,
        defaults=DEFAULTS,
    )
    maximum = settings.auto_preserve_failed_machine_max
    assert (maximum.source, maximum.value) == (SettingOrigin.MACHINE_DEPLOYMENT, 1)
    assert settings.notes == (
        f"MachineSet ms1 spec.autoPreserveFailedMachineMax {bad} is not an integer from 0 to 2147483647: ignored",
    )


@pytest.mark.parametrize("bad", [True, 1.5, "2", [1], None])
def test_an_invalid_shoot_max_is_named_as_written(bad: Any) -> None:
    settings = resolve_pool_settings(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(),
        cluster=cluster(worker(zones=["a"], maximum=bad)),
        defaults=DEFAULTS,
    )
    assert settings.auto_preserve_failed_machine_max.source == SettingOrigin.FLAGS
    if bad is None:  # null is absent
        assert settings.notes == ()
    else:
        assert settings.notes == (
            "Shoot s spec.provider.workers[name=cpu].machineControllerManager.autoPreserveFailedMachineMax "
            f"{json.dumps(bad)} is not an integer from 0 to 2147483647: ignored",
        )


def test_notes_say_why_the_shoot_did_not_apply_once() -> None:
    unreadable = read_cluster({"metadata": {"name": "c"}, "spec": {"shoot": "{"}})
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=unreadable, defaults=DEFAULTS
    )
    assert settings.notes == ("Cluster c: spec.shoot is not valid JSON",)
    assert settings.preserve_timeout.source == settings.auto_preserve_failed_machine_max.source == SettingOrigin.FLAGS
    no_pool = resolve_pool_settings(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(pool=None),
        cluster=cluster(),
        defaults=DEFAULTS,
    )
    assert no_pool.notes == (f"MachineDeployment md1 has no label {WORKER_POOL_LABEL}: the Shoot's pools do not apply",)
    missing = resolve_pool_settings(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(),
        cluster=cluster(worker("gpu")),
        defaults=DEFAULTS,
    )
    assert missing.notes == ("the Shoot in Cluster shoot--p--s has no worker pool 'cpu'",)
    # no Cluster at all (not a Gardener landscape) is not a problem worth a note
    assert (
        resolve_pool_settings(
            machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=None, defaults=DEFAULTS
        ).notes
        == ()
    )


def test_an_unknown_zone_takes_the_smallest_share_and_says_so() -> None:
    view = cluster(worker(zones=["a", "b", "c"], maximum=5))
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert settings.auto_preserve_failed_machine_max.value == 1
    assert "the smallest share is used" in settings.notes[0]
    even = cluster(worker(zones=["a", "b", "c"], maximum=6))
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=even, defaults=DEFAULTS
    )
    assert (settings.auto_preserve_failed_machine_max.value, settings.notes) == (2, ())


def test_unreadable_zones_turn_auto_preservation_off_for_the_pool() -> None:
    view = cluster(worker(zones="a,b", maximum=5))
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert settings.auto_preserve_failed_machine_max.value == 0
    assert "zones are not a list" in settings.notes[0]


def test_the_defaults_apply_when_nothing_carries_a_setting() -> None:
    settings = resolve_pool_settings(
        machine_set=None,
        machine_deployment=None,
        cluster=None,
        defaults=PoolDefaults(preserve_timeout=HOURS, auto_preserve_failed_machine_max=4),
    )
    assert settings.preserve_timeout.value == HOURS
    assert (settings.auto_preserve_failed_machine_max.value, settings.auto_preserve_failed_machine_max.source) == (
        4,
        SettingOrigin.FLAGS,
    )


# For each source: absent, a valid value, or an invalid one. The first valid one in the order wins, and a note
# names each invalid one before it (and no other).
level = st.sampled_from(["absent", "valid", "invalid"])


NOTE_PREFIXES = {
    SettingOrigin.MACHINE: "Machine m1 ",
    SettingOrigin.MACHINE_SET: "MachineSet ms1 ",
    SettingOrigin.MACHINE_DEPLOYMENT: "MachineDeployment md1 ",
    SettingOrigin.SHOOT: "Shoot s spec.provider.workers[name=cpu].",
    SettingOrigin.PROVIDER_CONFIG: "Shoot s spec.extensions[1].providerConfig.workers[name=cpu].",
}


@given(m=level, ms=level, md=level, shoot=level, config=level)
def test_the_timeout_precedence_holds_for_every_combination(m: str, ms: str, md: str, shoot: str, config: str) -> None:
    def raw(state: str, hours: int) -> Any:
        return {"absent": ABSENT, "valid": f"{hours}h", "invalid": "-1ns"}[state]

    settings = resolve_pool_settings(
        machine=machine(raw(m, 1)),
        machine_set=machine_set(timeout=raw(ms, 2)),
        machine_deployment=machine_deployment(timeout=raw(md, 3)),
        cluster=cluster(worker(timeout=raw(shoot, 4)), extensions=preservation(entry(timeout=raw(config, 6)))),
        defaults=PoolDefaults(preserve_timeout=5 * HOURS),
    )
    order = [
        (SettingOrigin.MACHINE, m, 1),
        (SettingOrigin.MACHINE_SET, ms, 2),
        (SettingOrigin.MACHINE_DEPLOYMENT, md, 3),
        (SettingOrigin.SHOOT, shoot, 4),
        (SettingOrigin.PROVIDER_CONFIG, config, 6),
        (SettingOrigin.FLAGS, "valid", 5),
    ]
    chosen = next(index for index, (_, state, _) in enumerate(order) if state == "valid")
    source, _, hours = order[chosen]
    assert (settings.preserve_timeout.source, settings.preserve_timeout.value) == (source, hours * HOURS)
    invalid_before = [s for s, state, _ in order[:chosen] if state == "invalid"]
    timeout_notes = [note for note in settings.notes if "machinePreserveTimeout" in note]
    assert len(timeout_notes) == len(invalid_before)
    for note, s in zip(timeout_notes, invalid_before, strict=True):
        assert note.startswith(NOTE_PREFIXES[s])


@given(
    ms=level,
    md=level,
    shoot=level,
    worker_level=level,
    config=level,
    zones=st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=4, unique=True),
    zone=st.sampled_from(["a", "b", "c", "d", None]),
)
def test_the_max_precedence_holds_for_every_combination(
    ms: str, md: str, shoot: str, worker_level: str, config: str, zones: list[str], zone: str | None
) -> None:
    def raw(state: str, value: int) -> Any:
        return {"absent": ABSENT, "valid": value, "invalid": -1}[state]

    labels = {ZONE_LABEL: zone} if zone is not None else None
    setting = resolve_auto_preserve_max(
        machine_set=machine_set(maximum=raw(ms, 1)),
        machine_deployment=machine_deployment(maximum=raw(md, 2), node_labels=labels),
        cluster=cluster(
            worker(zones=zones, maximum=raw(shoot, 7), worker_level_max=raw(worker_level, 11)),
            extensions=preservation(entry(maximum=raw(config, 13))),
        ),
        defaults=PoolDefaults(preserve_timeout=HOURS, auto_preserve_failed_machine_max=3),
    )

    def from_shoot(total: int) -> int:
        total = min(total, 9)  # the pool's maximum 10, less one for its system components
        if len(zones) <= 1:
            return total
        shares = distribute_over_zones(total=total, zone_count=len(zones))
        return shares[zones.index(zone)] if zone in zones else min(shares)

    if ms == "valid":
        expected = (SettingOrigin.MACHINE_SET, 1)
    elif md == "valid":
        expected = (SettingOrigin.MACHINE_DEPLOYMENT, 2)
    elif shoot == "valid":
        expected = (SettingOrigin.SHOOT, from_shoot(7))
    elif worker_level == "valid":
        expected = (SettingOrigin.SHOOT, from_shoot(11))
    elif config == "valid":
        expected = (SettingOrigin.PROVIDER_CONFIG, from_shoot(13))
    else:
        expected = (SettingOrigin.FLAGS, 3)
    assert (setting.source, setting.value) == expected


@given(
    total=st.integers(0, 60),
    maximum=st.integers(0, 40),
    components=st.sampled_from([None, {"allow": True}, {"allow": False}]),
    zones=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True),
    in_provider_config=st.booleans(),
)
def test_a_pools_max_is_clamped_to_what_its_maximum_allows(
    total: int, maximum: int, components: Any, zones: list[str], in_provider_config: bool
) -> None:
    # Without the garden admission nothing else keeps a Shoot's max within its pool's maximum.
    shoot_worker = worker(zones=zones, maximum=ABSENT if in_provider_config else total)
    shoot_worker["maximum"] = maximum
    if components is not None:
        shoot_worker["systemComponents"] = components
    extensions = preservation(entry(maximum=total)) if in_provider_config else ABSENT
    view = cluster(shoot_worker, extensions=extensions)
    bound = maximum - 1 if maximum > 0 and (components is None or components["allow"]) else maximum
    shares, notes = [], []
    for zone in zones:
        settings = resolve_pool_settings(
            machine_set=machine_set(),
            machine_deployment=machine_deployment(node_labels={ZONE_LABEL: zone}),
            cluster=view,
            defaults=DEFAULTS,
        )
        shares.append(settings.auto_preserve_failed_machine_max.value)
        notes += [note for note in settings.notes if "is above what the pool's maximum allows" in note]
    assert sum(shares) == min(total, bound)
    assert bool(notes) == (total > bound)


def test_a_pool_whose_maximum_is_unreadable_is_not_clamped() -> None:
    shoot_worker = worker(zones=["a"], maximum=5)
    shoot_worker["maximum"] = "ten"
    setting = resolve_auto_preserve_max(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(),
        cluster=cluster(shoot_worker),
        defaults=DEFAULTS,
    )
    assert setting.value == 5


# --- The extension's providerConfig ------------------------------------------------------------------------

CONFIG_PATH = "Shoot s spec.extensions[1].providerConfig.workers[name=cpu]"


def test_the_provider_config_sets_a_pool_whose_worker_fields_are_absent() -> None:
    view = cluster(worker(zones=["a"]), extensions=preservation(entry(maximum=1, timeout="45m")))
    assert (view.provider_config_path, view.provider_config_problem) == ("spec.extensions[1].providerConfig", None)
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert settings.preserve_timeout == Setting(
        dt.timedelta(minutes=45), SettingOrigin.PROVIDER_CONFIG, f"{CONFIG_PATH}.machinePreserveTimeout: 45m0s"
    )
    assert settings.auto_preserve_failed_machine_max == Setting(
        1, SettingOrigin.PROVIDER_CONFIG, f"{CONFIG_PATH}.autoPreserveFailedMachineMax: 1"
    )
    assert settings.notes == ()


def test_the_shoots_worker_fields_win_setting_by_setting() -> None:
    view = cluster(worker(zones=["a"], maximum=2), extensions=preservation(entry(maximum=1, timeout="45m")))
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert (settings.auto_preserve_failed_machine_max.source, settings.auto_preserve_failed_machine_max.value) == (
        SettingOrigin.SHOOT,
        2,
    )
    assert (settings.preserve_timeout.source, settings.preserve_timeout.value) == (
        SettingOrigin.PROVIDER_CONFIG,
        dt.timedelta(minutes=45),
    )


@pytest.mark.parametrize(
    ("zone", "value", "how"),
    [("a", 2, "zone a (label on the MachineDeployment node template): 2"), ("b", 2, "zone b"), ("c", 1, "zone c")],
)
def test_the_provider_config_max_is_the_pools_total_spread_over_its_zones(zone: str, value: int, how: str) -> None:
    view = cluster(worker(zones=["a", "b", "c"]), extensions=preservation(entry(maximum=5)))
    setting = resolve_auto_preserve_max(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(node_labels={ZONE_LABEL: zone}),
        cluster=view,
        defaults=DEFAULTS,
    )
    assert (setting.source, setting.value) == (SettingOrigin.PROVIDER_CONFIG, value)
    assert setting.detail.startswith(f"{CONFIG_PATH}.autoPreserveFailedMachineMax: 5 over 3 zones, {how}")


def test_with_an_unknown_zone_the_provider_config_max_gives_the_smallest_share() -> None:
    view = cluster(worker(zones=["a", "b", "c"]), extensions=preservation(entry(maximum=5)))
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert settings.auto_preserve_failed_machine_max.value == 1
    assert settings.notes == (
        f"{CONFIG_PATH}.autoPreserveFailedMachineMax: the MachineDeployment's zone is not known (no zone label names "
        "one of the pool's zones); the smallest share is used",
    )


def test_an_invalid_value_in_the_provider_config_falls_through_to_the_flags() -> None:
    view = cluster(
        worker(zones=["a"]),
        extensions=preservation(entry(maximum=-1, timeout="3d"), entry("gpu", maximum=4, timeout="1h")),
    )
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert settings.preserve_timeout.source == settings.auto_preserve_failed_machine_max.source == SettingOrigin.FLAGS
    assert settings.notes == (
        f'{CONFIG_PATH}.machinePreserveTimeout "3d" is not a duration (time: unknown unit "d" in duration "3d"): '
        "ignored",
        f"{CONFIG_PATH}.autoPreserveFailedMachineMax -1 is not an integer from 0 to 2147483647: ignored",
    )


def test_a_provider_config_that_does_not_decode_is_skipped_and_the_shoot_still_counts() -> None:
    broken = preservation(entry(maximum="1", timeout="45m"))
    problem = (
        "Shoot s spec.extensions[1].providerConfig is ignored, it does not decode: spec.extensions[1].providerConfig"
        '.workers[0].autoPreserveFailedMachineMax: Invalid value: "1": must be an integer'
    )
    view = cluster(worker(zones=["a"], maximum=2, timeout="2h"), extensions=broken)
    assert (view.provider_config, view.provider_config_problem) == (None, problem)
    assert view.shoot is not None
    settings = resolve_pool_settings(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=view, defaults=DEFAULTS
    )
    assert (settings.preserve_timeout.value, settings.auto_preserve_failed_machine_max.value) == (2 * HOURS, 2)
    assert settings.notes == (), "the providerConfig was not reached"
    # Where the worker fields are absent, the flags apply, and the note says why the providerConfig did not (once).
    settings = resolve_pool_settings(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(),
        cluster=cluster(worker(zones=["a"]), extensions=broken),
        defaults=DEFAULTS,
    )
    assert settings.preserve_timeout.source == settings.auto_preserve_failed_machine_max.source == SettingOrigin.FLAGS
    assert settings.notes == (problem,)


@pytest.mark.parametrize(
    ("extensions", "workers"),
    [
        (preservation(entry(maximum=1, timeout="1h"), disabled=True), [worker(zones=["a"])]),
        (preservation(entry("gpu", maximum=1, timeout="1h")), [worker(zones=["a"]), worker("gpu", zones=["a"])]),
        (preservation(entry()), [worker(zones=["a"])]),  # the pool's entry sets nothing
        ([{"type": EXTENSION_TYPE}], [worker(zones=["a"])]),  # enabled without a providerConfig
        (preservation(entry(maximum=1, timeout="1h")), [worker("gpu", zones=["a"])]),  # no such worker
    ],
)
def test_the_provider_config_does_not_apply(extensions: Any, workers: list[dict[str, Any]]) -> None:
    settings = resolve_pool_settings(
        machine_set=machine_set(),
        machine_deployment=machine_deployment(),
        cluster=cluster(*workers, extensions=extensions),
        defaults=DEFAULTS,
    )
    assert settings.preserve_timeout.source == settings.auto_preserve_failed_machine_max.source == SettingOrigin.FLAGS


def test_the_provider_config_is_read_from_a_shoot_written_as_json_text() -> None:
    raw = cluster_object(worker(zones=["a"]), extensions=preservation(entry(maximum=3)))
    raw["spec"]["shoot"] = json.dumps(raw["spec"]["shoot"])
    setting = resolve_auto_preserve_max(
        machine_set=machine_set(), machine_deployment=machine_deployment(), cluster=read_cluster(raw), defaults=DEFAULTS
    )
    assert (setting.source, setting.value) == (SettingOrigin.PROVIDER_CONFIG, 3)
