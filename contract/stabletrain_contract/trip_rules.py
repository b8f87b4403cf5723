"""The recovery rules as the agent needs them to decide a trip.

A signal named by a stopping rule is not always one to stop on: a rule with `onClasses` or
`whileFiring` placed before it may only alert on some of its findings. The agent has what
those conditions read (each finding's class, every signal firing at the step), so the
directives carry the rules' order and conditions and the agent stops exactly when the first
rule matching a sustained finding stops the run: the operator's own first match, so a trip
is never one the policy would only have alerted on, and a finding no stopping rule takes
first keeps the run going (the operator acts on it from the agent's status).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Annotated

from pydantic import Field

from stabletrain_contract.base import ContractModel
from stabletrain_contract.names import SIGNAL_NAME_MAX, AnomalyClass

SignalName = Annotated[str, Field(max_length=SIGNAL_NAME_MAX)]

TRIP_RULES_MAX = 32


class TripRule(ContractModel):
    """One recovery rule, in the order of the policy, as far as the agent's signals go."""

    on_signals: tuple[SignalName, ...] = Field(min_length=1, max_length=16)
    """The agent's signals the rule names (operator-only ones left out)."""
    on_classes: tuple[AnomalyClass, ...] = Field(default=(), max_length=5)
    while_firing: tuple[SignalName, ...] = Field(default=(), max_length=8)
    stops: bool
    """Its action stops the run (Rollback, RestartFromLatest, Fail)."""

    def matches(self, signal: str, anomaly_class: AnomalyClass, firing: Collection[str]) -> bool:
        """Signal listed AND class listed (if any are) AND every whileFiring signal firing."""
        if signal not in self.on_signals:
            return False
        if self.on_classes and anomaly_class not in self.on_classes:
            return False
        return all(name in firing for name in self.while_firing)


def same_as_trip_on(rules: Sequence[TripRule], trip_on: Collection[str]) -> bool:
    """Whether `rules` trip on exactly the signals of `trip_on`, with no condition: then an
    agent that does not know the rules (they are null) decides every finding the same."""
    if any(rule.on_classes or rule.while_firing for rule in rules):
        return False
    first: dict[str, bool] = {}
    for rule in rules:
        for signal in rule.on_signals:
            first.setdefault(signal, rule.stops)
    return {signal for signal, stops in first.items() if stops} == set(trip_on)


def stops_on(
    rules: Sequence[TripRule], signal: str, anomaly_class: AnomalyClass, firing: Collection[str]
) -> bool:
    """Whether the first rule matching a sustained finding stops the run."""
    first = next((r for r in rules if r.matches(signal, anomaly_class, firing)), None)
    return first is not None and first.stops
