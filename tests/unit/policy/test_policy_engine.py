"""Every branch of decide/record: matching, defaults, budgets, cooldown, escalation, manual."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import Action, AnomalyClass, Signal
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import (
    BudgetsSpec,
    EscalationSpec,
    RecoveryRule,
    RecoverySpec,
    ReduceLRParams,
    RollbackParams,
    SkipData,
)
from stabletrain_operator.policy import (
    Decision,
    Observation,
    ObservationSource,
    PolicyLedger,
    decide,
    evaluate,
    manual_request,
    record,
    trip_signals,
    worker_failure,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
DEFAULT = RecoverySpec()


def trip(
    signal: str = Signal.LOSS_SPIKE.value,
    *,
    step: int = 3010,
    onset: int = 3007,
    anomaly_class: AnomalyClass = AnomalyClass.BAD_BATCH,
    firing_with: tuple[str, ...] = (),
    suspect_shards: tuple[str, ...] = (),
) -> Observation:
    return Observation(
        signal=signal,
        anomaly_class=anomaly_class,
        step=step,
        onset_step=onset,
        sustained=True,
        tripped=True,
        evidence=f"{signal} evidence",
        source=ObservationSource.TRIP_REPORT,
        firing_with=firing_with,
        suspect_shards=suspect_shards,
    )


def scraped(
    signal: str,
    *,
    step: int = 500,
    onset: int = 490,
    sustained: bool = True,
    anomaly_class: AnomalyClass = AnomalyClass.DIVERGENCE,
) -> Observation:
    return Observation(
        signal=signal,
        anomaly_class=anomaly_class,
        step=step,
        onset_step=onset,
        sustained=sustained,
        tripped=False,
        evidence=f"{signal} firing",
        source=ObservationSource.SCRAPE,
    )


def run(
    observations: list[Observation],
    *,
    recovery: RecoverySpec = DEFAULT,
    ledger: PolicyLedger | None = None,
    now: datetime = NOW,
    lr_scale: float = 1.0,
) -> Decision | None:
    return decide(recovery, observations, ledger or PolicyLedger(), now=now, lr_scale=lr_scale)


def test_default_policy_rolls_back_a_sustained_loss_spike_with_the_documented_numbers() -> None:
    decision = run([trip()])
    assert decision is not None
    assert decision.action is Action.ROLLBACK
    assert decision.rule == "loss-spike"
    assert decision.reason == Reason.ROLLBACK_STARTED.value
    assert decision.lr_scale == pytest.approx(0.5)
    assert decision.skip == (SkipRange(first=3007 - 50, last=3007 + 250),)
    assert decision.target_step_at_most == 3007 - 100
    assert decision.rewarmup_steps == 100
    assert decision.escalation_level == 0
    assert decision.onset_step == 3007
    assert decision.evidence == "LossSpike evidence"
    assert "3007" in decision.message


def test_default_rollback_skips_only_the_suspect_shards_in_the_window() -> None:
    """Before: the skip was the whole window [2957, 3257] whatever the lineage named.
    After: only the lineage's suspect shards inside that window, and the message says so."""
    decision = run([trip(suspect_shards=("shard-0008", "shard-0007"))])
    assert decision is not None
    assert decision.skip == (
        SkipRange(first=2957, last=3257, shard_ids=("shard-0008", "shard-0007")),
    )
    assert "skipping shard(s) shard-0008, shard-0007 in the data of steps 2957-3257" in (
        decision.message
    )


def test_the_whole_window_is_skipped_without_lineage_or_when_the_policy_asks() -> None:
    without_lineage = run([trip()])
    assert without_lineage is not None
    assert without_lineage.skip == (SkipRange(first=2957, last=3257),)
    assert "skipping the data of steps 2957-3257" in without_lineage.message
    rule = RecoveryRule(
        name="steps",
        on_signals=(Signal.LOSS_SPIKE.value,),
        action=Action.ROLLBACK,
        rollback=RollbackParams(skip_data=SkipData.STEP_RANGE),
    )
    asked = run([trip(suspect_shards=("shard-0008",))], recovery=RecoverySpec(rules=(rule,)))
    assert asked is not None
    assert asked.skip == (SkipRange(first=2957, last=3257),)


