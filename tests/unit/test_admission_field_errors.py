"""Field-error rendering, zone distribution and JSON-pointer escaping (core.admission)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.field_errors import (
    aggregate,
    duplicate,
    forbidden,
    invalid,
    not_supported,
    render_value,
    required,
    root,
)
from machine_preservation.core.admission.verdict import describe, escape_pointer_token
from machine_preservation.core.gardener.cluster import distribute_over_zones

PATH = root("spec", "provider", "workers").index(1).child("machineControllerManager").child("x")


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        (5, "5"),
        (-1, "-1"),
        (True, "true"),
        (None, "null"),
        (1.5, "1.5"),
        (2.0, "2.0"),
        ("72h", '"72h"'),
        ("", '""'),
        ('say "hi"', '"say \\"hi\\""'),
        ({"b": 1, "a": [1]}, '{"a":[1],"b":1}'),
    ],
)
def test_values_render_like_go_field_errors(value: object, rendered: str) -> None:
    assert render_value(value) == rendered


def test_long_structures_are_truncated() -> None:
    assert render_value(list(range(100))).endswith("...")
    assert len(render_value(list(range(100)))) == 80


def test_invalid_renders_path_type_value_detail() -> None:
    error = invalid(PATH, 5, "must be less than or equal to maximum (4)")
    assert error.render() == (
        "spec.provider.workers[1].machineControllerManager.x: Invalid value: 5: "
        "must be less than or equal to maximum (4)"
    )


def test_forbidden_omits_the_value_and_not_supported_lists_options() -> None:
    key_path = root("metadata", "annotations").key("a/b")
    assert forbidden(key_path, "no").render() == "metadata.annotations[a/b]: Forbidden: no"
    assert not_supported(key_path, "x", ("", "now")).render() == (
        'metadata.annotations[a/b]: Unsupported value: "x": supported values: "", "now"'
    )


def test_required_omits_the_value_and_duplicate_shows_it() -> None:
    names = root("workers").index(2).child("name")
    assert required(names).render() == "workers[2].name: Required value"
    assert duplicate(names, "a").render() == 'workers[2].name: Duplicate value: "a"'


def test_aggregate_brackets_several_and_drops_duplicates() -> None:
    one, two = invalid(PATH, 1, "a"), invalid(PATH, 2, "b")
    assert aggregate([one]) == one.render()
    assert aggregate([one, two, one]) == f"[{one.render()}, {two.render()}]"


@pytest.mark.parametrize(
    ("total", "zones", "shares"),
    [(5, 3, (2, 2, 1)), (2, 3, (1, 1, 0)), (6, 3, (2, 2, 2)), (0, 2, (0, 0)), (7, 1, (7,)), (3, 0, ())],
)
def test_remainder_goes_to_the_first_zones(total: int, zones: int, shares: tuple[int, ...]) -> None:
    assert distribute_over_zones(total=total, zone_count=zones) == shares


@given(total=st.integers(min_value=0, max_value=10_000), zones=st.integers(min_value=1, max_value=50))
def test_distribution_sums_up_and_is_non_increasing(total: int, zones: int) -> None:
    shares = distribute_over_zones(total=total, zone_count=zones)
    assert sum(shares) == total
    assert len(shares) == zones
    assert list(shares) == sorted(shares, reverse=True)
    assert max(shares) - min(shares) <= 1


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        (
            "cluster-autoscaler.kubernetes.io/scale-down-disabled",
            "cluster-autoscaler.kubernetes.io~1scale-down-disabled",
        ),
        ("a~b/c", "a~0b~1c"),
        ("~1", "~01"),
    ],
)
def test_pointer_tokens_are_escaped_per_rfc_6901(token: str, escaped: str) -> None:
    assert escape_pointer_token(token) == escaped


def test_unnamed_objects_are_described_by_their_generate_name() -> None:
    assert describe("Node", "n1") == 'Node "n1"'
    assert describe("Machine", "", "m-") == 'Machine "m-<generated>"'
    assert describe("Machine", "") == 'Machine "<unnamed>"'
