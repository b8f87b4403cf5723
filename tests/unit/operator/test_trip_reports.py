"""The attempt's trip reports, merged from the pods' termination messages and the scrapes:
one per node whichever channel carried it, and a short wait for the ranks still running."""

from __future__ import annotations

from operator_builders import T0, agent, pod, trip

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.observe.pod_facts import PodState
from stabletrain_operator.policy.trips import (
    TRIP_REPORTS_AWAITED,
    awaiting_reports,
    reported_trips,
)


def scraped(rank: int, report: TripReport) -> AgentStatus:
    """The rank's status endpoint carrying `report` as its latest trip."""
    status = agent(rank, latest_trip=report).status
    assert status is not None
    return status


def test_each_node_counts_once_whichever_channel_carried_its_report() -> None:
    from_pod = trip("node-a", onset=55)
    from_scrape = trip("node-a", onset=50)
    other = trip("node-b", onset=53)
    stale = trip("node-b", onset=10, attempt=1)
    current = [pod(0, state=PodState.FAILED, report=from_pod), pod(1)]
    fresh = [scraped(0, from_scrape), scraped(1, other)]

    trips = reported_trips(current, fresh, attempt=0)

    assert trips == [other, from_pod]
    assert reported_trips(current, [scraped(1, stale)], attempt=1) == [stale]


def test_a_trip_waits_for_the_running_ranks_report_only_within_the_bound() -> None:
    trips = [trip("node-a")]
    current = [pod(0, state=PodState.FAILED), pod(1)]

    assert awaiting_reports(trips, current, T0)
    assert not awaiting_reports(trips, current, T0 + TRIP_REPORTS_AWAITED)
    assert not awaiting_reports([*trips, trip("node-b")], current, T0)
