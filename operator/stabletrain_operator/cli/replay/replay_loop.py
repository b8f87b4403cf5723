"""The replay loop: every recorded row through `SignalMonitor`, every finding through `decide`.

Nothing here re-implements detection or policy; it only models what the live system does
around them:

* A trip becomes the trip report the agent's own `build_trip_report` writes, and other
  findings the status endpoint's findings; both become observations through the same
  converters the operator uses (`trip_observation`, `finding_observation`).
* A recording of a run that was not healed keeps going where a live run would have
  stopped. After a Rollback or RestartFromLatest at step S the live run would have been
  relaunched from a checkpoint before S; what the recording shows of anomalies that
  began at or before S belongs to the run that was stopped. Findings with an onset at or
  before S are therefore not decided on again (whatever their signal); the monitor keeps
  observing, and the ledger (budgets, cooldown, escalation) and the LR scale carry on, so
  a later spike near the same step escalates as it would live.
* A recording of a run that was healed shows its relaunches (the step goes back, or the
  `attempt` column grows). The live agent then restores its monitor from the checkpoint
  it resumes from; the replay rebuilds the monitor the same way, by observing again the
  rows of the surviving timeline before the relaunch, and starts counting steps since
  start from 0, as a fresh process does.
* After a Fail the job is over, and the replay stops there.
* Time: the policy's cooldowns need a clock. A `time` column is used when present;
  otherwise `step_seconds` per step within an attempt, and one step's worth per relaunch.
* Stalls: with a `time` column, the gap before each row is what the operator's stall rule
  (observe/stall.py, the same function) would have seen of a single rank's heartbeat: no
  step for that long after the previous row. A gap over the bound decides Stalled at the
  previous row's step, at the moment the live operator would have (previous time + bound).
  That includes the gap before a relaunch the recording shows without a decision: the
  metrics cannot tell a hang from a crash that stopped the run sooner (the default policy
  restarts both alike). The gap after a stopping decision is the relaunch, never a stall.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from stabletrain_contract.channel import Heartbeat, ThreadPlace
from stabletrain_contract.signals.monitor import Finding, SignalMonitor, StepObservation, Verdict
from stabletrain_contract.signals.trip_report_builder import build_trip_report
from stabletrain_operator.cli.replay.history import MetricsHistory, MetricsRow
from stabletrain_operator.cli.replay.policy_file import ReplayPolicy
from stabletrain_operator.observe.stall import RankProgress, judge_stall
from stabletrain_operator.plan.sent_directives import trip_rules
from stabletrain_operator.policy import (
    Decision,
    Observation,
    PolicyLedger,
    decide,
    finding_observation,
    record,
    stalled,
    trip_observation,
    trip_signals,
)
from stabletrain_operator.policy.action_registry import kind_of

REPLAY_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
"""Time zero of a replay; only differences matter (cooldowns)."""
REPLAY_NODE = "replay"
"""Node name in the trip reports replay builds (the report requires one)."""
PROGRESS_EVERY = 20_000
"""Rows between progress reports: about a second of work, so long replays show life."""
RECENT_GAPS = 32
"""Step gaps the stall bound is sized from, as the agent's heartbeat keeps them."""


@dataclass(frozen=True)
class ReplayedDecision:
    step: int
    """Row (logged step) at which the decision was taken."""
    decision: Decision


@dataclass(frozen=True)
class ReplayPoint:
    """What the plot draws for one row."""

    step: int
    loss: float
    baseline: float | None
    attempt: int
    """Relaunches seen before this row: each attempt is drawn as its own line."""


@dataclass(frozen=True)
class ReplayResult:
    decisions: tuple[ReplayedDecision, ...]
    points: tuple[ReplayPoint, ...]
    unused_columns: tuple[str, ...]
    """Custom columns no detection.custom signal reads."""
    failed_at: int | None
    """Step of a Fail decision, after which nothing was replayed."""
    lr_scale: float
    """LR scale after the last decision."""


