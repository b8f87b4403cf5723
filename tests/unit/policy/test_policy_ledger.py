"""The ledger survives the trip through status JSON, its budgets are the counters, and a
status written before it was typed (or kept at all) still loads."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import Action, AnomalyClass
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


def status_with(ledger: PolicyLedger, **fields: object) -> StableTrainingJobStatus:
    return StableTrainingJobStatus.model_validate(
        {
            "counters": {"rollbacks": ledger.rollbacks_used, "restarts": ledger.restarts_used},
            "lastManualRequestId": ledger.last_manual_request_id,
            "policyLedger": ledger.to_status().model_dump(mode="json", by_alias=True),
            **fields,
        }
    )


def test_round_trip_through_status_json_text() -> None:
    ledger = full_ledger()
    text = json.dumps(status_with(ledger).model_dump(mode="json", by_alias=True))
    status = StableTrainingJobStatus.model_validate(json.loads(text))
    assert PolicyLedger.from_job_status(status) == ledger


def test_budgets_used_are_stored_once_in_the_counters() -> None:
    persisted = full_ledger().to_status().model_dump(mode="json", by_alias=True)
    assert not {"rollbacksUsed", "restartsUsed", "lastManualRequestId"} & persisted.keys()
    status = status_with(full_ledger()).model_copy(
        update={"counters": Counters(rollbacks=4, restarts=5), "last_manual_request_id": "r-8"}
    )
    ledger = PolicyLedger.from_job_status(status)
    assert (ledger.rollbacks_used, ledger.restarts_used) == (4, 5)
    assert ledger.last_manual_request_id == "r-8"
    assert ledger.recent_rollbacks == full_ledger().recent_rollbacks


def test_malformed_ledger_names_the_field() -> None:
    data = full_ledger().to_status().model_dump(mode="json", by_alias=True)
    data["recentRollbacks"][0]["onsetStep"] = "soon"
    with pytest.raises(ValueError, match=r"recentRollbacks\.0\.onsetStep"):
        PolicyLedger.from_status(data)
    with pytest.raises(ValueError, match="invalid policy ledger"):
        PolicyLedger.from_status(["not", "a", "ledger"])


def test_the_untyped_map_of_an_earlier_version_still_loads() -> None:
    earlier = {
        "rollbacks_used": 9,
        "restarts_used": 9,
        "last_action_at": "2026-03-01T08:30:00Z",
        "recent_rollbacks": [
            {
                "onset_step": 3007,
                "lr_scale": 0.5,
                "skip": [{"first": 2957, "last": 3257}],
                "escalation_level": 0,
                "anomaly_class": None,
            }
        ],
        "live_actions": [
            {
                "rule": "report-only",
                "signal": "GradNormSpike",
                "onset_step": 9,
                "at": AT.isoformat(),
            }
        ],
        "last_manual_request_id": "r-0",
    }
    status = StableTrainingJobStatus.model_validate(
        {
            "counters": {"rollbacks": 2, "restarts": 1},
            "lastManualRequestId": "r-7",
            "policyLedger": earlier,
        }
    )
    assert PolicyLedger.from_job_status(status) == full_ledger(), "budgets from the counters"


def test_an_empty_or_missing_ledger_is_rebuilt_from_history() -> None:
    """The API server prunes an earlier version's untyped map to {} under the typed CRD."""
    rollback = RollbackRecord(
        time=AT, action=Action.ROLLBACK, signal="LossSpike", onset_step=700, from_step=710,
        to_step=600, lr_scale=0.5, attempt=1,
    )  # fmt: skip
    pruned_or_missing: tuple[dict[str, object] | None, ...] = ({}, None)
    for ledger in pruned_or_missing:
        status = StableTrainingJobStatus.model_validate(
            {
                "counters": {"rollbacks": 1},
                "rollbackHistory": [rollback.model_dump(mode="json", by_alias=True)],
                "policyLedger": ledger,
            }
        )
        rebuilt = PolicyLedger.from_job_status(status)
        assert rebuilt.rollbacks_used == 1
        assert rebuilt.last_action_at == AT
        assert [m.onset_step for m in rebuilt.recent_rollbacks] == [700]


def test_an_unreadable_ledger_is_rebuilt_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A hand edit under an older CRD must not stop the job being reconciled."""
    rollback = RollbackRecord(
        time=AT, action=Action.ROLLBACK, signal="LossSpike", onset_step=700, from_step=710,
        to_step=600, lr_scale=0.5, attempt=1,
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        status = StableTrainingJobStatus.model_validate(
            {
                "counters": {"rollbacks": 1},
                "rollbackHistory": [rollback.model_dump(mode="json", by_alias=True)],
                "policyLedger": {"recentRollbacks": "not a list"},
            }
        )
    assert status.policy_ledger is None
    assert "status.policyLedger.recentRollbacks" in caplog.text
    rebuilt = PolicyLedger.from_job_status(status)
    assert [m.onset_step for m in rebuilt.recent_rollbacks] == [700]
    assert rebuilt.rollbacks_used == 1


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
        ledger = ledger.with_live_action(
            AlertEpisode(rule="r", signal="GradNormSpike", onset_step=onset, at=AT)
        )
    assert len(ledger.live_actions) == RAISED_ALERTS_MAX
    assert not ledger.episode_handled("r", "GradNormSpike", 0)
    assert ledger.episode_handled("r", "GradNormSpike", RAISED_ALERTS_MAX)
