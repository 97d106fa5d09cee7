"""Turning the cached MachineSets, Machines and MachineDeployments into the deletion guard's view (the caches
themselves, on a real API server, are in tests/integration/test_webhook_cached_reads.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from machine_preservation.core.models import Machine, MachineDeployment, MachineSet
from machine_preservation.webhook import machine_sets
from machine_preservation.webhook.machine_sets import SourceUnavailable, Unreadable, parsed, view_of
from tests.webhook.reviews import machine, machine_set


def test_the_named_machine_set_with_all_machines_and_siblings() -> None:
    view = view_of(
        name="ms",
        machine_sets=[parsed(MachineSet, machine_set("other")), parsed(MachineSet, machine_set("ms", max_=2))],
        machines=[parsed(Machine, machine("m1")), parsed(Machine, machine("m2"))],
        machine_deployments=[parsed(MachineDeployment, {"metadata": {"name": "md"}, "spec": {"replicas": 4}})],
    )
    assert view is not None
    assert view.machine_set.metadata.name == "ms"
    assert view.machine_set.spec.auto_preserve_failed_machine_max == 2
    assert [m.metadata.name for m in view.machines] == ["m1", "m2"]
    assert [s.metadata.name for s in view.siblings] == ["other", "ms"]
    assert [(d.metadata.name, d.spec.replicas) for d in view.machine_deployments] == [("md", 4)]


def test_a_missing_machine_set_gives_no_view() -> None:
    assert view_of(name="gone", machine_sets=[parsed(MachineSet, machine_set("ms"))], machines=[]) is None


def test_objects_that_do_not_fit_the_models_are_kept_and_make_the_namespace_unreadable() -> None:
    broken = machine_set("ms")
    broken["spec"]["autoPreserveFailedMachineMax"] = "many"
    unreadable = parsed(MachineSet, broken)
    assert isinstance(unreadable, Unreadable)
    assert unreadable.namespace == "shoot--p--s"  # indexed with its namespace, so that it is found there
    with pytest.raises(SourceUnavailable, match="unexpected object from the API server"):
        view_of(name="ms", machine_sets=[unreadable], machines=[])
    with pytest.raises(SourceUnavailable, match="unexpected object from the API server"):
        view_of(
            name="ms",
            machine_sets=[parsed(MachineSet, machine_set("ms"))],
            machines=[],
            machine_deployments=[parsed(MachineDeployment, {"spec": {"replicas": "x"}})],
        )


async def test_outside_gardeners_extension_mode_no_extension_is_read(tmp_path: Path) -> None:
    source = machine_sets.KubernetesMachineSets(kubeconfig=tmp_path / "absent")  # any read would fail
    assert await source.read_extension(namespace="shoot--p--s") is None
    await source.close()


async def test_without_an_api_client_the_guard_cannot_read_and_is_not_ready(tmp_path: Path) -> None:
    source = machine_sets.KubernetesMachineSets(kubeconfig=tmp_path / "absent", namespaces=("shoot--p--s",))
    await source.start()  # logs, does not raise: the first review tries again
    assert not source.synced()
    with pytest.raises(SourceUnavailable, match="no API client"):
        await source.read(namespace="shoot--p--s", name="ms")
    await source.close()
    # Nothing watched from the start (no namespace given): nothing to wait for.
    assert machine_sets.KubernetesMachineSets(kubeconfig=tmp_path / "absent").synced()


async def test_reviews_start_caches_for_a_bounded_number_of_namespaces(tmp_path: Path) -> None:
    """Standalone, a review naming a namespace not configured starts its caches, up to a bound: the namespace comes
    from whoever reaches the webhook's port."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    source = machine_sets.KubernetesMachineSets(kubeconfig=kubeconfig, namespaces=("control",))
    try:
        await source.start()
        for i in range(machine_sets.MAX_NAMESPACES_FROM_REVIEWS):
            await source._caches_of(f"ns-{i}")  # nobody answers: the caches exist, unsynced
        with pytest.raises(SourceUnavailable, match="is not watched"):
            await source.read(namespace="one-too-many", name="ms")
        assert await source._caches_of("ns-0") is await source._caches_of("ns-0")  # known ones stay readable
        await source._caches_of("control")
    finally:
        await source.close()
