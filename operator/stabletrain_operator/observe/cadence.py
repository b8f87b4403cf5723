"""How often one job's pods are scraped: often while something is happening, rarely while
the run is healthy.

Trips and crashes do not wait for a scrape: the pod ends and its watch event wakes the next
tick. Scrapes carry what only the agents know (progress, heartbeats, inventory, findings),
and most of it matters only when something is going on. A job is scraped every
`BUSY_SECONDS` until its agents have reported once, while it is not simply Running
(Confirming a recovery, saving for a suspend), and while any pod reports a firing finding, a
trip, an unavailable PFS or no heartbeat, or did not answer. Otherwise every
`HEALTHY_SECONDS`, and at least four times per `detection.stallSeconds`, so a stall is still
judged within a quarter of its bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.observe.scrape import ScrapeResult

BUSY_SECONDS = 1.0
HEALTHY_SECONDS = 5.0
STALL_SCRAPES = 4
"""Scrapes per stall bound at least."""


def _healthy(result: ScrapeResult) -> bool:
    agent = result.status
    return (
        agent is not None
        and agent.heartbeat is not None
        and not agent.firing
        and agent.latest_trip is None
        and agent.pfs_available is not False
    )


def scrape_interval(
    phase: Phase,
    *,
    save_requested: bool,
    stall_seconds: float | None,
    previous: Sequence[ScrapeResult],
) -> float:
    """Seconds from one scrape round of the job to the next."""
    if phase is not Phase.RUNNING or save_requested or not previous:
        return BUSY_SECONDS
    if not all(_healthy(result) for result in previous):
        return BUSY_SECONDS
    interval = HEALTHY_SECONDS
    if stall_seconds is not None:
        interval = min(interval, stall_seconds / STALL_SCRAPES)
    return max(BUSY_SECONDS, interval)
