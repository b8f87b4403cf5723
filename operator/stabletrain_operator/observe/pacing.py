"""How often each job's agents are scraped: one operator-wide budget shared by its jobs,
which gives way to the event loop's own work.

A scrape costs the operator about 2 ms of its one event loop (HTTP, JSON, the contract's
validation, the tick that follows), so every pod once a second stops scaling at a few
hundred pods (bench/operator_scale.py). Healthy jobs therefore share a budget of scrapes a
second: with P pods scraped in all, a healthy job's round comes every max(1 s, P / rate).
A job that needs a close eye stays at the fast interval: while it confirms a rollback,
while an agent reports a signal firing, and after an agent did not answer.

`--scrape-rate` is the budget's ceiling, not a promise. A fixed 200 a second at 1,000 jobs
kept the loop so busy that a trip's watch event waited 42 s (p50) for its tick: trips and
crashes arrive through the pod watch, and a watch event is only as fast as the loop that
handles it. So the pacer measures the loop's lag (how late a short timer fires) and lowers
the rate while the lag is above LAG_LIMIT_SECONDS, raising it again while the loop keeps
up: the scrapes take what the loop has spare, and the events that decide never queue
behind them. (At 1,000 jobs on 2 cores the rate settled at 75-86 a second with the lag at
11 ms, and a trip reached Stopping in 0.37 s at the median.)

What a slower round costs: the inventory a crash (no trip report) is planned from is up to
one round old, so a checkpoint that landed in the last round may be passed over for the one
before it; a hang is judged at the first round after `stallSeconds`.
"""

from __future__ import annotations

import asyncio
import time

from stabletrain_operator import metrics

FAST_INTERVAL_SECONDS = 1.0
"""The round of a job that needs a close eye, and of every job while the budget allows.
Also for healthy jobs: a pod that dies without a word (SIGKILL, a lost node) cannot be asked
afterwards which checkpoints it completed. Scraped every 5 s, a rank killed within 5 s of a
checkpoint landing made the restart take the one before (tests/e2e, killed rank)."""
DEFAULT_SCRAPE_RATE = 200.0
"""The ceiling of scrapes a second for all healthy jobs together: every job at the fast
interval up to 200 pods (docs/operations.md, "Operator sizing")."""
LAG_LIMIT_SECONDS = 0.05
"""Mean lag of the probe's timer over one adjustment period above which healthy scrapes
give way. A trip's tick awaits some ten times (index, status write, Event), so at this lag
it is done well within a second."""
PROBE_SECONDS = 0.1
"""How often the loop's lag is sampled."""
ADJUST_SECONDS = 2.0
"""How often the rate is changed, from the lag sampled since the last change."""
SLOWDOWN = 0.7
"""The rate is multiplied by this after a period with the loop lagging."""
RECOVERY_SHARE = 0.05
"""After a period with the loop keeping up, the rate grows by this share of the ceiling:
from the floor back to the ceiling in some 40 s, so a burst of work does not swing it."""
FLOOR_SHARE = 0.05
"""The rate never falls below this share of the ceiling: a loop busy with something else
(a thousand jobs starting at once) still sees every healthy job now and then."""


class ScrapePacer:
    """The operator's scrape budget; each job's daemon asks it for its next interval, and the
    loop probe (`follow_loop`) feeds it the loop's lag."""

    def __init__(self, rate: float = DEFAULT_SCRAPE_RATE) -> None:
        if rate <= 0:
            raise ValueError(f"the scrape rate must be positive, got {rate}")
        self._ceiling = rate
        self._rate = rate
        self._pods: dict[tuple[str, str], int] = {}
        self._total = 0
        self._lags: list[float] = []
        self._period_began: float | None = None

    @property
    def rate(self) -> float:
        """Scrapes a second healthy jobs get now (the ceiling while the loop keeps up)."""
        return self._rate

    def enrol(self, job: tuple[str, str], pods: int) -> None:
        """`job`'s round just scraped `pods`: the total the healthy rounds share."""
        self._total += pods - self._pods.get(job, 0)
        self._pods[job] = pods

    def forget(self, job: tuple[str, str]) -> None:
        """The job is gone (or no longer scraped): its pods leave the total."""
        self._total -= self._pods.pop(job, 0)

    def interval(self, *, close_eye: bool) -> float:
        """Seconds between two rounds of a job, at the rate of now: asked again whenever a
        round may be due, so a lower rate spaces every healthy job's rounds at once."""
        if close_eye:
            return FAST_INTERVAL_SECONDS
        return max(FAST_INTERVAL_SECONDS, self._total / self._rate)

    def observe_lag(self, lag: float, now: float) -> None:
        """One sample of how late a timer fired at monotonic `now`; every ADJUST_SECONDS the
        rate goes down (lagging) or up (keeping up) from the mean of the period's samples."""
        self._lags.append(lag)
        if self._period_began is None:
            self._period_began = now
        if now - self._period_began < ADJUST_SECONDS:
            return
        mean = sum(self._lags) / len(self._lags)
        self._lags.clear()
        self._period_began = now
        if mean > LAG_LIMIT_SECONDS:
            self._rate = max(self._ceiling * FLOOR_SHARE, self._rate * SLOWDOWN)
        else:
            self._rate = min(self._ceiling, self._rate + self._ceiling * RECOVERY_SHARE)
        metrics.LOOP_LAG.set(mean)
        metrics.SCRAPE_RATE.set(self._rate)

    async def follow_loop(self) -> None:
        """Samples the running loop's lag until cancelled (started with the operator)."""
        while True:
            asked = time.monotonic()
            await asyncio.sleep(PROBE_SECONDS)
            now = time.monotonic()
            self.observe_lag(max(0.0, now - asked - PROBE_SECONDS), now)
