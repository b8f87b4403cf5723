"""`decide` and `record`: the policy as pure functions of spec, observations and ledger.

No clock is read and nothing is written here: the operator passes `now`, carries the
decision out, then calls `record`. The replay CLI calls the very same functions on a
recorded run. docs/policy.md explains each branch and why it is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from stabletrain_contract.names import (
    AGENT_SIGNALS,
    CUSTOM_SIGNAL_PREFIX,
    Action,
    AnomalyClass,
    Signal,
)
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import RecoveryRule, RecoverySpec
from stabletrain_operator.policy.action_kind import Matched, StatusCounter
from stabletrain_operator.policy.action_registry import kind_of
from stabletrain_operator.policy.actions import (
    decision_for,
    describe,
    manual_rollback,
    restart,
)
from stabletrain_operator.policy.decision import (
    DEFAULT_INFRASTRUCTURE_RULE,
    UNMATCHED_TRIP_RULE,
    Decision,
    Deferral,
    Evaluation,
)
from stabletrain_operator.policy.ledger import AlertEpisode, PolicyLedger, RollbackMemory
from stabletrain_operator.policy.matching import firing_signals, first_matching_rule
from stabletrain_operator.policy.observation import Observation, ObservationSource

INFRASTRUCTURE_SIGNALS = frozenset({Signal.WORKER_FAILURE.value, Signal.STALLED.value})
"""Signals that are never the model's fault: restarted unchanged unless a rule says more."""

_URGENCY = {
    ObservationSource.MANUAL: 0,
    ObservationSource.TRIP_REPORT: 1,
    ObservationSource.POD_FAILURE: 2,
    ObservationSource.HEARTBEAT: 2,
    ObservationSource.SCRAPE: 3,
}
"""A person's request first; then what stopped the run; then what only reports."""


def decide(
    recovery: RecoverySpec,
    observations: Sequence[Observation],
    ledger: PolicyLedger,
    *,
    now: datetime,
    lr_scale: float,
) -> Decision | None:
    """The one action to take now, or None when nothing should change (`evaluate` says why)."""
    return evaluate(recovery, observations, ledger, now=now, lr_scale=lr_scale).decision


def evaluate(
    recovery: RecoverySpec,
    observations: Sequence[Observation],
    ledger: PolicyLedger,
    *,
    now: datetime,
    lr_scale: float,
) -> Evaluation:
    """The decision, plus a note for every observation set aside before it.

    Observations are considered by urgency (manual, trip, pod failure, scrape), each in
    the order given; the first that yields a decision wins, so a trip is never shadowed by
    a scraped report-only signal firing at the same time. What was deferred (cooldown,
    an episode already alerted) or matched no rule is noted, so the operator can log why
    a firing signal changed nothing.
    """
    firing = firing_signals(observations)
    notes: list[Deferral] = []
    for observation in sorted(observations, key=lambda o: _URGENCY[o.source]):
        outcome = _decide_one(recovery, observation, firing, ledger, now=now, lr_scale=lr_scale)
        if isinstance(outcome, Decision):
            return Evaluation(outcome, tuple(notes))
        if outcome is not None:
            notes.append(outcome)
    return Evaluation(None, tuple(notes))


def record(ledger: PolicyLedger, decision: Decision, *, now: datetime) -> PolicyLedger:
    """The ledger after the operator carried `decision` out: budgets, cooldown, escalation."""
    kind = kind_of(decision.action)
    rollback = kind.counter is StatusCounter.ROLLBACKS
    if rollback and decision.request_id:
        spent = ledger.spent(kind.counter, now=now)
        return replace(spent, last_manual_request_id=decision.request_id)
    if rollback and decision.onset_step is not None:
        memory = RollbackMemory(
            onset_step=decision.onset_step,
            lr_scale=decision.lr_scale if decision.lr_scale is not None else 1.0,
            skip=decision.skip,
            escalation_level=decision.escalation_level,
            anomaly_class=decision.anomaly_class,
        )
        return ledger.with_rollback(memory, now=now)
    if kind.budgeted:
        return ledger.spent(kind.counter, now=now)
    if not kind.stops_the_run:
        return ledger.with_live_action(
            AlertEpisode(
                rule=decision.rule,
                signal=decision.signal,
                onset_step=decision.onset_step,
                at=now,
            )
        )
    return ledger


def trip_signals(recovery: RecoverySpec) -> tuple[str, ...]:
    """Signals the agent should trip on: those a stopping rule (Rollback, RestartFromLatest,
    Fail) names and the agent can compute. Everything else only reports, so the run keeps
    going while the operator alerts or lowers the LR live."""
    names: list[str] = []
    for rule in recovery.rules:
        if not kind_of(rule.action).stops_the_run:
            continue
        for signal in rule.on_signals:
            trippable = signal.startswith(CUSTOM_SIGNAL_PREFIX) or signal in AGENT_SIGNALS
            if trippable and signal not in names:
                names.append(signal)
    return tuple(names)


