"""The models share their "fields given" sets (memory of the caches) and still tell each instance's own."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.models import Machine, MachineSpec, Node, cached_node

SPEC_FIELDS = {
    "providerID": st.text(max_size=5),
    "machinePreserveTimeout": st.sampled_from(["1h", "30m"]),
    "drainTimeout": st.sampled_from(["2h", "5m"]),
    "maxEvictRetries": st.integers(0, 5),
    "nodeTemplate": st.just({}),  # not a field of the model: ignored
}


@given(
    st.lists(
        st.fixed_dictionaries({}, optional=SPEC_FIELDS),
        min_size=1,
        max_size=6,
    )
)
def test_each_instance_tells_the_fields_it_was_given(specs: list[dict[str, Any]]) -> None:
    parsed = [MachineSpec.model_validate(spec) for spec in specs]
    for spec, model in zip(specs, parsed, strict=True):
        assert {MachineSpec.model_fields[name].alias for name in model.model_fields_set} == set(spec) - {"nodeTemplate"}


def test_instances_given_the_same_fields_share_one_set() -> None:
    first = cached_node({"metadata": {"name": "a", "uid": "1"}, "spec": {"providerID": "p"}})
    second = cached_node({"metadata": {"name": "b", "uid": "2"}, "spec": {"providerID": "q"}})
    assert first.model_fields_set is second.model_fields_set
    machines = [Machine.model_validate({"metadata": {"name": name, "uid": name}}) for name in "ab"]
    assert machines[0].metadata.model_fields_set is machines[1].metadata.model_fields_set
    assert Node.model_validate({}).model_fields_set == set()


def test_a_copy_with_changes_leaves_the_shared_set_alone() -> None:
    machine = Machine.model_validate({"metadata": {"name": "m"}})
    other = Machine.model_validate({"metadata": {"name": "n"}})
    changed = machine.model_copy(update={"status": other.status})
    assert "status" in changed.model_fields_set
    assert machine.model_fields_set == {"metadata"}
    assert other.model_fields_set == {"metadata"}
