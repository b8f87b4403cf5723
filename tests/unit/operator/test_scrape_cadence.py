"""When a job's pods are scraped again: often while anything is going on, rarely when healthy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from stabletrain_agent.contract.channel import AgentStatus
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.observe.cadence import BUSY_SECONDS, HEALTHY_SECONDS, scrape_interval
from stabletrain_operator.observe.scrape import ScrapeError, ScrapeResult

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _answer(pod: str = "j-a0-0", **fields: Any) -> ScrapeResult:
    heartbeat = {"rank": 0, "started_at": NOW.isoformat(), "steps_completed": 10,
                 "last_step": 10, "last_step_at": NOW.isoformat()}  # fmt: skip
    agent = {"attempt": 0, "node": "n", "node_rank": 0, "updated_at": NOW.isoformat(),
             "lr_scale": 1.0, "applied_generation": 1, "heartbeat": heartbeat}  # fmt: skip
    agent.update(fields)
    return ScrapeResult(pod, AgentStatus.model_validate(agent))


def _interval(phase: Phase = Phase.RUNNING, *results: ScrapeResult, **kw: Any) -> float:
    return scrape_interval(
        phase,
        save_requested=kw.get("save_requested", False),
        stall_seconds=kw.get("stall_seconds"),
        previous=results,
    )


def test_a_healthy_running_job_is_scraped_rarely() -> None:
    assert _interval(Phase.RUNNING, _answer(), _answer("j-a0-1")) == HEALTHY_SECONDS


def test_the_stall_bound_keeps_four_scrapes_inside_it_but_never_below_busy() -> None:
    assert _interval(Phase.RUNNING, _answer(), stall_seconds=8) == 2.0
    assert _interval(Phase.RUNNING, _answer(), stall_seconds=2) == BUSY_SECONDS


def test_anything_going_on_is_scraped_every_second() -> None:
    busy = [
        _interval(Phase.CONFIRMING, _answer()),
        _interval(Phase.RUNNING),  # nothing heard yet
        _interval(Phase.RUNNING, _answer(), save_requested=True),
        _interval(Phase.RUNNING, _answer(pfs_available=False)),
        _interval(Phase.RUNNING, _answer(heartbeat=None)),
        _interval(Phase.RUNNING, _answer(), ScrapeResult("j-a0-1", None, ScrapeError.TIMEOUT)),
    ]
    assert busy == [BUSY_SECONDS] * len(busy)
