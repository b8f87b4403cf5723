"""How often each job's agents are scraped: one operator-wide budget shared by its jobs.

A scrape costs the operator on the order of a millisecond of its one event loop (HTTP, JSON,
the contract's validation, the tick that follows), so every pod once a second stops scaling
at a few hundred pods (bench/operator_scale.py). Healthy jobs therefore share a budget of
`--scrape-rate` scrapes a second: with P pods scraped in all, a healthy job's round comes
every max(1 s, P / rate). A job that needs a close eye stays at the fast interval: while
it confirms a rollback, while an agent reports a signal firing, and after an agent did not
answer. Trips and crashes do not wait for a scrape: the pod watch delivers them.

What a slower round costs: the inventory a crash (no trip report) is planned from is up to
one round old, so a checkpoint that landed in the last round may be passed over for the one
before it; the stall bound (at least 120 s) is far above any round.
"""

from __future__ import annotations

FAST_INTERVAL_SECONDS = 1.0
"""The round of a job that needs a close eye, and of every job while the budget allows.
Also for healthy jobs: a pod that dies without a word (SIGKILL, a lost node) cannot be asked
afterwards which checkpoints it completed. Scraped every 5 s, a rank killed within 5 s of a
checkpoint landing made the restart take the one before (tests/e2e, killed rank)."""
DEFAULT_SCRAPE_RATE = 200.0
"""Scrapes a second for all healthy jobs together: every job at the fast interval up to 200
pods, 20 s rounds at 1,000 jobs of 4 pods (docs/operations.md, "Operator sizing")."""


class ScrapePacer:
    """The operator's scrape budget; each job's daemon asks it for its next interval."""

    def __init__(self, rate: float = DEFAULT_SCRAPE_RATE) -> None:
        if rate <= 0:
            raise ValueError(f"the scrape rate must be positive, got {rate}")
        self._rate = rate
        self._pods: dict[tuple[str, str], int] = {}
        self._total = 0

    def interval(self, job: tuple[str, str], pods: int, *, close_eye: bool) -> float:
        """Seconds until `job`'s next round, given the `pods` its round just scraped."""
        self._total += pods - self._pods.get(job, 0)
        self._pods[job] = pods
        if close_eye:
            return FAST_INTERVAL_SECONDS
        return max(FAST_INTERVAL_SECONDS, self._total / self._rate)

    def forget(self, job: tuple[str, str]) -> None:
        """The job is gone (or no longer scraped): its pods leave the total."""
        self._total -= self._pods.pop(job, 0)
