"""The decision each action makes for one matched observation: its numbers, its reason and
a message a person can act on. Budgets and escalation are checked here, where the action
is known; which rule matched (and whether to act at all) is the engine's business. The
appliers (those taking a `Matched`) are what the action registry names for each action.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import Action, AnomalyClass
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import RecoveryRule, RecoverySpec, RollbackParams
from stabletrain_operator.policy.action_kind import Matched
from stabletrain_operator.policy.arithmetic import (
    reduced_lr_scale,
    skip_around,
    target_bound,
    tidy_scale,
)
from stabletrain_operator.policy.decision import ESCALATION_RULE, MANUAL_RULE, Decision, Deferral
from stabletrain_operator.policy.observation import Observation
from stabletrain_operator.policy.skip_wording import describe_skip

if TYPE_CHECKING:
    # Only a type here: the ledger reads the action registry, which names these appliers.
    from stabletrain_operator.policy.ledger import PolicyLedger


def manual_rollback(
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
        decision_for(
            Action.ROLLBACK,
            MANUAL_RULE,
            Reason.MANUAL_ROLLBACK,
            f"manual rollback request {observation.request_id}: resuming from {target}",
            observation,
        ),
        lr_scale=lr_scale if factor is None else tidy_scale(lr_scale * factor),
        skip=observation.skip,
        rewarmup_steps=0 if factor is None else RollbackParams().rewarmup_steps,
        target_step_at_most=observation.to_step,
        request_id=observation.request_id,
    )


def rollback(matched: Matched) -> Decision:
    """A rollback around the onset, harder per recurrence; the escalation's final action
    once recurrences exceed the limit; Fail once the rollback budget is spent."""
    recovery, rule, observation, ledger = (
        matched.recovery,
        matched.rule,
        matched.observation,
        matched.ledger,
    )
    anchor = observation.anchor_step
    kind = observation.anomaly_class
    within = recovery.escalation.within_steps
    level = 0
    if anchor is not None:
        level = len(ledger.rollbacks_near(anchor, within, kind))
    confirming = observation.recurrence_of
    if confirming is not None and _all_of_kind(ledger, confirming, kind):
        level = max(level, len(ledger.rollbacks_near(confirming, within, kind)), 1)
    if level > recovery.escalation.max_recurrences:
        return _final_action(recovery, observation, ledger, level)
    budget = recovery.budgets.max_rollbacks
    if ledger.rollbacks_used >= budget:
        return decision_for(
            Action.FAIL,
            rule.name,
            Reason.ROLLBACK_BUDGET_EXHAUSTED,
            f"{describe(observation)} needs a rollback, but all {budget} rollbacks of "
            "budgets.maxRollbacks are used; the run keeps diverging, so look at the data "
            "and the LR schedule before raising the budget",
            observation,
        )
    params = rule.rollback_params()
    new_scale = reduced_lr_scale(
        matched.lr_scale, params.lr_factor, params.lr_floor, times=level + 1
    )
    skip = None
    if anchor is not None:
        skip = skip_around(anchor, params, level, observation.suspect_shards)
    decision = decision_for(
        Action.ROLLBACK,
        rule.name,
        Reason.ESCALATED if level else Reason.ROLLBACK_STARTED,
        _rollback_message(rule, observation, anchor, new_scale, level=level, skip=skip),
        observation,
    )
    if skip is None or anchor is None:
        return replace(decision, lr_scale=new_scale, rewarmup_steps=params.rewarmup_steps)
    return replace(
        decision,
        lr_scale=new_scale,
        skip=(skip,),
        rewarmup_steps=params.rewarmup_steps,
        target_step_at_most=target_bound(anchor, params, level),
        escalation_level=level,
    )


def _all_of_kind(ledger: PolicyLedger, onset: int, kind: AnomalyClass | None) -> bool:
    """Every rollback at the onset being confirmed answered this kind of fault (`same_kind`):
    only then is this signal that incident coming back. Filtering by kind keeps them all."""
    return ledger.rollbacks_near(onset, 0, kind) == ledger.rollbacks_near(onset, 0)


def _rollback_message(
    rule: RecoveryRule,
    observation: Observation,
    anchor: int | None,
    new_scale: float,
    *,
    level: int,
    skip: SkipRange | None,
) -> str:
    where = "" if anchor is None else f" with onset at step {anchor}"
    harder = ""
    if level:
        harder = (
            f"; recurrence {level} near an earlier rollback's onset, so the skip range and "
            "the distance to the checkpoint are widened"
        )
    skipping = "" if skip is None else f", skipping {describe_skip(skip)}"
    return (
        f"rule {rule.name} rolls back on {describe(observation)}{where}: resuming before the "
        f"onset with LR scale {new_scale:.4g}{skipping}{harder}"
    )


def _final_action(
    recovery: RecoverySpec, observation: Observation, ledger: PolicyLedger, level: int
) -> Decision:
    """Recurrences beyond escalation.maxRecurrences: rollbacks are not fixing this."""
    escalation = recovery.escalation
    why = (
        f"{describe(observation)} recurred {level} times within {escalation.within_steps} steps "
        f"of earlier rollbacks' onsets (escalation.maxRecurrences is "
        f"{escalation.max_recurrences})"
    )
    if escalation.final_action is Action.FAIL:
        return decision_for(
            Action.FAIL,
            ESCALATION_RULE,
            Reason.ESCALATED,
            f"{why}; failing the job as escalation.finalAction says",
            observation,
        )
    if observation.tripped and escalation.final_action is Action.ALERT:
        restarted = restart(recovery, ESCALATION_RULE, observation, ledger)
        if restarted.action is Action.FAIL:
            return restarted
        return replace(
            restarted,
            reason=Reason.ESCALATED,
            message=(
                f"{why}; escalation.finalAction is Alert, and since the agent had stopped "
                "training the run restarts from its latest checkpoint without further changes"
            ),
        )
    return decision_for(
        escalation.final_action,
        ESCALATION_RULE,
        Reason.ESCALATED,
        f"{why}; escalation.finalAction is {escalation.final_action.value}",
        observation,
    )


def restart(
    recovery: RecoverySpec, rule_name: str, observation: Observation, ledger: PolicyLedger
) -> Decision:
    budget = recovery.budgets.max_restarts
    if ledger.restarts_used >= budget:
        return decision_for(
            Action.FAIL,
            rule_name,
            Reason.RESTART_BUDGET_EXHAUSTED,
            f"{describe(observation)} needs a restart, but all {budget} restarts of "
            "budgets.maxRestarts are used; check the nodes and the pods' logs before "
            "raising the budget",
            observation,
        )
    return decision_for(
        Action.RESTART_FROM_LATEST,
        rule_name,
        Reason.RESTART_STARTED,
        f"rule {rule_name} restarts from the latest checkpoint after {describe(observation)}; "
        "LR and data unchanged",
        observation,
    )


def restart_by_rule(matched: Matched) -> Decision:
    """RestartFromLatest, against budgets.maxRestarts."""
    return restart(matched.recovery, matched.rule.name, matched.observation, matched.ledger)


def fail_by_rule(matched: Matched) -> Decision:
    name = matched.rule.name
    return decision_for(
        Action.FAIL,
        name,
        Reason.FAILED_BY_POLICY,
        f"rule {name} fails the job on {describe(matched.observation)}",
        matched.observation,
    )


def reduce_lr(matched: Matched) -> Decision | Deferral:
    """The LR scale lowered live, once per rule cooldown; at its floor, an Alert instead."""
    deferred = _cooling_down(matched)
    if deferred is not None:
        return deferred
    rule, observation, lr_scale = matched.rule, matched.observation, matched.lr_scale
    params = rule.reduce_lr_params()
    new_scale = reduced_lr_scale(lr_scale, params.lr_factor, params.lr_floor)
    if new_scale < lr_scale:
        return replace(
            decision_for(
                Action.REDUCE_LR,
                rule.name,
                Reason.LR_REDUCED,
                f"rule {rule.name} lowers the LR scale from {lr_scale:.4g} to "
                f"{new_scale:.4g} on {describe(observation)}, without a restart",
                observation,
            ),
            lr_scale=new_scale,
        )
    return _alert_once(
        matched,
        f"rule {rule.name} would lower the LR on {describe(observation)}, but the LR scale "
        f"is already at its floor {params.lr_floor:.4g}; look at the run",
    )


def alert(matched: Matched) -> Decision | Deferral:
    """An Alert, once per episode and not again within the rule's cooldown."""
    deferred = _cooling_down(matched)
    if deferred is not None:
        return deferred
    rule = matched.rule
    return _alert_once(
        matched,
        f"rule {rule.name} alerts on {describe(matched.observation)}; the run is not changed",
    )