def test_a_recurrence_skips_the_whole_widened_window_despite_suspects() -> None:
    first = run([trip(suspect_shards=("shard-0008",))])
    assert first is not None
    ledger = record(PolicyLedger(), first, now=NOW)
    again = run([trip(step=3034, onset=3030, suspect_shards=("shard-0009",))], ledger=ledger)
    assert again is not None
    assert again.escalation_level == 1
    assert again.skip == (SkipRange(first=3030 - 100, last=3030 + 500),)


def test_default_policy_rolls_back_non_finite_by_its_own_rule() -> None:
    decision = run([trip(Signal.NON_FINITE.value, anomaly_class=AnomalyClass.NUMERICAL)])
    assert decision is not None
    assert (decision.action, decision.rule) == (Action.ROLLBACK, "non-finite")


def test_default_policy_only_alerts_on_grad_norm_spikes() -> None:
    decision = run([scraped(Signal.GRAD_NORM_SPIKE.value)])
    assert decision is not None
    assert (decision.action, decision.rule) == (Action.ALERT, "report-only")
    assert decision.reason == Reason.ALERTED.value


def test_a_scraped_finding_that_is_not_sustained_yet_changes_nothing() -> None:
    assert run([scraped(Signal.GRAD_NORM_SPIKE.value, sustained=False)]) is None


def test_lr_scale_is_cumulative_and_floored() -> None:
    decision = run([trip()], lr_scale=0.25)
    assert decision is not None
    assert decision.lr_scale == pytest.approx(0.125)
    floored = run([trip()], lr_scale=0.06)
    assert floored is not None
    assert floored.lr_scale == pytest.approx(0.05)
    below_floor = run([trip()], lr_scale=0.01)
    assert below_floor is not None
    assert below_floor.lr_scale == pytest.approx(0.01), "a rollback never raises the LR"


def test_skip_and_target_never_go_below_step_zero() -> None:
    decision = run([trip(step=40, onset=30)])
    assert decision is not None
    assert decision.skip == (SkipRange(first=0, last=280),)
    assert decision.target_step_at_most == 0


def test_first_matching_rule_wins_in_order() -> None:
    recovery = RecoverySpec(
        rules=(
            RecoveryRule(name="alert-first", on_signals=("LossSpike",), action=Action.ALERT),
            RecoveryRule(name="rollback", on_signals=("LossSpike",), action=Action.ROLLBACK),
        )
    )
    decision = run([scraped("LossSpike")], recovery=recovery)
    assert decision is not None
    assert decision.rule == "alert-first"


def test_a_cumulative_lr_scale_reads_as_the_product_not_float_noise() -> None:
    """kubectl's LR SCALE column showed 0.48999999999999994 after two rollbacks at 0.7."""
    seventy = RecoverySpec(
        rules=(
            RecoveryRule(
                name="spike",
                on_signals=("LossSpike",),
                action=Action.ROLLBACK,
                rollback=RollbackParams(lr_factor=0.7),
            ),
        )
    )
    second = run([trip()], recovery=seventy, lr_scale=0.7)
    assert second is not None
    assert second.lr_scale == 0.49
    third = run([trip()], recovery=seventy, lr_scale=second.lr_scale)
    assert third is not None
    assert third.lr_scale == 0.343


