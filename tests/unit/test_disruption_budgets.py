"""Which PodDisruptionBudgets cover a refused pod: Kubernetes' label selectors, matched from the objects."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core import vocabulary as v
from machine_preservation.core.disruption_budgets import (
    LabelSelector,
    LabelSelectorRequirement,
    PodDisruptionBudget,
    refusing_budgets,
    selects,
)
from machine_preservation.core.models import Pod

LABELS = {"app": "web", "tier": "front"}


def requirement(key: str, operator: str, *values: str) -> LabelSelectorRequirement:
    return LabelSelectorRequirement(key=key, operator=operator, values=list(values))


def selector(match_labels: dict[str, str] | None = None, *expressions: LabelSelectorRequirement) -> LabelSelector:
    return LabelSelector(match_labels=match_labels or {}, match_expressions=list(expressions))


@pytest.mark.parametrize(
    ("chosen", "selected"),
    [
        (None, False),  # a budget without a selector covers no pod
        (selector(), True),  # policy/v1: an empty selector covers the whole namespace
        (selector({"app": "web"}), True),
        (selector({"app": "web", "tier": "front"}), True),
        (selector({"app": "db"}), False),
        (selector({"app": "web", "zone": "a"}), False),
        (selector(None, requirement("app", "In", "db", "web")), True),
        (selector(None, requirement("app", "In", "db")), False),
        (selector(None, requirement("zone", "In", "a")), False),  # In needs the key
        (selector(None, requirement("app", "NotIn", "db")), True),
        (selector(None, requirement("app", "NotIn", "web")), False),
        (selector(None, requirement("zone", "NotIn", "a")), True),  # NotIn holds without the key
        (selector(None, requirement("app", "Exists")), True),
        (selector(None, requirement("zone", "Exists")), False),
        (selector(None, requirement("zone", "DoesNotExist")), True),
        (selector(None, requirement("app", "DoesNotExist")), False),
        # Every part must hold.
        (selector({"app": "web"}, requirement("tier", "In", "front"), requirement("zone", "DoesNotExist")), True),
        (selector({"app": "web"}, requirement("tier", "In", "back")), False),
        (selector({"app": "db"}, requirement("tier", "In", "front")), False),
        # Invalid requirements (the API server's validation rejects them): the selector selects nothing.
        (selector(None, requirement("app", "In")), False),
        (selector(None, requirement("zone", "NotIn")), False),
        (selector(None, requirement("app", "Exists", "web")), False),
        (selector(None, requirement("zone", "DoesNotExist", "a")), False),
        (selector(None, requirement("app", "Equals", "web")), False),
        (selector(None, requirement("app", "in", "web")), False),  # operators are case-sensitive
    ],
)
def test_selects(chosen: LabelSelector | None, selected: bool) -> None:
    assert selects(chosen, LABELS) is selected


KEYS = st.sampled_from(["app", "tier", "zone", "example.com/role"])
VALUES = st.sampled_from(["web", "db", "front", "a", ""])
LABEL_MAPS = st.dictionaries(KEYS, VALUES, max_size=4)
VALUE_LISTS = st.lists(VALUES, min_size=1, max_size=3)
REQUIREMENTS = st.one_of(
    st.builds(requirement, KEYS, st.sampled_from(["In", "NotIn"]), VALUES, VALUES),
    st.builds(requirement, KEYS, st.sampled_from(["Exists", "DoesNotExist"])),
)
SELECTORS = st.builds(
    lambda labels, expressions: selector(labels, *expressions),
    st.dictionaries(KEYS, VALUES, max_size=2),
    st.lists(REQUIREMENTS, max_size=3),
)


@given(LABEL_MAPS, st.dictionaries(KEYS, VALUES, max_size=3))
def test_match_labels_select_exactly_the_objects_carrying_them(labels: dict[str, str], wanted: dict[str, str]) -> None:
    assert selects(selector(wanted), labels) is (wanted.items() <= labels.items())


@given(LABEL_MAPS, KEYS, VALUE_LISTS)
def test_not_in_is_the_complement_of_in(labels: dict[str, str], key: str, values: list[str]) -> None:
    assert selects(selector(None, requirement(key, "In", *values)), labels) is (labels.get(key) in values)
    assert selects(selector(None, requirement(key, "NotIn", *values)), labels) is not selects(
        selector(None, requirement(key, "In", *values)), labels
    )


@given(LABEL_MAPS, KEYS)
def test_does_not_exist_is_the_complement_of_exists(labels: dict[str, str], key: str) -> None:
    assert selects(selector(None, requirement(key, "Exists")), labels) is (key in labels)
    assert selects(selector(None, requirement(key, "DoesNotExist")), labels) is (key not in labels)


@given(LABEL_MAPS, SELECTORS, SELECTORS)
def test_a_selector_is_the_conjunction_of_its_parts(
    labels: dict[str, str], first: LabelSelector, second: LabelSelector
) -> None:
    both = LabelSelector(
        match_labels={**first.match_labels, **second.match_labels},
        match_expressions=[*first.match_expressions, *second.match_expressions],
    )
    conflicting = any(
        first.match_labels[key] != second.match_labels[key] for key in first.match_labels.keys() & second.match_labels
    )
    if not conflicting:  # merged, a key's second value would replace the first
        assert selects(both, labels) is (selects(first, labels) and selects(second, labels))
    parts = [selector({key: value}) for key, value in first.match_labels.items()]
    parts += [selector(None, expression) for expression in first.match_expressions]
    assert selects(first, labels) is all(selects(part, labels) for part in parts)


def budget(name: str, namespace: str = "shop", selector: dict[str, Any] | None = None) -> PodDisruptionBudget:
    """A budget as the API serves it."""
    spec = {"minAvailable": 1, **({"selector": selector} if selector is not None else {})}
    return PodDisruptionBudget.model_validate(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


def pod(name: str, namespace: str = "shop", labels: dict[str, str] | None = None) -> Pod:
    return Pod.model_validate({"metadata": {"name": name, "namespace": namespace, "labels": labels or {}}})


def test_a_served_budget_keeps_its_selector() -> None:
    served = budget(
        "web", selector={"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    )
    assert (served.namespace, served.name) == ("shop", "web")
    assert served.selector == selector({"app": "web"}, requirement("tier", "Exists"))
    assert budget("none").selector is None
    assert budget("all", selector={}).selector == selector()


def test_refusing_budgets_are_those_covering_a_refused_pod_in_its_namespace() -> None:
    budgets = [
        budget("web", selector={"matchLabels": {"app": "web"}}),
        budget("db", selector={"matchLabels": {"app": "db"}}),
        budget("web", namespace="other", selector={"matchLabels": {"app": "web"}}),  # another namespace's
        budget("everything", selector={}),
        budget("nothing"),
    ]
    refused = [pod("web-0", labels={"app": "web"}), pod("web-1", labels={"app": "web"})]
    assert refusing_budgets(refused, budgets, limit=10) == ("shop/everything", "shop/web")
    assert refusing_budgets([], budgets, limit=10) == ()


def test_a_pod_whose_labels_are_not_known_is_matched_by_none() -> None:
    too_many = {f"k{i}": "v" for i in range(100)}
    assert refusing_budgets([pod("web-0", labels=too_many)], [budget("all", selector={})], limit=10) == ()


def test_refusing_budgets_are_bounded_and_sorted() -> None:
    budgets = [budget(f"b{i:02d}", selector={}) for i in range(30, 0, -1)]
    names = refusing_budgets([pod("web-0")], budgets, limit=v.DRAIN_BLOCKED_BY_LIMIT)
    assert names == tuple(f"shop/b{i:02d}" for i in range(1, v.DRAIN_BLOCKED_BY_LIMIT + 1))
