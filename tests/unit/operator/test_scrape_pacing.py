"""The operator's scrape budget: every job at the fast interval while it allows, healthy
jobs slowed evenly beyond it, a job that needs a close eye never slowed, and the budget
giving way while the event loop lags."""

from __future__ import annotations

import asyncio
import time

import pytest

from stabletrain_operator.observe import pacing
from stabletrain_operator.observe.pacing import (
    ADJUST_SECONDS,
    FAST_INTERVAL_SECONDS,
    FLOOR_SHARE,
    LAG_LIMIT_SECONDS,
    RECOVERY_SHARE,
    SLOWDOWN,
    ScrapePacer,
)


def test_every_job_is_scraped_every_second_while_the_budget_allows() -> None:
    pacer = ScrapePacer(rate=200)
    for i in range(50):
        pacer.enrol(("ns", f"job-{i}"), 4)
    assert pacer.interval(close_eye=False) == FAST_INTERVAL_SECONDS


def test_a_thousand_healthy_jobs_share_the_budget_evenly() -> None:
    pacer = ScrapePacer(rate=200)
    for i in range(1000):
        pacer.enrol(("ns", f"job-{i}"), 4)
    assert pacer.interval(close_eye=False) == pytest.approx(4000 / 200)
    assert pacer.interval(close_eye=True) == FAST_INTERVAL_SECONDS


def test_a_job_counts_its_pods_once_however_often_it_enrols() -> None:
    pacer = ScrapePacer(rate=10)
    for _ in range(5):
        pacer.enrol(("ns", "a"), 20)
        assert pacer.interval(close_eye=False) == pytest.approx(2.0)
    pacer.enrol(("ns", "a"), 40)
    assert pacer.interval(close_eye=False) == pytest.approx(4.0)


def test_a_job_that_stops_being_scraped_leaves_the_budget() -> None:
    pacer = ScrapePacer(rate=10)
    pacer.enrol(("ns", "big"), 30)
    pacer.enrol(("ns", "small"), 10)
    assert pacer.interval(close_eye=False) == pytest.approx(4.0)
    pacer.forget(("ns", "big"))
    pacer.forget(("ns", "never-seen"))
    assert pacer.interval(close_eye=False) == FAST_INTERVAL_SECONDS


@pytest.mark.parametrize("rate", [0.0, -5.0])
def test_a_rate_that_is_not_positive_is_refused_with_the_value(rate: float) -> None:
    with pytest.raises(ValueError, match=str(rate)):
        ScrapePacer(rate=rate)


def opened(rate: float) -> ScrapePacer:
    """A pacer whose first adjustment period began at time 0."""
    pacer = ScrapePacer(rate=rate)
    pacer.observe_lag(0.0, 0.0)
    return pacer


SAMPLE_SECONDS = 0.25
"""Exact in binary, so a period closes on the sample that ends it."""


def feed(pacer: ScrapePacer, lag: float, periods: int, start: float = 0.0) -> float:
    """Every sample of `periods` adjustment periods from `start` at `lag`; the time after."""
    per_period = round(ADJUST_SECONDS / SAMPLE_SECONDS)
    for k in range(1, per_period * periods + 1):
        pacer.observe_lag(lag, start + k * SAMPLE_SECONDS)
    return start + per_period * periods * SAMPLE_SECONDS


def test_a_lagging_loop_lowers_the_rate_and_every_healthy_round_spreads_out_at_once() -> None:
    pacer = opened(200)
    for i in range(1000):
        pacer.enrol(("ns", f"job-{i}"), 4)
    feed(pacer, LAG_LIMIT_SECONDS * 4, periods=2)
    assert pacer.rate == pytest.approx(200 * SLOWDOWN**2)
    assert pacer.interval(close_eye=False) == pytest.approx(4000 / (200 * SLOWDOWN**2))
    assert pacer.interval(close_eye=True) == FAST_INTERVAL_SECONDS


def test_the_rate_never_falls_below_its_floor() -> None:
    pacer = opened(200)
    feed(pacer, 5.0, periods=40)
    assert pacer.rate == pytest.approx(200 * FLOOR_SHARE)


def test_a_loop_that_keeps_up_again_wins_the_rate_back_step_by_step_up_to_the_ceiling() -> None:
    pacer = opened(200)
    now = feed(pacer, 1.0, periods=40)
    now = feed(pacer, LAG_LIMIT_SECONDS / 2, periods=1, start=now)
    assert pacer.rate == pytest.approx(200 * FLOOR_SHARE + 200 * RECOVERY_SHARE)
    feed(pacer, 0.0, periods=100, start=now)
    assert pacer.rate == 200


def test_one_late_timer_in_a_period_of_prompt_ones_does_not_lower_the_rate() -> None:
    pacer = opened(200)
    pacer.observe_lag(0.3, SAMPLE_SECONDS)  # a garbage collection, say
    feed(pacer, 0.001, periods=1, start=SAMPLE_SECONDS)
    assert pacer.rate == 200


def test_the_probe_measures_the_running_loop_when_something_blocks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pacing, "ADJUST_SECONDS", 0.5)

    async def blocked_loop() -> float:
        pacer = ScrapePacer(rate=200)
        probe = asyncio.create_task(pacer.follow_loop())
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            await asyncio.sleep(0)
            time.sleep(0.2)  # the loop does 0.2 s of work between two yields
        probe.cancel()
        return pacer.rate

    assert asyncio.run(blocked_loop()) < 200
