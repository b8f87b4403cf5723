"""Why a loss spike happened, as far as the recent steps tell, with the evidence spelled out.

The class decides the cure in the operator's rules, so each rule here follows what people
diagnosed by hand in public logbooks:

* gradient norm anomalous a few steps *before* the loss (BLOOM-176B, steps 31216-31219):
  the optimiser is running away -> Divergence;
* loss still climbing while the gradient norm is anomalous too -> Divergence;
* grad-norm spikes recurring again and again in the recent past: the LR is too high for
  this phase of training (OPT-175B lowered it after repeated spikes) -> LRTooHigh;
* otherwise a sharp jump with no warning from the gradients is tied to the data of those
  steps -> BadBatch (skipping that data range is the cure PaLM used).

Non-finite values are Numerical and throughput drops Infrastructure; the monitor assigns
those directly because their cause is not in question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from stabletrain_contract.names import AnomalyClass

GRAD_LEAD_STEPS = 10
"""How far before the loss onset an anomalous grad norm still counts as leading it."""
RECURRENCE_STEPS = 200
"""Look-back over which grad-norm spike episodes count as recurring."""
RECURRENCE_EPISODES = 3
"""Separate grad-norm spike episodes within the look-back that mean 'LR too high'."""
CLIMB_FACTOR = 1.1
"""Loss now at least this multiple of the loss at onset counts as still climbing."""


class StepRecord(NamedTuple):
    """The little the attribution needs to remember about each recent step (a tuple: one
    per step)."""

    step: int
    loss: float
    lr: float
    grad_anomalous: bool
    grad_onset: bool
    """This step started a new run of anomalous grad norms (one episode)."""


@dataclass(frozen=True)
class Attribution:
    anomaly_class: AnomalyClass
    evidence: str


def attribute_loss_spike(
    onset_step: int, current: StepRecord, history: Sequence[StepRecord]
) -> Attribution:
    """Classify the loss spike that began at ``onset_step``; ``history`` ends with ``current``."""
    episodes = _grad_episodes(current, history)
    if len(episodes) >= RECURRENCE_EPISODES:
        return Attribution(
            AnomalyClass.LR_TOO_HIGH,
            f"{len(episodes)} separate grad-norm spikes began in the last {RECURRENCE_STEPS} "
            f"steps (at {_steps(episodes)}){_lr_trend(history, onset_step)}: "
            "recurring instability points at the LR",
        )
    lead = [
        r.step
        for r in history
        if r.grad_anomalous and onset_step - GRAD_LEAD_STEPS <= r.step < onset_step
    ]
    if lead:
        return Attribution(
            AnomalyClass.DIVERGENCE,
            f"grad norm was anomalous at step {lead[0]}, {onset_step - lead[0]} step(s) before "
            f"the loss spike began at step {onset_step}: the optimisation is running away",
        )
    at_onset = next((r for r in history if r.step == onset_step), None)
    if (
        current.grad_anomalous
        and at_onset is not None
        and current.step > onset_step
        and current.loss >= CLIMB_FACTOR * at_onset.loss
    ):
        return Attribution(
            AnomalyClass.DIVERGENCE,
            f"loss kept climbing from {at_onset.loss:.4g} at step {onset_step} to "
            f"{current.loss:.4g} at step {current.step} with an anomalous grad norm",
        )
    return Attribution(
        AnomalyClass.BAD_BATCH,
        f"loss jumped at step {onset_step} with no grad-norm warning before it: the data "
        f"consumed from step {onset_step} on is the suspect",
    )


def attribute_grad_norm_spike(current: StepRecord, history: Sequence[StepRecord]) -> Attribution:
    """Classify an anomalous grad norm on its own: an early warning, not yet a loss spike."""
    episodes = _grad_episodes(current, history)
    if len(episodes) >= RECURRENCE_EPISODES:
        return Attribution(
            AnomalyClass.LR_TOO_HIGH,
            f"{len(episodes)} separate grad-norm spikes began in the last {RECURRENCE_STEPS} "
            f"steps (at {_steps(episodes)}): recurring instability points at the LR",
        )
    return Attribution(
        AnomalyClass.DIVERGENCE,
        "grad norm above its baseline: an early warning, it often rises a few steps before "
        "the loss does",
    )


def _grad_episodes(current: StepRecord, history: Sequence[StepRecord]) -> list[int]:
    """Steps at which a grad-norm spike episode began within the recurrence look-back."""
    since = current.step - RECURRENCE_STEPS
    return [r.step for r in history if r.grad_onset and r.step > since]


def _steps(steps: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in steps[-5:])
    return shown if len(steps) <= 5 else "..., " + shown


def _lr_trend(history: Sequence[StepRecord], onset_step: int) -> str:
    before = [r for r in history if r.step <= onset_step]
    if len(before) < 2 or before[0].lr <= 0.0:
        return ""
    change = before[-1].lr / before[0].lr
    if change <= 1.0:
        return ""
    return f", while the LR rose {change:.2f}x from step {before[0].step} to {before[-1].step}"