def test_on_classes_restricts_the_match() -> None:
    recovery = RecoverySpec(
        rules=(
            RecoveryRule(
                name="bad-batch",
                on_signals=("LossSpike",),
                on_classes=(AnomalyClass.BAD_BATCH,),
                action=Action.ROLLBACK,
                rollback=RollbackParams(lr_factor=0.9),
            ),
            RecoveryRule(
                name="divergence",
                on_signals=("LossSpike",),
                action=Action.ROLLBACK,
                rollback=RollbackParams(lr_factor=0.3),
            ),
        )
    )
    bad_batch = run([trip(anomaly_class=AnomalyClass.BAD_BATCH)], recovery=recovery)
    divergence = run([trip(anomaly_class=AnomalyClass.DIVERGENCE)], recovery=recovery)
    assert bad_batch is not None
    assert divergence is not None
    assert (bad_batch.rule, bad_batch.lr_scale) == ("bad-batch", pytest.approx(0.9))
    assert (divergence.rule, divergence.lr_scale) == ("divergence", pytest.approx(0.3))


REWARD_HACKING = RecoverySpec(
    rules=(
        RecoveryRule(
            name="reward-hacking",
            on_signals=("custom:entropy_low",),
            while_firing=("custom:reward_jump",),
            action=Action.ROLLBACK,
            rollback=RollbackParams(lr_factor=0.25),
        ),
        RecoveryRule(name="entropy", on_signals=("custom:entropy_low",), action=Action.ALERT),
    )
)


def test_compound_condition_needs_every_while_firing_signal() -> None:
    alone = run([scraped("custom:entropy_low")], recovery=REWARD_HACKING)
    assert alone is not None
    assert (alone.rule, alone.action) == ("entropy", Action.ALERT)
    with_trip_report_firing = run(
        [trip("custom:entropy_low", firing_with=("custom:reward_jump",))], recovery=REWARD_HACKING
    )
    assert with_trip_report_firing is not None
    assert with_trip_report_firing.rule == "reward-hacking"
    assert with_trip_report_firing.lr_scale == pytest.approx(0.25)
    with_scrape = run(
        [scraped("custom:entropy_low"), scraped("custom:reward_jump")], recovery=REWARD_HACKING
    )
    assert with_scrape is not None
    assert with_scrape.rule == "reward-hacking"


def test_a_trip_whose_first_match_only_alerts_is_decided_by_the_rule_it_tripped_for() -> None:
    """Never a restart from the latest checkpoint next to the onset: the stopping rule that
    made the agent trip on the signal decides, and says which rule matched first."""
    decision = run([trip("custom:entropy_low")], recovery=REWARD_HACKING)
    assert decision is not None
    assert (decision.action, decision.rule) == (Action.ROLLBACK, "reward-hacking")
    assert decision.lr_scale == pytest.approx(0.25)
    assert decision.target_step_at_most is not None
    assert decision.target_step_at_most <= (decision.onset_step or 0) - 100
    assert decision.message.startswith("rule entropy (Alert) matched custom:entropy_low"), (
        decision.message
    )
    assert "had already stopped training for rule reward-hacking, which decides" in (
        decision.message
    )
    only_alerts = RecoverySpec(
        rules=(RecoveryRule(name="entropy", on_signals=("custom:entropy_low",),
                            action=Action.ALERT),)
    )  # fmt: skip
    stale = run([trip("custom:entropy_low")], recovery=only_alerts)
    assert stale is not None
    assert (stale.action, stale.reason) == (Action.FAIL, Reason.NO_MATCHING_RULE.value)
    assert "no stopping rule of the policy in force names it" in stale.message


def test_a_trip_no_rule_matches_fails_with_no_matching_rule() -> None:
    recovery = RecoverySpec(
        rules=(
            RecoveryRule(
                name="only-bad-batches",
                on_signals=("LossSpike",),
                on_classes=(AnomalyClass.BAD_BATCH,),
                action=Action.ROLLBACK,
            ),
        )
    )
    decision = run([trip(anomaly_class=AnomalyClass.DIVERGENCE)], recovery=recovery)
    assert decision is not None
    assert (decision.action, decision.rule) == (Action.FAIL, "unmatched-trip")
    assert decision.reason == Reason.NO_MATCHING_RULE.value
    assert "no rule matches" in decision.message


