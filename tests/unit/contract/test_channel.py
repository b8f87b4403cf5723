"""Live directives: authenticated, fenced by attempt, idempotent by generation; status parses."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    OUTCOME_STATUS,
    AgentStatus,
    DirectiveAck,
    FindingReport,
    LiveOutcome,
    bearer,
    judge_live_directive,
    new_token,
    parse_agent_status,
    parse_directive_ack,
    token_matches,
)
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, NodeCopy, TierCopy
from stabletrain_contract.directives import Directives
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.trip_report import TripReport

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def test_token_check_accepts_only_the_exact_bearer_token() -> None:
    token = new_token()
    assert len(token) >= 43
    assert token != new_token()
    assert token_matches(bearer(token), token)
    assert not token_matches(token, token)
    assert not token_matches(bearer(token + "x"), token)
    assert not token_matches(bearer(token[:-1]), token)
    assert not token_matches(None, token)
    assert not token_matches(bearer(""), "")
    assert not token_matches("Basic " + token, token)


def current() -> Directives:
    return Directives(generation=5, attempt=2, resume_step=1000, lr_scale=0.5)


@pytest.mark.parametrize(
    ("changes", "outcome"),
    [
        ({"generation": 6, "lr_scale": 0.25}, LiveOutcome.APPLIED),
        ({"generation": 5, "lr_scale": 0.25}, LiveOutcome.ALREADY_APPLIED),
        ({"generation": 4}, LiveOutcome.ALREADY_APPLIED),
        ({"generation": 9, "attempt": 3}, LiveOutcome.WRONG_ATTEMPT),
        ({"generation": 9, "attempt": 1}, LiveOutcome.WRONG_ATTEMPT),
        ({"generation": 6, "resume_step": 900}, LiveOutcome.RESUME_STEP_CHANGED),
    ],
)
def test_live_directive_outcomes(changes: dict[str, object], outcome: LiveOutcome) -> None:
    incoming = current().model_copy(update=changes)
    assert judge_live_directive(current(), incoming) is outcome


def test_every_outcome_has_an_http_status() -> None:
    assert set(OUTCOME_STATUS) == set(LiveOutcome)
    assert OUTCOME_STATUS[LiveOutcome.ALREADY_APPLIED] == 200
    assert OUTCOME_STATUS[LiveOutcome.WRONG_ATTEMPT] == 409


def test_ack_round_trip() -> None:
    ack = DirectiveAck(outcome=LiveOutcome.APPLIED, applied_generation=6)
    assert parse_directive_ack(ack.model_dump_json()) == ack
    assert json.loads(ack.model_dump_json())["appliedGeneration"] == 6


def test_status_round_trip_with_nan_loss_and_trip() -> None:
    status = AgentStatus(
        attempt=2,
        node="node-a",
        node_rank=0,
        updated_at=NOW,
        step=31_222,
        loss=float("nan"),
        loss_baseline=2.2,
        grad_norm=0.4,
        grad_norm_baseline=0.3,
        lr_scale=0.5,
        tokens_per_second=12_345.0,
        applied_generation=6,
        firing=(
            FindingReport(
                signal="NonFinite",
                anomaly_class=AnomalyClass.NUMERICAL,
                onset_step=31_220,
                consecutive=3,
                sustained=True,
            ),
        ),
        inventory=(
            CheckpointRecord(
                step=31_000,
                attempt=2,
                stable=True,
                saved_at=NOW,
                pfs=TierCopy(complete=True, verified=True),
                local=(NodeCopy(node="node-a", complete=True, verified=False),),
            ),
        ),
        latest_trip=TripReport(
            attempt=2,
            node="node-a",
            step=31_222,
            tripped_at=NOW,
            signal="NonFinite",
            anomaly_class=AnomalyClass.NUMERICAL,
            onset_step=31_220,
        ),
    )
    wire = status.model_dump_json()
    assert json.loads(wire)["loss"] == "NaN"
    parsed = parse_agent_status(wire)
    assert parsed.model_dump_json() == wire
    assert parsed.inventory == status.inventory


def test_status_with_a_wrong_field_names_it() -> None:
    with pytest.raises(ContractError) as caught:
        parse_agent_status(
            json.dumps(
                {
                    "attempt": 0,
                    "node": "n",
                    "nodeRank": 0,
                    "updatedAt": NOW.isoformat(),
                    "lrScale": 1.0,
                    "appliedGeneration": "seven",
                }
            )
        )
    assert "  appliedGeneration:" in str(caught.value)
