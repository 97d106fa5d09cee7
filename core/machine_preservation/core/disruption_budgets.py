"""Which PodDisruptionBudgets refused a drain's evictions, from the objects (never from the 429's message, which is
written for people): the budgets of the refused pods' namespaces whose selectors match the pods' labels.

Selectors follow Kubernetes' LabelSelector (metav1.LabelSelectorAsSelector): every `matchLabels` pair and every
`matchExpressions` requirement must hold; `In`/`NotIn` need values, `Exists`/`DoesNotExist` none, and a selector
that breaks these rules (or names another operator) selects nothing. A policy/v1 budget with an empty selector
covers every pod of its namespace, one without a selector none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import Field, model_validator

from machine_preservation.core.models import KubeModel, Pod, mapping_of


class LabelSelectorRequirement(KubeModel):
    key: str = ""
    operator: str = ""
    values: list[str] = Field(default_factory=list)


class LabelSelector(KubeModel):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)


class PodDisruptionBudget(KubeModel):
    """A PodDisruptionBudget reduced to whom it covers."""

    name: str = ""
    namespace: str = ""
    selector: LabelSelector | None = None  # None: the budget selects no pod

    @model_validator(mode="before")
    @classmethod
    def _reduce(cls, raw: Any) -> Any:
        """Accept a PodDisruptionBudget as the API serves it (metadata, spec); anything else is validated as is."""
        if not isinstance(raw, dict) or ("metadata" not in raw and "spec" not in raw):
            return raw
        metadata = mapping_of(raw.get("metadata"))
        return {
            "name": metadata.get("name", ""),
            "namespace": metadata.get("namespace", ""),
            "selector": mapping_of(raw.get("spec")).get("selector"),
        }


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether `selector` selects an object with `labels`."""
    if selector is None:
        return False
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    return all(_holds(requirement, labels) for requirement in selector.match_expressions)


def _holds(requirement: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    key, values = requirement.key, requirement.values
    match requirement.operator:
        case "In" if values:
            return key in labels and labels[key] in values
        case "NotIn" if values:
            return key not in labels or labels[key] not in values
        case "Exists" if not values:
            return key in labels
        case "DoesNotExist" if not values:
            return key not in labels
        case _:
            return False  # an invalid requirement: the selector selects nothing


def refusing_budgets(pods: Iterable[Pod], budgets: Sequence[PodDisruptionBudget], *, limit: int) -> tuple[str, ...]:
    """The budgets (`namespace/name`, sorted, at most `limit`) that cover any of `pods` (the pods whose eviction was
    refused; `budgets` those of their namespaces). A pod whose labels are not known (models.Pod) is matched by none."""
    names = {
        f"{budget.namespace}/{budget.name}"
        for pod in pods
        if pod.labels is not None
        for budget in budgets
        if budget.namespace == pod.namespace and selects(budget.selector, pod.labels)
    }
    return tuple(sorted(names)[:limit])