def test_a_scraped_signal_no_rule_matches_is_only_recorded() -> None:
    recovery = RecoverySpec(
        rules=(RecoveryRule(name="nan", on_signals=("NonFinite",), action=Action.ROLLBACK),)
    )
    assert run([scraped("ThroughputDrop")], recovery=recovery) is None


def test_worker_failure_without_a_rule_restarts_from_latest_by_the_builtin() -> None:
    recovery = RecoverySpec(
        rules=(RecoveryRule(name="nan", on_signals=("NonFinite",), action=Action.ROLLBACK),)
    )
    decision = run([worker_failure(step=1200, evidence="OOMKilled")], recovery=recovery)
    assert decision is not None
    assert (decision.action, decision.rule) == (
        Action.RESTART_FROM_LATEST,
        "default-infrastructure",
    )
    assert decision.lr_scale is None
    assert decision.skip == ()
    assert decision.evidence == "OOMKilled"


def test_default_policy_restarts_worker_failures_by_its_infrastructure_rule() -> None:
    decision = run([worker_failure(step=10, evidence="node lost")])
    assert decision is not None
    assert (decision.action, decision.rule) == (Action.RESTART_FROM_LATEST, "infrastructure")
    assert decision.reason == Reason.RESTART_STARTED.value


def test_a_fail_rule_fails_by_policy() -> None:
    recovery = RecoverySpec(
        rules=(RecoveryRule(name="give-up", on_signals=("NonFinite",), action=Action.FAIL),)
    )
    decision = run([trip("NonFinite", anomaly_class=AnomalyClass.NUMERICAL)], recovery=recovery)
    assert decision is not None
    assert (decision.action, decision.reason) == (Action.FAIL, Reason.FAILED_BY_POLICY.value)


def test_budgets_are_separate_and_a_spent_one_fails_with_its_reason() -> None:
    recovery = RecoverySpec(budgets=BudgetsSpec(max_rollbacks=2, max_restarts=1))
    spent_rollbacks = PolicyLedger(rollbacks_used=2, restarts_used=0)
    failed = run([trip()], recovery=recovery, ledger=spent_rollbacks)
    assert failed is not None
    assert (failed.action, failed.reason) == (Action.FAIL, Reason.ROLLBACK_BUDGET_EXHAUSTED.value)
    assert "maxRollbacks" in failed.message
    restart = run(
        [worker_failure(step=5, evidence="crash")], recovery=recovery, ledger=spent_rollbacks
    )
    assert restart is not None
    assert restart.action is Action.RESTART_FROM_LATEST, "restarts have their own budget"
    spent_restarts = PolicyLedger(restarts_used=1)
    failed_restart = run(
        [worker_failure(step=5, evidence="crash")], recovery=recovery, ledger=spent_restarts
    )
    assert failed_restart is not None
    assert failed_restart.reason == Reason.RESTART_BUDGET_EXHAUSTED.value
    assert run([trip()], recovery=recovery, ledger=spent_restarts) is not None


def test_record_counts_each_action_against_its_own_budget() -> None:
    ledger = PolicyLedger()
    rollback = run([trip()])
    restart = run([worker_failure(step=5, evidence="crash")])
    assert rollback is not None
    assert restart is not None
    ledger = record(ledger, rollback, now=NOW)
    ledger = record(ledger, restart, now=NOW + timedelta(seconds=1))
    assert (ledger.rollbacks_used, ledger.restarts_used) == (1, 1)
    assert ledger.last_action_at == NOW + timedelta(seconds=1)
    assert ledger.recent_rollbacks[0].onset_step == 3007
    assert ledger.recent_rollbacks[0].lr_scale == pytest.approx(0.5)
    failure = run([trip()], ledger=PolicyLedger(rollbacks_used=5))
    assert failure is not None
    assert record(ledger, failure, now=NOW) == ledger


