"""`decide` and `record`: the policy as pure functions of spec, observations and ledger.

No clock is read and nothing is written here: the operator passes `now`, carries the
decision out, then calls `record`. The replay CLI calls the very same functions on a
recorded run. docs/policy.md explains each branch and why it is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from stabletrain_agent.contract.names import (
    AGENT_SIGNALS,
    CUSTOM_SIGNAL_PREFIX,
    Action,
    AnomalyClass,
    Signal,
)
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import RecoveryRule, RecoverySpec, RollbackParams
from stabletrain_operator.policy.arithmetic import (
    reduced_lr_scale,
    skip_around,
    target_bound,
)
from stabletrain_operator.policy.decision import (
    DEFAULT_INFRASTRUCTURE_RULE,
    ESCALATION_RULE,
    MANUAL_RULE,
    STOPPING_ACTIONS,
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
    if decision.action is Action.ROLLBACK:
        if decision.request_id:
            return replace(
                ledger,
                rollbacks_used=ledger.rollbacks_used + 1,
                last_action_at=now,
                last_manual_request_id=decision.request_id,
            )
        memory = None
        if decision.onset_step is not None:
            memory = RollbackMemory(
                onset_step=decision.onset_step,
                lr_scale=decision.lr_scale if decision.lr_scale is not None else 1.0,
                skip=decision.skip,
                escalation_level=decision.escalation_level,
            )
        if memory is None:
            return replace(ledger, rollbacks_used=ledger.rollbacks_used + 1, last_action_at=now)
        return ledger.with_rollback(memory, now=now)
    if decision.action is Action.RESTART_FROM_LATEST:
        return replace(ledger, restarts_used=ledger.restarts_used + 1, last_action_at=now)
    if decision.action in (Action.ALERT, Action.REDUCE_LR):
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
        if rule.action not in STOPPING_ACTIONS:
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
        return _manual(observation, ledger, lr_scale=lr_scale)
    if not (observation.sustained or observation.tripped):
        return None
    rule = first_matching_rule(recovery.rules, observation, firing)
    if rule is None:
        return _unmatched(recovery, observation, ledger)
    if rule.action in STOPPING_ACTIONS and _cooling_down(recovery, observation, ledger, now):
        since = now - ledger.last_action_at if ledger.last_action_at else timedelta(0)
        return Deferral(
            observation.signal,
            rule.name,
            f"rule {rule.name} would stop the run on {_what(observation)}, but the last "
            f"rollback or restart was {since.total_seconds():.0f} s ago, inside "
            f"budgets.cooldownSeconds ({recovery.budgets.cooldown_seconds}); deferred as "
            "the fading end of the episode already handled",
        )
    if rule.action is Action.ROLLBACK:
        return _rollback(recovery, rule, observation, ledger, lr_scale=lr_scale)
    if rule.action is Action.RESTART_FROM_LATEST:
        return _restart(recovery, rule.name, observation, ledger)
    if rule.action is Action.FAIL:
        return _decision(
            Action.FAIL,
            rule.name,
            Reason.FAILED_BY_POLICY,
            f"rule {rule.name} fails the job on {_what(observation)}",
            observation,
        )
    if observation.tripped:
        return _restart_after_live_trip(recovery, rule, observation, ledger)
    return _live(recovery, rule, observation, ledger, now=now, lr_scale=lr_scale)


def _manual(
    observation: Observation, ledger: PolicyLedger, *, lr_scale: float
) -> Decision | Deferral:
    """A person's request runs once per request id, whatever the budget: the budget caps
    what the operator does on its own, and the rollback is still counted against it."""
    if observation.request_id == ledger.last_manual_request_id:
        return Deferral(
            observation.signal,
            MANUAL_RULE,
            f"manual rollback request {observation.request_id} was handled already",
        )
    factor = observation.lr_factor
    target = "the newest stable checkpoint"
    if observation.to_step is not None:
        target = f"the newest stable checkpoint at or before step {observation.to_step}"
    return replace(
        _decision(
            Action.ROLLBACK,
            MANUAL_RULE,
            Reason.MANUAL_ROLLBACK,
            f"manual rollback request {observation.request_id}: resuming from {target}",
            observation,
        ),
        lr_scale=lr_scale if factor is None else lr_scale * factor,
        skip=observation.skip,
        rewarmup_steps=0 if factor is None else RollbackParams().rewarmup_steps,
        target_step_at_most=observation.to_step,
        request_id=observation.request_id,
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
        return _restart(recovery, DEFAULT_INFRASTRUCTURE_RULE, observation, ledger)
    if observation.tripped:
        return _decision(
            Action.FAIL,
            UNMATCHED_TRIP_RULE,
            Reason.NO_MATCHING_RULE,
            f"the agent stopped training on {_what(observation)}, but no rule matches it "
            "(a rule with onClasses or whileFiring left this case out); add a rule for it "
            "or widen the existing one, then resume the job",
            observation,
        )
    return Deferral(observation.signal, "", f"no rule matches {_what(observation)}; only recorded")


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


def _rollback(
    recovery: RecoverySpec,
    rule: RecoveryRule,
    observation: Observation,
    ledger: PolicyLedger,
    *,
    lr_scale: float,
) -> Decision:
    anchor = observation.anchor_step
    level = 0
    if anchor is not None:
        level = len(ledger.rollbacks_near(anchor, recovery.escalation.within_steps))
    if level > recovery.escalation.max_recurrences:
        return _final_action(recovery, observation, ledger, level)
    budget = recovery.budgets.max_rollbacks
    if ledger.rollbacks_used >= budget:
        return _decision(
            Action.FAIL,
            rule.name,
            Reason.ROLLBACK_BUDGET_EXHAUSTED,
            f"{_what(observation)} needs a rollback, but all {budget} rollbacks of "
            "budgets.maxRollbacks are used; the run keeps diverging, so look at the data "
            "and the LR schedule before raising the budget",
            observation,
        )
    params = rule.rollback_params()
    new_scale = reduced_lr_scale(lr_scale, params.lr_factor, params.lr_floor, times=level + 1)
    decision = _decision(
        Action.ROLLBACK,
        rule.name,
        Reason.ESCALATED if level else Reason.ROLLBACK_STARTED,
        _rollback_message(rule, observation, anchor, new_scale, level),
        observation,
    )
    if anchor is None:
        return replace(decision, lr_scale=new_scale, rewarmup_steps=params.rewarmup_steps)
    return replace(
        decision,
        lr_scale=new_scale,
        skip=(skip_around(anchor, params, level),),
        rewarmup_steps=params.rewarmup_steps,
        target_step_at_most=target_bound(anchor, params, level),
        escalation_level=level,
    )


def _rollback_message(
    rule: RecoveryRule,
    observation: Observation,
    anchor: int | None,
    new_scale: float,
    level: int,
) -> str:
    where = "" if anchor is None else f" with onset at step {anchor}"
    harder = ""
    if level:
        harder = (
            f"; recurrence {level} near an earlier rollback's onset, so the skip range and "
            "the distance to the checkpoint are widened"
        )
    return (
        f"rule {rule.name} rolls back on {_what(observation)}{where}: resuming before the "
        f"onset with LR scale {new_scale:.4g}{harder}"
    )


def _final_action(
    recovery: RecoverySpec, observation: Observation, ledger: PolicyLedger, level: int
) -> Decision:
    """Recurrences beyond escalation.maxRecurrences: rollbacks are not fixing this."""
    escalation = recovery.escalation
    why = (
        f"{_what(observation)} recurred {level} times within {escalation.within_steps} steps "
        f"of earlier rollbacks' onsets (escalation.maxRecurrences is "
        f"{escalation.max_recurrences})"
    )
    if escalation.final_action is Action.FAIL:
        return _decision(
            Action.FAIL,
            ESCALATION_RULE,
            Reason.ESCALATED,
            f"{why}; failing the job as escalation.finalAction says",
            observation,
        )
    if observation.tripped and escalation.final_action is Action.ALERT:
        restart = _restart(recovery, ESCALATION_RULE, observation, ledger)
        if restart.action is Action.FAIL:
            return restart
        return replace(
            restart,
            reason=Reason.ESCALATED,
            message=(
                f"{why}; escalation.finalAction is Alert, and since the agent had stopped "
                "training the run restarts from its latest checkpoint without further changes"
            ),
        )
    return _decision(
        escalation.final_action,
        ESCALATION_RULE,
        Reason.ESCALATED,
        f"{why}; escalation.finalAction is {escalation.final_action.value}",
        observation,
    )


def _restart(
    recovery: RecoverySpec, rule_name: str, observation: Observation, ledger: PolicyLedger
) -> Decision:
    budget = recovery.budgets.max_restarts
    if ledger.restarts_used >= budget:
        return _decision(
            Action.FAIL,
            rule_name,
            Reason.RESTART_BUDGET_EXHAUSTED,
            f"{_what(observation)} needs a restart, but all {budget} restarts of "
            "budgets.maxRestarts are used; check the nodes and the pods' logs before "
            "raising the budget",
            observation,
        )
    return _decision(
        Action.RESTART_FROM_LATEST,
        rule_name,
        Reason.RESTART_STARTED,
        f"rule {rule_name} restarts from the latest checkpoint after {_what(observation)}; "
        "LR and data unchanged",
        observation,
    )


def _restart_after_live_trip(
    recovery: RecoverySpec, rule: RecoveryRule, observation: Observation, ledger: PolicyLedger
) -> Decision:
    """The first matching rule only alerts or lowers the LR, yet the agent stopped (another,
    more specific rule stops on this signal, so the agent trips on it). A live action
    cannot reach stopped pods; the run restarts from its latest checkpoint instead."""
    restart = _restart(recovery, rule.name, observation, ledger)
    if restart.action is Action.FAIL:
        return restart
    return replace(
        restart,
        message=(
            f"rule {rule.name} ({rule.action.value}) matched {_what(observation)}, but the "
            "agent had already stopped training; restarting from the latest checkpoint with "
            "LR and data unchanged"
        ),
    )


def _live(
    recovery: RecoverySpec,
    rule: RecoveryRule,
    observation: Observation,
    ledger: PolicyLedger,
    *,
    now: datetime,
    lr_scale: float,
) -> Decision | Deferral:
    """Alert or ReduceLR: once per episode, and not again within the rule's cooldown."""
    last = ledger.last_live_action(rule.name)
    cooldown = timedelta(seconds=recovery.budgets.cooldown_seconds)
    if last is not None and now - last.at < cooldown:
        return Deferral(
            observation.signal,
            rule.name,
            f"rule {rule.name} acted {(now - last.at).total_seconds():.0f} s ago, inside "
            f"budgets.cooldownSeconds ({recovery.budgets.cooldown_seconds}); "
            f"{_what(observation)} deferred",
        )
    if rule.action is Action.REDUCE_LR:
        params = rule.reduce_lr_params()
        new_scale = reduced_lr_scale(lr_scale, params.lr_factor, params.lr_floor)
        if new_scale < lr_scale:
            return replace(
                _decision(
                    Action.REDUCE_LR,
                    rule.name,
                    Reason.LR_REDUCED,
                    f"rule {rule.name} lowers the LR scale from {lr_scale:.4g} to "
                    f"{new_scale:.4g} on {_what(observation)}, without a restart",
                    observation,
                ),
                lr_scale=new_scale,
            )
        alert = _decision(
            Action.ALERT,
            rule.name,
            Reason.ALERTED,
            f"rule {rule.name} would lower the LR on {_what(observation)}, but the LR scale "
            f"is already at its floor {params.lr_floor:.4g}; look at the run",
            observation,
        )
    else:
        alert = _decision(
            Action.ALERT,
            rule.name,
            Reason.ALERTED,
            f"rule {rule.name} alerts on {_what(observation)}; the run is not changed",
            observation,
        )
    if ledger.episode_handled(rule.name, observation.signal, observation.onset_step):
        return Deferral(
            observation.signal,
            rule.name,
            f"rule {rule.name} already alerted on this episode of {observation.signal} "
            f"(onset {observation.onset_step})",
        )
    return alert


def _what(observation: Observation) -> str:
    klass = "" if observation.anomaly_class is None else f" ({observation.anomaly_class.value})"
    at = "" if observation.step is None else f" at step {observation.step}"
    return f"{observation.signal}{klass}{at}"


def _decision(
    action: Action, rule: str, reason: Reason, message: str, observation: Observation
) -> Decision:
    return Decision(
        action=action,
        rule=rule,
        reason=reason.value,
        message=message,
        evidence=observation.evidence,
        signal=observation.signal,
        anomaly_class=observation.anomaly_class,
        step=observation.step,
        onset_step=observation.onset_step,
    )
