"""The replay loop: every recorded row through `SignalMonitor`, every finding through `decide`.

Nothing here re-implements detection or policy; it only models what the live system does
around them, because a recorded history keeps going where a live run would have stopped:

* A trip becomes a trip-report observation, other findings become scraped observations,
  exactly as the operator sees them.
* After a Rollback or RestartFromLatest at step S the live run would have been relaunched
  from a checkpoint before S; what the recording shows of anomalies that began at or
  before S belongs to the run that was stopped. Findings with an onset at or before S are
  therefore not decided on again (whatever their signal); the monitor keeps observing,
  and the ledger (budgets, cooldown, escalation) and the LR scale carry on, so a later
  spike near the same step escalates as it would live.
* After a Fail the job is over, and the replay stops there.
* Time: the policy's cooldowns need a clock; the replay uses step x `step_seconds`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from stabletrain_agent.contract.names import Action
from stabletrain_agent.signals.monitor import Finding, SignalMonitor, StepObservation, Verdict
from stabletrain_operator.cli.replay.history import MetricsHistory
from stabletrain_operator.cli.replay.policy_file import ReplayPolicy
from stabletrain_operator.policy import (
    Decision,
    Observation,
    ObservationSource,
    PolicyLedger,
    decide,
    record,
    trip_signals,
)

REPLAY_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
"""Time of step 0 in a replay; only differences matter (cooldowns)."""
PROGRESS_EVERY = 20_000
"""Rows between progress reports: about a second of work, so long replays show life."""


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
    monitor = SignalMonitor(policy.detection, trip_signals(policy.recovery))
    ledger = PolicyLedger()
    lr_scale = 1.0
    lr = 0.0
    last_stop_step: int | None = None
    decisions: list[ReplayedDecision] = []
    points: list[ReplayPoint] = []
    failed_at = None
    total = len(history.rows)
    for index, row in enumerate(history.rows):
        if on_progress is not None and index and index % PROGRESS_EVERY == 0:
            on_progress(index, total)
        if row.lr is not None:
            lr = row.lr
        verdict = monitor.observe(
            StepObservation(
                step=row.step,
                loss=row.loss,
                grad_norm=row.grad_norm,
                lr=lr,
                tokens_per_second=row.tokens_per_second,
                custom=row.custom,
                checkpoint_in_flight=False,
                steps_since_start=index,
            )
        )
        points.append(ReplayPoint(row.step, row.loss, monitor.snapshot().loss_baseline))
        observations = _observations(verdict, last_stop_step)
        if not observations:
            continue
        now = REPLAY_EPOCH + timedelta(seconds=row.step * step_seconds)
        decision = decide(policy.recovery, observations, ledger, now=now, lr_scale=lr_scale)
        if decision is None:
            continue
        ledger = record(ledger, decision, now=now)
        if decision.lr_scale is not None:
            lr_scale = decision.lr_scale
        if decision.stops_the_run:
            last_stop_step = row.step
        replayed = ReplayedDecision(row.step, decision)
        decisions.append(replayed)
        if on_decision is not None:
            on_decision(replayed)
        if decision.action is Action.FAIL:
            failed_at = row.step
            break
    read = {signal.metric_key for signal in policy.detection.custom}
    return ReplayResult(
        decisions=tuple(decisions),
        points=tuple(points),
        unused_columns=tuple(c for c in history.custom_columns if c not in read),
        failed_at=failed_at,
        lr_scale=lr_scale,
    )


def _observations(verdict: Verdict, last_stop_step: int | None) -> list[Observation]:
    """What the operator would see at this step: a trip report if the agent tripped (the run
    stops, so nothing is scraped), otherwise every finding in the status endpoint; none of
    the findings that began before the last stop."""

    def new(finding: Finding) -> bool:
        return last_stop_step is None or finding.onset_step > last_stop_step

    live = [f for f in verdict.findings if new(f)]
    tripping = [f for f in verdict.tripping if new(f)]
    if tripping:
        first = tripping[0]
        others = tuple(f.signal for f in live if f is not first)
        return [_observation(first, verdict.step, ObservationSource.TRIP_REPORT, others)]
    return [_observation(f, verdict.step, ObservationSource.SCRAPE, ()) for f in live]


def _observation(
    finding: Finding, step: int, source: ObservationSource, firing_with: tuple[str, ...]
) -> Observation:
    return Observation(
        signal=finding.signal,
        anomaly_class=finding.anomaly_class,
        step=step,
        onset_step=finding.onset_step,
        sustained=finding.sustained,
        tripped=source is ObservationSource.TRIP_REPORT,
        evidence=finding.evidence,
        source=source,
        firing_with=firing_with,
    )