def _cooling_down(matched: Matched) -> Deferral | None:
    """A live action of the same rule within budgets.cooldownSeconds defers this one."""
    rule, recovery, now = matched.rule, matched.recovery, matched.now
    last = matched.ledger.last_live_action(rule.name)
    cooldown = timedelta(seconds=recovery.budgets.cooldown_seconds)
    if last is not None and now - last.at < cooldown:
        return Deferral(
            matched.observation.signal,
            rule.name,
            f"rule {rule.name} acted {(now - last.at).total_seconds():.0f} s ago, inside "
            f"budgets.cooldownSeconds ({recovery.budgets.cooldown_seconds}); "
            f"{describe(matched.observation)} deferred",
        )
    return None


def _alert_once(matched: Matched, message: str) -> Decision | Deferral:
    """A scraped signal keeps firing while its episode lasts: one Alert per episode."""
    rule, observation = matched.rule, matched.observation
    if matched.ledger.episode_handled(rule.name, observation.signal, observation.onset_step):
        return Deferral(
            observation.signal,
            rule.name,
            f"rule {rule.name} already alerted on this episode of {observation.signal} "
            f"(onset {observation.onset_step})",
        )
    return decision_for(Action.ALERT, rule.name, Reason.ALERTED, message, observation)


def describe(observation: Observation) -> str:
    klass = "" if observation.anomaly_class is None else f" ({observation.anomaly_class.value})"
    at = "" if observation.step is None else f" at step {observation.step}"
    return f"{observation.signal}{klass}{at}"


def decision_for(
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