def _decide_one(
    recovery: RecoverySpec,
    observation: Observation,
    firing: frozenset[str],
    ledger: PolicyLedger,
    *,
    now: datetime,
    lr_scale: float,
) -> Decision | Deferral | None:
    """A decision, a note saying why this observation changes nothing, or None for a
    finding that is not sustained yet (the normal state of a noisy run, not worth a note)."""
    if observation.source is ObservationSource.MANUAL:
        return manual_rollback(observation, ledger, lr_scale=lr_scale)
    if not (observation.sustained or observation.tripped):
        return None
    rule = first_matching_rule(recovery.rules, observation, firing)
    if rule is None:
        return _unmatched(recovery, observation, ledger)
    kind = kind_of(rule.action)
    if kind.stops_the_run and _cooling_down(recovery, observation, ledger, now):
        since = now - ledger.last_action_at if ledger.last_action_at else timedelta(0)
        return Deferral(
            observation.signal,
            rule.name,
            f"rule {rule.name} would stop the run on {describe(observation)}, but the last "
            f"rollback or restart was {since.total_seconds():.0f} s ago, inside "
            f"budgets.cooldownSeconds ({recovery.budgets.cooldown_seconds}); deferred as "
            "the fading end of the episode already handled",
        )
    if not kind.stops_the_run and observation.tripped:
        return _decided_by_tripping_rule(
            recovery, rule, observation, ledger, now=now, lr_scale=lr_scale
        )
    return kind.decide(Matched(recovery, rule, observation, ledger, now, lr_scale))


def _decided_by_tripping_rule(
    recovery: RecoverySpec,
    matched_first: RecoveryRule,
    observation: Observation,
    ledger: PolicyLedger,
    *,
    now: datetime,
    lr_scale: float,
) -> Decision | Deferral:
    """The agent stopped on a signal whose first matching rule only alerts or lowers the LR
    (a rule with onClasses or whileFiring matched first, and a stopping rule further down
    names the same signal, which is why the agent trips on it). A live action cannot reach
    stopped pods, and restarting from the latest checkpoint would resume next to the onset
    and run into the same data; the stopping rule the agent tripped for decides, as if it
    had matched: a Rollback goes back before the onset and skips the suspect data."""
    tripping = next(
        (
            rule
            for rule in recovery.rules
            if kind_of(rule.action).stops_the_run and observation.signal in rule.on_signals
        ),
        None,
    )
    if tripping is None:
        return decision_for(
            Action.FAIL,
            UNMATCHED_TRIP_RULE,
            Reason.NO_MATCHING_RULE,
            f"the agent stopped training on {describe(observation)}, but no stopping rule of "
            f"the policy in force names it (rule {matched_first.name} only "
            f"{matched_first.action.value}s); add a stopping rule for it, then resume the job",
            observation,
        )
    outcome = kind_of(tripping.action).decide(
        Matched(recovery, tripping, observation, ledger, now, lr_scale)
    )
    if isinstance(outcome, Deferral):
        return outcome
    return replace(
        outcome,
        message=(
            f"rule {matched_first.name} ({matched_first.action.value}) matched "
            f"{describe(observation)} first, but the agent had already stopped training for "
            f"rule {tripping.name}, which decides: {outcome.message}"
        )[:1024],
    )


def _unmatched(
    recovery: RecoverySpec, observation: Observation, ledger: PolicyLedger
) -> Decision | Deferral:
    """No rule: infrastructure restarts unchanged; a trip fails loudly; the rest is recorded."""
    infrastructure = observation.signal in INFRASTRUCTURE_SIGNALS or (
        observation.source is ObservationSource.POD_FAILURE
        and observation.anomaly_class is AnomalyClass.INFRASTRUCTURE
    )
    if infrastructure:
        return restart(recovery, DEFAULT_INFRASTRUCTURE_RULE, observation, ledger)
    if observation.tripped:
        return decision_for(
            Action.FAIL,
            UNMATCHED_TRIP_RULE,
            Reason.NO_MATCHING_RULE,
            f"the agent stopped training on {describe(observation)}, but no rule matches it "
            "(a rule with onClasses or whileFiring left this case out); add a rule for it "
            "or widen the existing one, then resume the job",
            observation,
        )
    return Deferral(
        observation.signal, "", f"no rule matches {describe(observation)}; only recorded"
    )


def _cooling_down(
    recovery: RecoverySpec, observation: Observation, ledger: PolicyLedger, now: datetime
) -> bool:
    """A scraped signal still firing shortly after a rollback or restart is the old episode
    fading, not a new one: stopping again would throw away the relaunch. Trips, pod
    failures and non-finite values are never deferred: the run has stopped or its
    arithmetic is broken, and waiting helps neither."""
    if observation.source is not ObservationSource.SCRAPE:
        return False
    if observation.signal == Signal.NON_FINITE.value or ledger.last_action_at is None:
        return False
    return now - ledger.last_action_at < timedelta(seconds=recovery.budgets.cooldown_seconds)
