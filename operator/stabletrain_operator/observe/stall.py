"""Stalled: no rank of the job completed a step for the stall bound, or one fell behind
and stopped while the others advance.

The operator decides from the heartbeats the agents serve off their training threads
(stabletrain_agent.heartbeat). Idle time is measured on each agent's own clock (the answer's
`updatedAt` minus its `lastStepAt`) plus the operator's time since that answer, so clock
skew between nodes cannot fake or hide a stall.

What does not count: a process before its `WARMUP_STEPS`-th completed step (restore,
compilation, allocator and DDP bucket warm-up make the first steps of every (re)launch far
slower than the rest; the rendezvous timeout bounds a start that never finishes), any
moment at which a rank is inside a checkpoint save or restore, and a job none of whose
agents answers: at the end of training every agent stops serving before its process and
pod end, and the pods' end decides then. A silent agent while others still answer and
wait is the culprit of their stall.

The bound is `detection.stallSeconds` when set; otherwise it is sized from the job's own
step time: `STALL_STEP_FACTOR` times the slowest recent step of any rank (saves included),
never below `STALL_FLOOR_SECONDS`. For steps up to 48 s that is at most 8 minutes, below
torch's default process-group timeouts (10 minutes for NCCL, 30 minutes for gloo and the
others), so a hang is acted on before torch's watchdog fires, if it fires at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from stabletrain_agent.contract.channel import Heartbeat, ThreadPlace

WARMUP_STEPS = 2
"""Completed steps after which a process is judged: the first two of every launch are not."""
STALL_FLOOR_SECONDS = 120.0
"""The smallest default bound: scrape jitter, a GC pause or a slow eval must not look hung."""
STALL_STEP_FACTOR = 10.0
"""Default bound in units of the slowest recent step."""
MAX_STEP_LAG = 5
"""A rank more than this many steps behind the newest one, idle for the bound while the
others advance, is stalled even though the job progresses: data-parallel ranks move in
lockstep (one collective per step), so even a slow rank is at most a step behind. Both
conditions: answers scraped a moment apart differ by a few steps of a fast run, and an
agent that missed one scrape shows an old step."""


@dataclass(frozen=True)
class RankProgress:
    """The newest heartbeat of one running pod of the current attempt."""

    pod: str
    node: str | None
    beat: Heartbeat
    served_at: datetime
    """The agent's clock when it served this heartbeat (AgentStatus.updatedAt)."""
    answered_at: datetime
    """The operator's clock when the answer arrived."""
    silent: bool = False
    """The agent did not answer the latest scrape (a frozen or vanished process)."""

    def idle_seconds(self, now: datetime) -> float | None:
        """Seconds since this rank last completed a step; None before its first."""
        if self.beat.last_step_at is None:
            return None
        on_agent = (self.served_at - self.beat.last_step_at).total_seconds()
        return max(on_agent, 0.0) + max((now - self.answered_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class StalledRank:
    """A rank the stall is attributed to, and why."""

    rank: int
    pod: str
    node: str | None
    reason: str
    certain: bool
    """False when the rank that stopped first cannot be told from those waiting for it."""


@dataclass(frozen=True)
class StallVerdict:
    bound_seconds: float
    idle_seconds: float
    """Seconds since the newest step any rank completed (or the lagging rank's own)."""
    last_step: int
    """Newest step any rank completed."""
    culprits: tuple[StalledRank, ...]
    evidence: str


def stall_bound(stall_seconds: int | None, progress: Sequence[RankProgress]) -> float | None:
    """The bound in seconds, or None while no step time is known to size the default from."""
    if stall_seconds is not None:
        return float(stall_seconds)
    slowest = [p.beat.slowest_step_seconds for p in progress if p.beat.slowest_step_seconds]
    if not slowest:
        return None
    return max(STALL_FLOOR_SECONDS, STALL_STEP_FACTOR * max(slowest))


def judge_stall(
    progress: Sequence[RankProgress], *, stall_seconds: int | None, now: datetime
) -> StallVerdict | None:
    """The verdict on one attempt's heartbeats, or None while it makes progress."""
    judged = [p for p in progress if p.beat.steps_completed >= WARMUP_STEPS]
    answering = [p for p in judged if not p.silent]
    if not answering or any(p.beat.place is ThreadPlace.CHECKPOINT for p in progress):
        return None
    bound = stall_bound(stall_seconds, judged)
    if bound is None:
        return None
    idle = {p.pod: p.idle_seconds(now) or 0.0 for p in judged}
    newest = max(p.beat.last_step or 0 for p in judged)
    job_idle = min(idle[p.pod] for p in answering)
    behind = [
        p
        for p in judged
        if newest - (p.beat.last_step or 0) > MAX_STEP_LAG and idle[p.pod] >= bound
    ]
    if behind and job_idle < bound:
        culprits = tuple(
            _culprit(p, f"{newest - (p.beat.last_step or 0)} steps behind step {newest}", True)
            for p in behind
        )
        worst = max(idle[p.pod] for p in behind)
        evidence = (
            f"{_names(culprits)} fell more than {MAX_STEP_LAG} steps behind the newest step "
            f"{newest} while the other ranks advance"
        )
        return StallVerdict(bound, worst, newest, culprits, evidence)
    if job_idle < bound:
        return None
    culprits = _who_stopped_first(judged)
    evidence = (
        f"no rank completed a step for {job_idle:.1f} s (bound {bound:g} s) after step "
        f"{newest}; {_names(culprits)}: {culprits[0].reason}"
    )
    return StallVerdict(bound, job_idle, newest, culprits, evidence[:1024])


def _who_stopped_first(judged: Sequence[RankProgress]) -> tuple[StalledRank, ...]:
    """The rank(s) the others wait for, in order of how sure the evidence is."""
    silent = [p for p in judged if p.silent]
    if silent:
        reason = "its agent stopped answering (the process is frozen or gone)"
        return tuple(_culprit(p, reason, True) for p in silent)
    waiting = [p for p in judged if p.beat.place is ThreadPlace.TORCH]
    outside = [p for p in judged if p.beat.place in (ThreadPlace.ELSEWHERE, ThreadPlace.GONE)]
    if outside and (waiting or len(judged) == 1):
        waiters = ", ".join(str(p.beat.rank) for p in waiting) or "none"
        return tuple(
            _culprit(
                p,
                f"stuck outside torch at {p.beat.frame or p.beat.place.value} while rank(s) "
                f"{waiters} wait inside torch",
                True,
            )
            for p in outside
        )
    oldest = min(p.beat.last_step or 0 for p in judged)
    late = [p for p in judged if (p.beat.last_step or 0) == oldest]
    if len(late) < len(judged):
        return tuple(_culprit(p, f"last completed step {oldest} is the oldest", True) for p in late)
    reason = (
        f"every rank waits inside torch after step {oldest}: the one that stopped first "
        "cannot be told apart (a fault between them, such as the network, or a device hang "
        "inside a collective)"
    )
    return tuple(_culprit(p, reason, False) for p in judged)


def _culprit(p: RankProgress, reason: str, certain: bool) -> StalledRank:
    return StalledRank(p.beat.rank, p.pod, p.node, reason, certain)


def _names(culprits: Sequence[StalledRank]) -> str:
    return ", ".join(f"rank {c.rank} (node {c.node})" for c in culprits)
