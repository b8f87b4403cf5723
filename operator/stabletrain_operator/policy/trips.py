"""The trip reports of one attempt, from wherever they arrived.

A pod that trips leaves its report in its termination message and in its status endpoint;
a scrape can carry it before the pod ends, and the termination message can arrive after the
decision. Both channels are merged here, one report per node, earliest onset first, so the
policy sees one trip whichever channel was first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.observe.pod_facts import PodFacts, PodState

TRIP_REPORTS_AWAITED = timedelta(seconds=10)
"""How long a trip waits for the reports of the other ranks still running. All ranks trip at
the same step (one consensus), but each pod reports its own node's checkpoints once it has
flushed them: deciding on the first report and stopping the others at once planned without
the newest checkpoint the others held (the HF e2e test, on a fast machine)."""


def attempt_trips(reports: Iterable[TripReport | None], attempt: int) -> list[TripReport]:
    """The attempt's trip reports, earliest onset first."""
    trips = [t for t in reports if t is not None and t.attempt == attempt]
    return sorted(trips, key=lambda t: (t.onset_step, t.step, t.node))


def pod_trips(pods: Sequence[PodFacts], attempt: int) -> list[TripReport]:
    """The attempt's trip reports the pods' termination messages carry."""
    return attempt_trips((p.trip for p in pods), attempt)


def scraped_trips(fresh: Sequence[AgentStatus], attempt: int) -> list[TripReport]:
    """Trip reports this tick's scrapes carry: a scrape that saw the signal decides before
    the pods' termination messages arrive, and the pods are then stopped, so those
    messages may never be read. The agent's own report of the trip still counts."""
    return attempt_trips((s.latest_trip for s in fresh), attempt)


def reported_trips(
    current: Sequence[PodFacts], fresh: Sequence[AgentStatus], attempt: int
) -> list[TripReport]:
    """The attempt's trip reports from the pods' termination messages and from the scrapes
    (a scrape can carry one before its pod ends), one per node, earliest onset first."""
    by_node: dict[str, TripReport] = {}
    for report in [*pod_trips(current, attempt), *scraped_trips(fresh, attempt)]:
        by_node.setdefault(report.node, report)
    return attempt_trips(by_node.values(), attempt)


def awaiting_reports(
    trips: Sequence[TripReport], current: Sequence[PodFacts], now: datetime
) -> bool:
    """A rank tripped and another still runs without having reported: wait for it, within
    TRIP_REPORTS_AWAITED of the first trip, so the plan sees every node's checkpoints."""
    reported = {t.node for t in trips}
    waiting = [p for p in current if p.state is PodState.RUNNING and p.node not in reported]
    return bool(waiting) and now - min(t.tripped_at for t in trips) < TRIP_REPORTS_AWAITED