def test_scraped_stopping_decision_inside_the_cooldown_is_deferred() -> None:
    recovery = RecoverySpec(
        rules=(
            RecoveryRule(name="grad", on_signals=("GradNormSpike",), action=Action.ROLLBACK),
            RecoveryRule(name="nan", on_signals=("NonFinite",), action=Action.ROLLBACK),
        ),
        budgets=BudgetsSpec(cooldown_seconds=300),
    )
    ledger = PolicyLedger(rollbacks_used=1, last_action_at=NOW - timedelta(seconds=100))
    assert run([scraped("GradNormSpike")], recovery=recovery, ledger=ledger) is None
    later = run(
        [scraped("GradNormSpike")], recovery=recovery, ledger=ledger, now=NOW + timedelta(300)
    )
    assert later is not None
    assert later.action is Action.ROLLBACK


def test_trips_pod_failures_and_non_finite_values_ignore_the_cooldown() -> None:
    ledger = PolicyLedger(rollbacks_used=1, last_action_at=NOW - timedelta(seconds=1))
    tripped = run([trip()], ledger=ledger)
    assert tripped is not None
    assert tripped.action is Action.ROLLBACK
    crashed = run([worker_failure(step=1, evidence="crash")], ledger=ledger)
    assert crashed is not None
    assert crashed.action is Action.RESTART_FROM_LATEST
    nan = run([scraped("NonFinite", anomaly_class=AnomalyClass.NUMERICAL)], ledger=ledger)
    assert nan is not None
    assert nan.action is Action.ROLLBACK


def test_escalation_widens_the_skip_and_lowers_the_lr_then_takes_the_final_action() -> None:
    recovery = RecoverySpec(escalation=EscalationSpec(within_steps=500, max_recurrences=2))
    ledger = PolicyLedger()
    scale = 1.0
    levels = []
    for onset in (3000, 3100, 2900):
        decision = run(
            [trip(step=onset + 4, onset=onset)], recovery=recovery, ledger=ledger, lr_scale=scale
        )
        assert decision is not None
        assert decision.action is Action.ROLLBACK
        levels.append(
            (
                decision.escalation_level,
                decision.lr_scale,
                decision.skip[0].length,
                decision.target_step_at_most,
            )
        )
        assert decision.lr_scale is not None
        scale = decision.lr_scale
        ledger = record(ledger, decision, now=NOW)
    assert levels == [
        (0, pytest.approx(0.5), 301, 2900),
        (1, pytest.approx(0.125), 601, 3100 - 200),
        (2, pytest.approx(0.05), 1201, 2900 - 400),
    ]
    final = run([trip(step=3054, onset=3050)], recovery=recovery, ledger=ledger, lr_scale=scale)
    assert final is not None
    assert (final.action, final.reason, final.rule) == (
        Action.FAIL,
        Reason.ESCALATED.value,
        "escalation",
    )
    assert "recurred 3 times" in final.message
    far_away = run([trip(step=9004, onset=9000)], recovery=recovery, ledger=ledger)
    assert far_away is not None
    assert (far_away.action, far_away.escalation_level) == (Action.ROLLBACK, 0)


def test_a_nan_after_a_spike_rollback_is_a_new_incident_and_a_spike_again_is_not() -> None:
    spike = _decided(run([trip(onset=3000)]))
    ledger = record(PolicyLedger(), spike, now=NOW)
    assert ledger.recent_rollbacks[0].anomaly_class is AnomalyClass.BAD_BATCH
    nan = trip(Signal.NON_FINITE.value, step=3182, onset=3180, anomaly_class=AnomalyClass.NUMERICAL)
    first_nan = _decided(run([nan], ledger=ledger, lr_scale=0.5))
    assert (first_nan.escalation_level, first_nan.reason) == (0, Reason.ROLLBACK_STARTED.value)
    assert first_nan.lr_scale == pytest.approx(0.25), "one LR factor, not the spike's level 1"
    ledger = record(ledger, first_nan, now=NOW)
    diverged = trip(step=3204, onset=3200, anomaly_class=AnomalyClass.DIVERGENCE)
    spike_again = _decided(run([diverged], ledger=ledger, lr_scale=0.25))
    assert (spike_again.escalation_level, spike_again.reason) == (1, Reason.ESCALATED.value)


