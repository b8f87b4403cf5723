"""The converters from the agent's channels (trip reports, status endpoints) to observations,
shared by the operator and the replay so both see a run the same way."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stabletrain_contract.channel import AgentStatus, FindingReport
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.policy import (
    ObservationSource,
    scrape_observations,
    trip_observation,
)

AT = datetime(2026, 2, 2, tzinfo=UTC)


def report(
    node: str,
    signal: str,
    firing: tuple[str, ...],
    onset: int,
    *,
    suspects: tuple[str, ...] = (),
    omitted: int = 0,
) -> TripReport:
    return TripReport(
        suspect_shards=suspects,
        suspect_shards_omitted=omitted,
        attempt=1,
        node=node,
        step=onset + 3,
        tripped_at=AT,
        signal=signal,
        anomaly_class=AnomalyClass.NUMERICAL,
        evidence=f"{signal} on {node}",
        onset_step=onset,
        firing=firing,
    )


def test_the_first_trip_report_leads_and_the_others_feed_while_firing() -> None:
    observation = trip_observation(
        [
            report("a", "NonFinite", ("NonFinite", "GradNormSpike"), 700),
            report("b", "LossSpike", ("LossSpike", "custom:entropy_low"), 702),
        ]
    )
    assert (observation.signal, observation.onset_step, observation.step) == ("NonFinite", 700, 703)
    assert observation.firing_with == ("GradNormSpike", "LossSpike", "custom:entropy_low")
    assert observation.tripped
    assert observation.sustained
    assert observation.source is ObservationSource.TRIP_REPORT
    assert observation.evidence == "NonFinite on a"
    with pytest.raises(ValueError, match="no trip report"):
        trip_observation([])


def status(rank: int, step: int, *findings: FindingReport) -> AgentStatus:
    return AgentStatus(
        attempt=1,
        node=f"node-{rank}",
        node_rank=rank,
        updated_at=AT,
        step=step,
        lr_scale=1.0,
        applied_generation=1,
        firing=findings,
    )


def finding(signal: str, *, sustained: bool = True, onset: int = 90) -> FindingReport:
    return FindingReport(
        signal=signal,
        anomaly_class=AnomalyClass.DIVERGENCE,
        onset_step=onset,
        consecutive=4,
        sustained=sustained,
        evidence=f"{signal} evidence",
    )


def test_scrapes_give_one_observation_per_signal_rank_zero_first() -> None:
    observations = scrape_observations(
        [
            status(1, 101, finding("GradNormSpike", onset=95), finding("custom:val_loss")),
            status(0, 100, finding("GradNormSpike", onset=90, sustained=False)),
        ]
    )
    assert [(o.signal, o.step, o.onset_step, o.sustained) for o in observations] == [
        ("GradNormSpike", 100, 90, False),
        ("custom:val_loss", 101, 90, True),
    ]
    assert observations[1].firing_with == ("GradNormSpike",)
    assert all(not o.tripped and o.source is ObservationSource.SCRAPE for o in observations)


def test_suspect_shards_are_the_union_of_the_reports_unless_one_was_cut() -> None:
    """A trip's suspect shards reach the policy (before: the observation had none)."""
    both = trip_observation(
        [
            report("a", "LossSpike", (), 129, suspects=("shard-0008", "shard-0007")),
            report("b", "LossSpike", (), 129, suspects=("shard-0008", "shard-0009")),
        ]
    )
    assert both.suspect_shards == ("shard-0008", "shard-0007", "shard-0009")
    cut = trip_observation(
        [
            report("a", "LossSpike", (), 129, suspects=("shard-0008",)),
            report("b", "LossSpike", (), 129, suspects=("shard-0008",), omitted=3),
        ]
    )
    assert cut.suspect_shards == (), "an incomplete list falls back to the whole window"
