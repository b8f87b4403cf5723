"""Which rule an observation falls under: ordered rules, first match wins (as jobset's
failure policy), so a specific rule placed early overrides a general one below it."""

from __future__ import annotations

from collections.abc import Iterable

from stabletrain_operator.api.spec import RecoveryRule
from stabletrain_operator.policy.observation import Observation


def firing_signals(observations: Iterable[Observation]) -> frozenset[str]:
    """Every signal firing now: the observed ones and those a trip report saw beside them."""
    firing: set[str] = set()
    for observation in observations:
        firing.add(observation.signal)
        firing.update(observation.firing_with)
    return frozenset(firing)


def rule_matches(rule: RecoveryRule, observation: Observation, firing: frozenset[str]) -> bool:
    """Signal listed AND class listed (if any are) AND every `whileFiring` signal firing too."""
    if observation.signal not in rule.on_signals:
        return False
    if rule.on_classes and observation.anomaly_class not in rule.on_classes:
        return False
    return all(signal in firing for signal in rule.while_firing)


def first_matching_rule(
    rules: Iterable[RecoveryRule], observation: Observation, firing: frozenset[str]
) -> RecoveryRule | None:
    for rule in rules:
        if rule_matches(rule, observation, firing):
            return rule
    return None