def test_a_nan_while_a_spike_rollback_is_confirming_is_not_its_recurrence() -> None:
    ledger = record(PolicyLedger(), _decided(run([trip(onset=3000)])), now=NOW)
    confirming = replace(
        trip(Signal.NON_FINITE.value, step=9004, onset=9000, anomaly_class=AnomalyClass.NUMERICAL),
        recurrence_of=3000,
    )
    assert _decided(run([confirming], ledger=ledger)).escalation_level == 0
    spike = replace(trip(step=9004, onset=9000), recurrence_of=3000)
    assert _decided(run([spike], ledger=ledger)).escalation_level == 1


def test_a_ledger_kept_without_classes_still_escalates_any_recurrence() -> None:
    older = PolicyLedger.from_status(  # as an operator before anomaly classes wrote it
        {"rollbacks_used": 1, "recent_rollbacks": [{"onset_step": 3000, "lr_scale": 0.5}]}
    )
    nan = trip(Signal.NON_FINITE.value, step=3104, onset=3100, anomaly_class=AnomalyClass.NUMERICAL)
    assert _decided(run([nan], ledger=older, lr_scale=0.5)).escalation_level == 1


def test_escalated_rollback_carries_the_escalated_reason() -> None:
    ledger = record(PolicyLedger(), _decided(run([trip(onset=3000)])), now=NOW)
    decision = run([trip(onset=3010)], ledger=ledger)
    assert decision is not None
    assert decision.reason == Reason.ESCALATED.value
    assert "recurrence 1" in decision.message


def test_final_action_alert_restarts_a_tripped_run_and_alerts_a_scraped_one() -> None:
    recovery = RecoverySpec(
        rules=(
            RecoveryRule(name="spike", on_signals=("LossSpike",), action=Action.ROLLBACK),
            RecoveryRule(name="grad", on_signals=("GradNormSpike",), action=Action.ROLLBACK),
        ),
        escalation=EscalationSpec(max_recurrences=0, final_action=Action.ALERT),
    )
    ledger = record(PolicyLedger(), _decided(run([trip(onset=400)], recovery=recovery)), now=NOW)
    tripped = run([trip(onset=420)], recovery=recovery, ledger=ledger)
    assert tripped is not None
    assert (tripped.action, tripped.reason) == (Action.RESTART_FROM_LATEST, Reason.ESCALATED.value)
    later = NOW + timedelta(hours=1)
    alerted = run(
        [scraped("GradNormSpike", onset=410)], recovery=recovery, ledger=ledger, now=later
    )
    assert alerted is not None
    assert (alerted.action, alerted.reason) == (Action.ALERT, Reason.ESCALATED.value)


def test_a_report_only_signal_raises_one_alert_per_episode() -> None:
    recovery = RecoverySpec(budgets=BudgetsSpec(cooldown_seconds=0))
    ledger = PolicyLedger()
    alerts = 0
    for scrape in range(10):
        now = NOW + timedelta(seconds=15 * scrape)
        decision = run(
            [scraped("GradNormSpike", step=500 + scrape, onset=490)],
            recovery=recovery,
            ledger=ledger,
            now=now,
        )
        if decision is not None:
            alerts += 1
            ledger = record(ledger, decision, now=now)
    assert alerts == 1
    new_episode = run(
        [scraped("GradNormSpike", step=900, onset=880)], recovery=recovery, ledger=ledger
    )
    assert new_episode is not None


