"""The action registry is total and consistent: an action without an entry fails here, not
at run time in the docs generator, the replay plot or the state machine."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stabletrain_contract.names import Action, AnomalyClass, Signal
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import RecoveryRule, RecoverySpec
from stabletrain_operator.api.status import Counters
from stabletrain_operator.policy.action_kind import BUDGETED, StatusCounter
from stabletrain_operator.policy.action_registry import ACTION_KINDS, kind_of
from stabletrain_operator.policy.decision import Decision
from stabletrain_operator.policy.engine import decide, record
from stabletrain_operator.policy.ledger import PolicyLedger
from stabletrain_operator.policy.observation import Observation, ObservationSource

AT = datetime(2026, 3, 1, 8, 30, tzinfo=UTC)


def test_every_action_has_an_entry_under_its_own_name() -> None:
    assert set(ACTION_KINDS) == set(Action)
    for action, kind in ACTION_KINDS.items():
        assert kind.action is action


@pytest.mark.parametrize("action", list(Action))
def test_each_entry_is_complete(action: Action) -> None:
    kind = kind_of(action)
    assert kind.reason in set(Reason)
    assert kind.event_type in ("Normal", "Warning")
    assert callable(kind.decide)
    assert kind.doc.strip()
    assert kind.plot_colour


def test_each_counter_is_a_status_counter_and_budgets_belong_to_stopping_actions() -> None:
    assert {c.value for c in StatusCounter} <= set(Counters.model_fields)
    for kind in ACTION_KINDS.values():
        if kind.budgeted:
            assert kind.stops_the_run, kind.action


def test_each_budget_is_used_by_an_action() -> None:
    assert {k.counter for k in ACTION_KINDS.values()} >= BUDGETED


def test_live_actions_leave_distinct_reasons() -> None:
    live = [k.reason for k in ACTION_KINDS.values() if not k.stops_the_run]
    assert len(live) == len(set(live))


def test_what_each_built_in_action_means() -> None:
    """The registry's answers for the built-in actions, as the code compared them before."""
    rollback, restart, fail = (
        kind_of(Action.ROLLBACK),
        kind_of(Action.RESTART_FROM_LATEST),
        kind_of(Action.FAIL),
    )
    reduce_lr, alert = kind_of(Action.REDUCE_LR), kind_of(Action.ALERT)
    assert (rollback.stops_the_run, restart.stops_the_run, fail.stops_the_run) == (True,) * 3
    assert (reduce_lr.stops_the_run, alert.stops_the_run) == (False, False)
    assert (rollback.counter, restart.counter, fail.counter) == (
        StatusCounter.ROLLBACKS,
        StatusCounter.RESTARTS,
        None,
    )
    assert (reduce_lr.counter, alert.counter) == (StatusCounter.LR_REDUCTIONS, StatusCounter.ALERTS)
    assert rollback.goes_before_onset
    assert not restart.goes_before_onset
    assert fail.ends_the_job
    assert not restart.ends_the_job
    assert reduce_lr.event_type == "Normal"
    assert {rollback.event_type, restart.event_type, alert.event_type, fail.event_type} == {
        "Warning"
    }


@pytest.mark.parametrize("counter", sorted(BUDGETED))
def test_each_budgeted_counter_is_counted_by_the_engine_s_record(counter: StatusCounter) -> None:
    """A budget the ledger does not count would be spent without limit: every budgeted
    counter, recorded for an action that uses it, adds one to what the ledger says is used."""
    action = next(a for a, k in ACTION_KINDS.items() if k.counter is counter)
    decision = Decision(
        action=action,
        rule="r",
        reason="Test",
        message="m",
        evidence="e",
        signal="LossSpike",
        anomaly_class=None,
        step=10,
        onset_step=None,
    )
    before = PolicyLedger()
    after = record(before, decision, now=AT)
    assert after.used(counter) == before.used(counter) + 1
    assert after.last_action_at == AT


@pytest.mark.parametrize("action", sorted(Action))
def test_each_applier_decides_the_action_of_its_own_entry(action: Action) -> None:
    """An entry that borrows another action's applier would decide that other action: a
    rule naming the new one would act as the old, and nothing else would notice."""
    rule = RecoveryRule(name="only", on_signals=(Signal.LOSS_SPIKE.value,), action=action)
    stops = kind_of(action).stops_the_run  # a trip report for those, a scrape for the others
    fired = Observation(
        signal=Signal.LOSS_SPIKE.value, anomaly_class=AnomalyClass.BAD_BATCH, step=3010,
        onset_step=3007, sustained=True, tripped=stops, evidence="loss spike",
        source=ObservationSource.TRIP_REPORT if stops else ObservationSource.SCRAPE,
    )  # fmt: skip
    decision = decide(RecoverySpec(rules=(rule,)), [fired], PolicyLedger(), now=AT, lr_scale=1.0)
    assert decision is not None
    assert decision.action is action
    assert decision.reason == kind_of(action).reason
