"""When a relaunch is confirmed: the run is past the old onset with the signal quiet.

A rollback is only a fix if the run gets through the place where it failed. The step to
pass is the old onset plus the detection window of the signal (the consecutive steps it
needs before it trips), since a recurrence shows only that late; until every pod is past
it, runs the new directives and the signal is quiet, the job stays Confirming, and a trip
there is the same incident (the policy escalates it). Actions without an onset (restarts,
manual rollbacks, resuming) are confirmed once every pod runs the new directives past the
resume step. A wall-clock bound keeps a run that never gets there from sitting in
Confirming for ever.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import Action
from stabletrain_operator.api.status import Plan
from stabletrain_operator.policy.action_registry import kind_of

LR_TOLERANCE = 1e-9


def confirm_step(
    action: Action, signal: str, onset_step: int | None, detection: DetectionConfig
) -> int | None:
    """The step a rollback's run must pass with the signal quiet; None confirms on the
    directives alone (no onset to get past)."""
    if not kind_of(action).goes_before_onset or onset_step is None:
        return None
    return onset_step + detection.detection_window(signal)


class Outcome(StrEnum):
    WAITING = "Waiting"
    CONFIRMED = "Confirmed"
    TIMED_OUT = "TimedOut"


@dataclass(frozen=True)
class Confirmation:
    outcome: Outcome
    message: str = ""


def confirmation(
    plan: Plan,
    fresh: Sequence[AgentStatus],
    *,
    nodes: int,
    attempt: int,
    directives_generation: int,
    lr_scale: float,
    now: datetime,
    timeout: timedelta,
) -> Confirmation:
    """Where Confirming stands this tick, from this tick's scrapes of the new attempt."""
    resume = plan.target_step if plan.target_step is not None else 0
    bar = plan.confirm_step if plan.confirm_step is not None else resume
    applied = [
        s
        for s in fresh
        if s.applied_generation >= directives_generation
        and abs(s.lr_scale - lr_scale) <= LR_TOLERANCE
        and s.step is not None
        and s.step > max(bar, resume)
    ]
    quiet = not any(f.signal == plan.signal for s in fresh for f in s.firing)
    if len({s.node_rank for s in applied}) >= nodes and (plan.confirm_step is None or quiet):
        return Confirmation(Outcome.CONFIRMED, _confirmed(plan, applied, attempt, lr_scale))
    if now - plan.started_at >= timeout:
        reached = max((s.step for s in fresh if s.step is not None), default=None)
        where = "no pod reported a step" if reached is None else f"it reached step {reached}"
        return Confirmation(
            Outcome.TIMED_OUT,
            f"attempt {attempt} did not pass step {bar} with every pod on directives "
            f"generation {directives_generation}"
            f"{f' and {plan.signal} quiet' if plan.confirm_step is not None else ''} within "
            f"recovery.confirmTimeoutSeconds ({timeout.total_seconds():.0f} s) of the "
            f"decision ({where}); it runs on unconfirmed, watch it",
        )
    return Confirmation(Outcome.WAITING)


def _confirmed(plan: Plan, applied: Sequence[AgentStatus], attempt: int, lr_scale: float) -> str:
    resume = "scratch" if plan.target_step is None else f"step {plan.target_step}"
    if plan.confirm_step is None or plan.onset_step is None:
        return (
            f"attempt {attempt} runs from {resume} with LR scale {lr_scale:g}; every pod "
            "applied the new directives"
        )
    lead = min(applied, key=lambda s: s.node_rank)
    window = plan.confirm_step - plan.onset_step
    return (
        f"attempt {attempt} (from {resume}, LR scale {lr_scale:g}) passed step "
        f"{plan.confirm_step} (onset {plan.onset_step} + {window}-step detection window) with "
        f"{plan.signal} quiet, at step {lead.step}: {_loss_against_baseline(lead, plan)}"
    )


def _loss_against_baseline(lead: AgentStatus, plan: Plan) -> str:
    loss, baseline = lead.loss, plan.loss_baseline
    if loss is None or not math.isfinite(loss):
        return "loss not reported as a finite number"
    if baseline is None or baseline <= 0.0:
        return f"loss {loss:.4g} (no pre-spike baseline was known)"
    return f"loss {loss:.4g} against the pre-spike baseline {baseline:.4g} ({loss / baseline:.2f}x)"
