"""The operator's scrape budget: every job at the fast interval while it allows, healthy
jobs slowed evenly beyond it, and a job that needs a close eye never slowed."""

from __future__ import annotations

import pytest

from stabletrain_operator.observe.pacing import FAST_INTERVAL_SECONDS, ScrapePacer


def test_every_job_is_scraped_every_second_while_the_budget_allows() -> None:
    pacer = ScrapePacer(rate=200)
    intervals = [pacer.interval(("ns", f"job-{i}"), 4, close_eye=False) for i in range(50)]
    assert set(intervals) == {FAST_INTERVAL_SECONDS}


def test_a_thousand_healthy_jobs_share_the_budget_evenly() -> None:
    pacer = ScrapePacer(rate=200)
    for i in range(1000):
        pacer.interval(("ns", f"job-{i}"), 4, close_eye=False)
    assert pacer.interval(("ns", "job-0"), 4, close_eye=False) == pytest.approx(4000 / 200)
    assert pacer.interval(("ns", "job-1"), 4, close_eye=True) == FAST_INTERVAL_SECONDS


def test_a_job_counts_its_pods_once_however_often_it_asks() -> None:
    pacer = ScrapePacer(rate=10)
    for _ in range(5):
        assert pacer.interval(("ns", "a"), 20, close_eye=False) == pytest.approx(2.0)
    assert pacer.interval(("ns", "a"), 40, close_eye=False) == pytest.approx(4.0)


def test_a_job_that_stops_being_scraped_leaves_the_budget() -> None:
    pacer = ScrapePacer(rate=10)
    pacer.interval(("ns", "big"), 30, close_eye=False)
    assert pacer.interval(("ns", "small"), 10, close_eye=False) == pytest.approx(4.0)
    pacer.forget(("ns", "big"))
    pacer.forget(("ns", "never-seen"))
    assert pacer.interval(("ns", "small"), 10, close_eye=False) == FAST_INTERVAL_SECONDS


@pytest.mark.parametrize("rate", [0.0, -5.0])
def test_a_rate_that_is_not_positive_is_refused_with_the_value(rate: float) -> None:
    with pytest.raises(ValueError, match=str(rate)):
        ScrapePacer(rate=rate)
