"""Which StableTrainingPolicy objects apply to a namespace: label selectors, as Kubernetes
evaluates metav1.LabelSelector (matchLabels and matchExpressions, all must hold; an empty
selector selects everything)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from stabletrain_operator.api.cluster_policy import (
    NamespaceSelector,
    SelectorOperator,
    SelectorRequirement,
    StableTrainingPolicy,
)


def selects(selector: NamespaceSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether a namespace with `labels` is selected (None or empty: every namespace)."""
    if selector is None:
        return True
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    return all(_holds(requirement, labels) for requirement in selector.match_expressions)


def _holds(requirement: SelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    operator = requirement.operator
    if operator is SelectorOperator.EXISTS:
        return present
    if operator is SelectorOperator.DOES_NOT_EXIST:
        return not present
    inside = present and labels[requirement.key] in requirement.values
    return inside if operator is SelectorOperator.IN else not inside


def applicable(
    policies: Iterable[StableTrainingPolicy], labels: Mapping[str, str]
) -> tuple[StableTrainingPolicy, ...]:
    """The policies selecting a namespace, highest priority first (then by name): the order
    in which they give defaults."""
    chosen = [p for p in policies if selects(p.spec.namespace_selector, labels)]
    return tuple(sorted(chosen, key=lambda p: (-p.spec.priority, p.name)))