def replay(
    history: MetricsHistory,
    policy: ReplayPolicy,
    *,
    step_seconds: float = 1.0,
    on_decision: Callable[[ReplayedDecision], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Run `history` through the agent's monitor and the operator's policy engine.

    `on_decision` sees each decision as it is taken; `on_progress(done, total)` is called
    every PROGRESS_EVERY rows.
    """
    run = _Run(policy, step_seconds)
    decisions: list[ReplayedDecision] = []
    failed_at = None
    total = len(history.rows)
    for index, row in enumerate(history.rows):
        if on_progress is not None and index and index % PROGRESS_EVERY == 0:
            on_progress(index, total)
        for replayed in run.step(row):
            decisions.append(replayed)
            if on_decision is not None:
                on_decision(replayed)
            if kind_of(replayed.decision.action).ends_the_job:
                failed_at = replayed.step
                break
        if failed_at is not None:
            break
    read = {signal.metric_key for signal in policy.detection.custom}
    return ReplayResult(
        decisions=tuple(decisions),
        points=tuple(run.points),
        unused_columns=tuple(c for c in history.custom_columns if c not in read),
        failed_at=failed_at,
        lr_scale=run.lr_scale,
    )


class _Run:
    """The live system around the shared code: the agent's monitor of the current attempt,
    the operator's ledger and LR scale, and a clock."""

    def __init__(self, policy: ReplayPolicy, step_seconds: float) -> None:
        self._policy = policy
        self._trip_on = trip_signals(policy.recovery)
        self._trip_rules = trip_rules(policy.recovery)
        self._step_seconds = step_seconds
        self._monitor = SignalMonitor(policy.detection, self._trip_on, self._trip_rules)
        self._timeline: list[StepObservation] = []
        """What the current attempt's monitor has seen, inherited timeline included."""
        self._steps_since_start = 0
        self._attempt = 0
        self._elapsed = 0.0
        self._previous_step: int | None = None
        self._last_stop_step: int | None = None
        self._lr = 0.0
        self._previous_time: float | None = None
        self._gaps: deque[float] = deque(maxlen=RECENT_GAPS)
        self._stopped_at_previous = False
        self._ledger = PolicyLedger()
        self.lr_scale = 1.0
        self.points: list[ReplayPoint] = []

    def step(self, row: MetricsRow) -> list[ReplayedDecision]:
        """The decisions this row leads to: a stall before it, then its own findings'."""
        decisions = []
        stall = self._stall_before(row)
        if stall is not None:
            decisions.append(stall)
        if row.relaunch:
            self._relaunch(row.step)
        own = self._observe(row)
        if own is not None:
            decisions.append(ReplayedDecision(row.step, own))
        return decisions

    def _stall_before(self, row: MetricsRow) -> ReplayedDecision | None:
        """The stall rule on the gap before `row`, as one rank's heartbeat would show it."""
        previous, last_step = self._previous_time, self._previous_step
        if row.time is None or previous is None or last_step is None:
            return None
        gap = max(row.time - previous, 0.0)
        if self._stopped_at_previous:
            return None
        last_at = REPLAY_EPOCH + timedelta(seconds=previous)
        beat = Heartbeat(
            rank=0,
            started_at=REPLAY_EPOCH,
            steps_completed=self._steps_since_start,
            last_step=last_step,
            last_step_at=last_at,
            slowest_step_seconds=max(self._gaps) if self._gaps else None,
            in_step=True,
            place=ThreadPlace.ELSEWHERE,
        )
        progress = RankProgress(REPLAY_NODE, REPLAY_NODE, beat, last_at, last_at)
        seen_at = last_at + timedelta(seconds=gap)
        verdict = judge_stall(
            [progress], stall_seconds=self._policy.detection.stall_seconds, now=seen_at
        )
        if verdict is None:
            return None
        now = last_at + timedelta(seconds=verdict.bound_seconds)
        observation = stalled(step=last_step, evidence=verdict.evidence)
        decision = decide(
            self._policy.recovery, [observation], self._ledger, now=now, lr_scale=self.lr_scale
        )
        if decision is None:
            return None
        self._ledger = record(self._ledger, decision, now=now)
        if kind_of(decision.action).stops_the_run:
            self._last_stop_step = last_step
        return ReplayedDecision(last_step, decision)

    def _observe(self, row: MetricsRow) -> Decision | None:
        now = self._tick(row)
        if row.lr is not None:
            self._lr = row.lr
        observation = StepObservation(
            step=row.step,
            loss=row.loss,
            grad_norm=row.grad_norm,
            lr=self._lr,
            tokens_per_second=row.tokens_per_second,
            custom=row.custom,
            checkpoint_in_flight=False,
            steps_since_start=self._steps_since_start,
        )
        verdict = self._monitor.observe(observation)
        self._timeline.append(observation)
        self._steps_since_start += 1
        baseline = self._monitor.snapshot().loss_baseline
        self.points.append(ReplayPoint(row.step, row.loss, baseline, self._attempt))
        self._stopped_at_previous = False
        if not verdict.findings:
            return None
        observations = _observations(
            verdict, self._last_stop_step, self._monitor.last_good_step, self._attempt
        )
        if not observations:
            return None
        decision = decide(
            self._policy.recovery, observations, self._ledger, now=now, lr_scale=self.lr_scale
        )
        if decision is None:
            return None
        self._ledger = record(self._ledger, decision, now=now)
        if decision.lr_scale is not None:
            self.lr_scale = decision.lr_scale
        if kind_of(decision.action).stops_the_run:
            self._last_stop_step = row.step
            self._stopped_at_previous = True
        return decision

    def _relaunch(self, first_step: int) -> None:
        """A new attempt resumed from a checkpoint before `first_step`: its monitor starts
        from the state the checkpoint holds, i.e. after the surviving timeline."""
        self._timeline = [o for o in self._timeline if o.step < first_step]
        self._monitor = SignalMonitor(self._policy.detection, self._trip_on, self._trip_rules)
        for observation in self._timeline:
            self._monitor.observe(observation)
        self._steps_since_start = 0
        self._attempt += 1
        self._last_stop_step = None
        self._gaps.clear()

    def _tick(self, row: MetricsRow) -> datetime:
        first = self._previous_step is None
        if row.time is not None:
            if self._previous_time is not None and not row.relaunch:
                self._gaps.append(max(row.time - self._previous_time, 0.0))
            self._previous_time = row.time
            self._elapsed = row.time if first else max(self._elapsed, row.time)
        elif self._previous_step is not None:
            steps = 1 if row.relaunch else max(row.step - self._previous_step, 1)
            self._elapsed += steps * self._step_seconds
        self._previous_step = row.step
        return REPLAY_EPOCH + timedelta(seconds=self._elapsed)


def _observations(
    verdict: Verdict, last_stop_step: int | None, last_good_step: int | None, attempt: int
) -> list[Observation]:
    """What the operator would see at this step, through the live channels: the trip
    report the agent's own `build_trip_report` writes if it tripped (the run stops, so
    nothing is scraped), otherwise each finding as the status endpoint reports it; none of
    the findings that began before the last stop."""

    def new(finding: Finding) -> bool:
        return last_stop_step is None or finding.onset_step > last_stop_step

    live = tuple(f for f in verdict.findings if new(f))
    tripping = tuple(f for f in verdict.tripping if new(f))
    if tripping:
        report = build_trip_report(
            verdict._replace(findings=live, tripping=tripping),
            attempt=attempt,
            node=REPLAY_NODE,
            last_good_step=last_good_step,
            inventory=(),
            lineage_path="",
        )
        return [trip_observation([report])]
    names = tuple(f.signal for f in live)
    return [
        finding_observation(
            f.to_report(),
            step=verdict.step,
            firing_with=tuple(name for name in names if name != f.signal),
        )
        for f in live
    ]
