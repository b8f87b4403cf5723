"""Stalled: no rank of the job completed a step for the stall bound, one fell behind and
stopped while the others advance, or a (re)launched process did not get through its first
steps within the start-up bound.

The operator decides from the heartbeats the agents serve off their training threads
(stabletrain_agent.endpoint.heartbeat). Idle time is measured on each agent's own clock (the
answer's `updatedAt` minus its `lastStepAt`) plus the operator's time since that answer, so clock
skew between nodes cannot fake or hide a stall.

Running ranks. The bound is `detection.stallSeconds` when set; otherwise it is sized from
the job's own step time: `STALL_STEP_FACTOR` times the slowest recent step of any rank
(saves included), never below `STALL_FLOOR_SECONDS`. For steps up to 48 s that is at most
8 minutes, below torch's default process-group timeouts (10 minutes for NCCL, 30 minutes
for gloo and the others), so a hang is acted on before torch's watchdog fires, if it fires
at all.

Starting ranks. A process before its `WARMUP_STEPS`-th completed step is not held to that
bound: compilation, the allocator and DDP's bucket warm-up make the first steps of every
(re)launch far slower than the rest. It is held to the start-up bound instead, counted from
the heartbeat's `trainingSince` (when its checkpoint restore finished, or its agent started
with nothing to restore), so restore time never counts: `WARMUP_STEPS` times
`detection.stallSeconds` when set (each warm-up step gets the user's bound), never below
`STARTUP_MIN_SECONDS`, else `STARTUP_FLOOR_SECONDS`. The default is fixed, not sized from
step time, because a launch's own processes have no step time yet and the operator does not
carry the previous attempt's across the relaunch. A rank hung in its first collective (a
bad GPU or NIC) or a deadlocked loader is so caught even where torch's process-group
timeout never fires. An agent older than `trainingSince` leaves starting processes
unjudged, as before (the rendezvous timeout bounds only the rendezvous).

What never counts: any moment at which a rank is inside a checkpoint save or restore (a
save among the first steps still counts toward the start-up bound once it is over), a
process whose training thread has ended, and a job none of whose agents answers: at the
end of training every agent stops serving before its process and pod end, and the pods'
end decides then. A silent agent while others still answer and wait is the culprit of
their stall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from stabletrain_contract.channel import Heartbeat, ThreadPlace

WARMUP_STEPS = 2
"""Completed steps after which a process is held to the stall bound; before, to the
start-up bound."""
STARTUP_MIN_SECONDS = 30.0
"""The least start-up bound, whatever `detection.stallSeconds` says: a bound sized for steady
steps (the e2e tests use 5 s) would trip on the first steps of a small model on a loaded
machine (tests/e2e/test_hangs.py saw the tiny GPT's steps take up to 3.1 s at load 15, plus
its slow rank's 1.5 s sleep), warm-up that is no hang."""
STARTUP_FLOOR_SECONDS = 600.0
"""The start-up bound without `detection.stallSeconds`: nothing is known of the job's step
time then, and a first launch may compile for minutes. Equal to NCCL's default
process-group timeout, a third of gloo's, and the only bound on a start-up hang outside a
collective (a deadlocked data loader), which no torch timeout ends."""
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

    def starting_seconds(self, now: datetime) -> float | None:
        """Seconds since this process began training (its restore finished); None from an
        agent that does not report it."""
        since = self.beat.training_since
        if since is None:
            return None
        on_agent = (self.served_at - since).total_seconds()
        return max(on_agent, 0.0) + max((now - self.answered_at).total_seconds(), 0.0)

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
    last_step: int | None
    """Newest step any rank completed; None when no rank completed one since its launch."""
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


def startup_bound(stall_seconds: int | None) -> float:
    """Seconds a process may take from its restore to its `WARMUP_STEPS`-th step."""
    if stall_seconds is not None:
        return max(float(WARMUP_STEPS * stall_seconds), STARTUP_MIN_SECONDS)
    return STARTUP_FLOOR_SECONDS


def judge_stall(
    progress: Sequence[RankProgress], *, stall_seconds: int | None, now: datetime
) -> StallVerdict | None:
    """The verdict on one attempt's heartbeats, or None while it makes progress."""
    if any(p.beat.place is ThreadPlace.CHECKPOINT for p in progress):
        return None
    judged = [p for p in progress if p.beat.steps_completed >= WARMUP_STEPS]
    if not any(not p.silent for p in judged):
        starting = [p for p in progress if p.beat.steps_completed < WARMUP_STEPS]
        return _judge_start_up(starting, stall_seconds=stall_seconds, now=now)
    return _judge_running(judged, stall_seconds=stall_seconds, now=now)


def _judge_start_up(
    starting: Sequence[RankProgress], *, stall_seconds: int | None, now: datetime
) -> StallVerdict | None:
    """Processes none of which is past its warm-up steps: stalled once every answering one
    has been training (restored) for the start-up bound without getting there."""
    timed = [
        p
        for p in starting
        if p.beat.training_since is not None and p.beat.place is not ThreadPlace.GONE
    ]
    since = {p.pod: p.starting_seconds(now) or 0.0 for p in timed}
    answering = [since[p.pod] for p in timed if not p.silent]
    if not answering:
        return None
    bound = startup_bound(stall_seconds)
    youngest = min(answering)
    if youngest < bound:
        return None
    culprits = _who_stopped_first(timed)
    steps = [p.beat.last_step for p in timed if p.beat.last_step is not None]
    where = "; ".join(
        f"rank {p.beat.rank} (node {p.node}) {'silent' if p.silent else p.beat.place.value}"
        f"{' at ' + p.beat.frame if p.beat.frame else ''}, {since[p.pod]:.0f} s since its "
        f"restore, {p.beat.steps_completed} step(s) completed"
        for p in timed
    )
    evidence = (
        f"no rank completed its first {WARMUP_STEPS} steps within {bound:g} s of its restore "
        f"(the start-up bound); {_names(culprits)}: {culprits[0].reason}. {where}"
    )
    return StallVerdict(bound, youngest, max(steps, default=None), culprits, evidence[:1024])


def _judge_running(
    judged: Sequence[RankProgress], *, stall_seconds: int | None, now: datetime
) -> StallVerdict | None:
    """Processes past their warm-up steps, at least one answering: held to the stall bound."""
    answering = [p for p in judged if not p.silent]
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
        behind = (
            f"last completed step {oldest} is the oldest"
            if oldest
            else ("completed no step since its launch while the others did")
        )
        return tuple(_culprit(p, behind, True) for p in late)
    after = f"after step {oldest}" if oldest else "before a first step since the launch"
    reason = (
        f"every rank waits inside torch {after}: the one that stopped first "
        "cannot be told apart (a fault between them, such as the network, or a device hang "
        "inside a collective)"
    )
    return tuple(_culprit(p, reason, False) for p in judged)


def _culprit(p: RankProgress, reason: str, certain: bool) -> StalledRank:
    return StalledRank(p.beat.rank, p.pod, p.node, reason, certain)


def _names(culprits: Sequence[StalledRank]) -> str:
    return ", ".join(f"rank {c.rank} (node {c.node})" for c in culprits)
