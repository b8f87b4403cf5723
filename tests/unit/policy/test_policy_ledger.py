"""The ledger survives the trip through status JSON, and budgets survive without it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from stabletrain_agent.contract.directives import SkipRange
from stabletrain_agent.contract.names import Action, AnomalyClass
from stabletrain_operator.api.status import Counters, RollbackRecord, StableTrainingJobStatus
from stabletrain_operator.policy import AlertEpisode, PolicyLedger, RollbackMemory
from stabletrain_operator.policy.ledger import RAISED_ALERTS_MAX, RECENT_ROLLBACKS_MAX

AT = datetime(2026, 3, 1, 8, 30, tzinfo=UTC)


def full_ledger() -> PolicyLedger:
    return PolicyLedger(
        rollbacks_used=2,
        restarts_used=1,
        last_action_at=AT,
        recent_rollbacks=(
            RollbackMemory(
                onset_step=3007,
                lr_scale=0.5,
                skip=(SkipRange(first=2957, last=3257),),
                escalation_level=0,
            ),
        ),
        live_actions=(
            AlertEpisode(rule="report-only", signal="GradNormSpike", onset_step=9, at=AT),
        ),
        last_manual_request_id="r-7",
    )


def test_round_trip_through_json_text() -> None:
    ledger = full_ledger()
    text = json.dumps(ledger.to_status())
    assert PolicyLedger.from_status(json.loads(text)) == ledger


def test_malformed_ledger_names_the_field() -> None:
    data = full_ledger().to_status()
    data["recent_rollbacks"][0]["onset_step"] = "soon"
    with pytest.raises(ValueError, match=r"recent_rollbacks\.0\.onset_step"):
        PolicyLedger.from_status(data)
    with pytest.raises(ValueError, match="invalid policy ledger"):
        PolicyLedger.from_status(["not", "a", "ledger"])


def test_rebuilt_from_status_counters_and_history() -> None:
    def entry(action: Action, onset: int | None, request_id: str = "") -> RollbackRecord:
        return RollbackRecord(
            time=AT,
            action=action,
            signal="LossSpike",
            anomaly_class=AnomalyClass.BAD_BATCH,
            onset_step=onset,
            from_step=100,
            to_step=0,
            lr_scale=0.5,
            request_id=request_id,
            attempt=1,
        )

    status = StableTrainingJobStatus(
        counters=Counters(rollbacks=3, restarts=4),
        rollback_history=(
            entry(Action.ROLLBACK, 700),
            entry(Action.ROLLBACK, None, request_id="r-1"),
            entry(Action.RESTART_FROM_LATEST, None),
        ),
        last_manual_request_id="r-1",
    )
    ledger = PolicyLedger.from_job_status(status)
    assert (ledger.rollbacks_used, ledger.restarts_used) == (3, 4)
    assert [m.onset_step for m in ledger.recent_rollbacks] == [700]
    assert ledger.last_manual_request_id == "r-1"
    assert ledger.last_action_at == AT
    assert PolicyLedger.from_job_status(StableTrainingJobStatus()) == PolicyLedger()


def test_memories_are_bounded_oldest_first_out() -> None:
    ledger = PolicyLedger()
    for onset in range(RECENT_ROLLBACKS_MAX + 3):
        ledger = ledger.with_rollback(RollbackMemory(onset_step=onset, lr_scale=1.0), now=AT)
    assert len(ledger.recent_rollbacks) == RECENT_ROLLBACKS_MAX
    assert ledger.recent_rollbacks[0].onset_step == 3
    assert ledger.rollbacks_used == RECENT_ROLLBACKS_MAX + 3
    for onset in range(RAISED_ALERTS_MAX + 1):
        ledger = ledger.with_live_action(AlertEpisode("r", "GradNormSpike", onset, AT))
    assert len(ledger.live_actions) == RAISED_ALERTS_MAX
    assert not ledger.episode_handled("r", "GradNormSpike", 0)
    assert ledger.episode_handled("r", "GradNormSpike", RAISED_ALERTS_MAX)