def test_live_actions_of_a_rule_respect_its_cooldown_across_episodes() -> None:
    ledger = record(PolicyLedger(), _decided(run([scraped("GradNormSpike", onset=490)])), now=NOW)
    soon = NOW + timedelta(seconds=60)
    assert run([scraped("GradNormSpike", onset=600)], ledger=ledger, now=soon) is None
    after = NOW + timedelta(seconds=301)
    assert run([scraped("GradNormSpike", onset=600)], ledger=ledger, now=after) is not None


REDUCE = RecoverySpec(
    rules=(
        RecoveryRule(
            name="calm-down",
            on_signals=("GradNormSpike",),
            action=Action.REDUCE_LR,
            reduce_lr=ReduceLRParams(lr_factor=0.5, lr_floor=0.2),
        ),
    ),
    budgets=BudgetsSpec(cooldown_seconds=120),
)


def test_reduce_lr_lowers_the_scale_live_then_alerts_at_the_floor() -> None:
    first = run([scraped("GradNormSpike")], recovery=REDUCE, lr_scale=0.8)
    assert first is not None
    assert (first.action, first.lr_scale, first.reason) == (
        Action.REDUCE_LR,
        pytest.approx(0.4),
        Reason.LR_REDUCED.value,
    )
    assert first.target_step_at_most is None
    ledger = record(PolicyLedger(), first, now=NOW)
    assert (
        run(
            [scraped("GradNormSpike")],
            recovery=REDUCE,
            ledger=ledger,
            lr_scale=0.4,
            now=NOW + timedelta(seconds=60),
        )
        is None
    )
    again = run(
        [scraped("GradNormSpike")],
        recovery=REDUCE,
        ledger=ledger,
        lr_scale=0.4,
        now=NOW + timedelta(seconds=121),
    )
    assert again is not None
    assert again.lr_scale == pytest.approx(0.2)
    at_floor = run([scraped("GradNormSpike")], recovery=REDUCE, lr_scale=0.2)
    assert at_floor is not None
    assert at_floor.action is Action.ALERT
    assert "floor" in at_floor.message


def test_manual_request_rolls_back_once_per_request_id() -> None:
    request = manual_request(
        request_id="r-1",
        step=5000,
        to_step=4000,
        lr_factor=0.5,
        skip=(SkipRange(first=4100, last=4200),),
        reason="bad shard 17",
    )
    decision = run([request], lr_scale=0.8)
    assert decision is not None
    assert (decision.action, decision.rule, decision.reason) == (
        Action.ROLLBACK,
        "manual",
        Reason.MANUAL_ROLLBACK.value,
    )
    assert decision.request_id == "r-1"
    assert decision.target_step_at_most == 4000
    assert decision.lr_scale == pytest.approx(0.4)
    assert decision.skip == (SkipRange(first=4100, last=4200),)
    assert decision.rewarmup_steps == 100
    assert decision.evidence == "bad shard 17"
    ledger = record(PolicyLedger(), decision, now=NOW)
    assert ledger.last_manual_request_id == "r-1"
    assert ledger.rollbacks_used == 1
    assert ledger.recent_rollbacks == (), "a manual rollback is not a recurrence anchor"
    assert run([request], ledger=ledger) is None


def test_manual_request_without_lr_factor_keeps_the_lr_and_ignores_the_budget() -> None:
    request = manual_request(
        request_id="r-2", step=10, to_step=None, lr_factor=None, skip=(), reason=""
    )
    decision = run([request], ledger=PolicyLedger(rollbacks_used=5), lr_scale=0.3)
    assert decision is not None
    assert decision.action is Action.ROLLBACK
    assert (decision.lr_scale, decision.rewarmup_steps) == (pytest.approx(0.3), 0)
    assert decision.target_step_at_most is None
    assert "newest stable checkpoint" in decision.message


def test_urgency_orders_manual_then_trip_then_pod_failure_then_scrape() -> None:
    request = manual_request(
        request_id="r-3", step=1, to_step=0, lr_factor=None, skip=(), reason=""
    )
    crash = worker_failure(step=1, evidence="crash")
    grad = scraped("GradNormSpike")
    manual_first = run([grad, crash, trip(), request])
    assert manual_first is not None
    assert manual_first.rule == "manual"
    trip_next = run([grad, crash, trip()])
    assert trip_next is not None
    assert trip_next.rule == "loss-spike"
    crash_next = run([grad, crash])
    assert crash_next is not None
    assert crash_next.rule == "infrastructure"


def test_trip_signals_are_what_stopping_rules_name_and_the_agent_computes() -> None:
    assert trip_signals(DEFAULT) == ("NonFinite", "LossSpike")
    assert trip_signals(REWARD_HACKING) == ("custom:entropy_low",)
    assert trip_signals(REDUCE) == ()


def test_decide_with_nothing_observed_is_none() -> None:
    assert run([]) is None


def _decided(decision: Decision | None) -> Decision:
    assert decision is not None
    return decision


def test_evaluate_says_why_firing_signals_changed_nothing() -> None:
    recovery = RecoverySpec(
        rules=(
            RecoveryRule(name="grad", on_signals=("GradNormSpike",), action=Action.ROLLBACK),
            RecoveryRule(name="tput", on_signals=("ThroughputDrop",), action=Action.ALERT),
        ),
        budgets=BudgetsSpec(cooldown_seconds=300),
    )
    ledger = PolicyLedger(
        rollbacks_used=1,
        last_action_at=NOW - timedelta(seconds=100),
        last_manual_request_id="r-9",
    )
    ledger = record(ledger, _decided(run([scraped("ThroughputDrop")], recovery=recovery)), now=NOW)
    request = manual_request(
        request_id="r-9", step=1, to_step=None, lr_factor=None, skip=(), reason=""
    )
    evaluation = evaluate(
        recovery,
        [
            request,
            scraped("GradNormSpike"),
            scraped("ThroughputDrop"),
            scraped("custom:val_loss"),
            scraped("LossSpike", sustained=False),
        ],
        ledger,
        now=NOW + timedelta(seconds=10),
        lr_scale=1.0,
    )
    assert evaluation.decision is None
    notes = [(d.signal, d.rule, d.message) for d in evaluation.deferred]
    assert notes == [
        ("Manual", "manual", "manual rollback request r-9 was handled already"),
        (
            "GradNormSpike",
            "grad",
            "rule grad would stop the run on GradNormSpike (Divergence) at step 500, but the "
            "last rollback or restart was 110 s ago, inside budgets.cooldownSeconds (300); "
            "deferred as the fading end of the episode already handled",
        ),
        (
            "ThroughputDrop",
            "tput",
            "rule tput acted 10 s ago, inside budgets.cooldownSeconds (300); ThroughputDrop "
            "(Divergence) at step 500 deferred",
        ),
        (
            "custom:val_loss",
            "",
            "no rule matches custom:val_loss (Divergence) at step 500; only recorded",
        ),
    ]
    assert decide(recovery, [scraped("ThroughputDrop")], ledger, now=NOW, lr_scale=1.0) is None


def test_evaluate_notes_an_episode_already_alerted() -> None:
    recovery = RecoverySpec(budgets=BudgetsSpec(cooldown_seconds=0))
    ledger = record(PolicyLedger(), _decided(run([scraped("GradNormSpike")])), now=NOW)
    evaluation = evaluate(recovery, [scraped("GradNormSpike")], ledger, now=NOW, lr_scale=1.0)
    assert evaluation.decision is None
    assert [d.message for d in evaluation.deferred] == [
        "rule report-only already alerted on this episode of GradNormSpike (onset 490)"
    ]
