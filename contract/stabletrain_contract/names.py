"""The vocabulary both sides share: signal names, attribution classes, policy actions.

Values are CamelCase strings because users type them into `StableTrainingJob` rules and
Kubernetes API conventions spell enumerated values that way. `StrEnum` keeps them plain
strings on the wire (JSON, Prometheus labels, Events) while code gets typos caught by mypy.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Signal(StrEnum):
    """What fired. The agent computes the first four per step; the operator observes the rest."""

    LOSS_SPIKE = "LossSpike"
    """Loss sustained above its healthy baseline (ratio or robust z-score)."""
    GRAD_NORM_SPIKE = "GradNormSpike"
    """Pre-clip gradient norm sustained above its healthy baseline."""
    NON_FINITE = "NonFinite"
    """Loss or gradient norm was NaN or infinite on consecutive steps."""
    THROUGHPUT_DROP = "ThroughputDrop"
    """Tokens/s sustained below its baseline outside the grace period after a restart or save."""
    WORKER_FAILURE = "WorkerFailure"
    """A worker pod or process ended without a trip report (crash, OOM kill, lost node)."""
    STALLED = "Stalled"
    """No step progress for longer than the detection's stall timeout."""
    MANUAL = "Manual"
    """A person asked for a rollback through the resource (recorded in history, not matched)."""


AGENT_SIGNALS: frozenset[Signal] = frozenset(
    {Signal.LOSS_SPIKE, Signal.GRAD_NORM_SPIKE, Signal.NON_FINITE, Signal.THROUGHPUT_DROP}
)
"""Signals the agent computes and can trip on; each is fired by one of the monitor's signals
(signals/monitor.py checks it when a monitor is built)."""

OPERATOR_SIGNALS: frozenset[Signal] = frozenset(
    {Signal.WORKER_FAILURE, Signal.STALLED, Signal.MANUAL}
)
"""Signals only the operator raises, from what it observes of the pods or is asked. Every
`Signal` is in exactly one of the two sets (a unit test holds it), so a new one cannot
silently become report-only by being left out of AGENT_SIGNALS."""

CUSTOM_SIGNAL_PREFIX = "custom:"
"""User-named signals (validation loss, entropy, reward, ...) are `custom:<name>` in rules."""

CUSTOM_NAME_PATTERN = r"[a-z][a-z0-9_]{0,62}"
"""Lower snake_case, so a custom name is a valid Prometheus label value and metric suffix."""
SIGNAL_NAME_MAX = len(CUSTOM_SIGNAL_PREFIX) + 63
"""The longest signal name: `custom:` and a 63-character custom name."""

SIGNAL_PATTERN = (
    "^("
    + "|".join(s.value for s in Signal)
    + "|"
    + CUSTOM_SIGNAL_PREFIX
    + CUSTOM_NAME_PATTERN
    + ")$"
)
"""Any signal a rule or a directive may name; the CRD validates against the same pattern."""

_SIGNAL_RE = re.compile(SIGNAL_PATTERN)


def custom_signal(name: str) -> str:
    """The signal name under which the custom signal `name` fires."""
    if not re.fullmatch(CUSTOM_NAME_PATTERN, name):
        raise ValueError(
            f"custom signal name {name!r} must match {CUSTOM_NAME_PATTERN} (lower snake_case)"
        )
    return CUSTOM_SIGNAL_PREFIX + name


def is_signal_name(value: str) -> bool:
    """True for a built-in signal or a well-formed `custom:<name>`."""
    return _SIGNAL_RE.fullmatch(value) is not None


class AnomalyClass(StrEnum):
    """Why it fired, as far as the evidence tells; rules may match on it.

    The classes follow what practitioners diagnose by hand in the OPT-175B and BLOOM
    logbooks: a poisoned stretch of data, optimisation that runs away, an LR that is too
    high for the current state, arithmetic that broke, or hardware/software around training.
    """

    BAD_BATCH = "BadBatch"
    """Short, sharp loss jump tied to the data of a few steps; recovers when the data is skipped."""
    DIVERGENCE = "Divergence"
    """Loss keeps climbing with growing gradient norms: the optimiser state itself went bad."""
    LR_TOO_HIGH = "LRTooHigh"
    """Grad-norm spikes recur around the same phase; a lower LR is the usual cure."""
    NUMERICAL = "Numerical"
    """NaN or Inf in loss or gradients (overflow, bad kernel, corrupted tensor)."""
    INFRASTRUCTURE = "Infrastructure"
    """Not the model: a crashed rank, a lost node, a stalled collective, a slow disk."""


class Action(StrEnum):
    """What a recovery rule does; the exact behaviour of each is documented in docs/api.md."""

    ROLLBACK = "Rollback"
    """End every training process of the attempt (in the kept pods with recovery.restart
    InPlace), resume from the newest stable pre-onset checkpoint with a lower LR, skipping
    the data around the onset, after a re-warm-up."""
    REDUCE_LR = "ReduceLR"
    """Scale the LR of the running pods through a live directive; no restart."""
    RESTART_FROM_LATEST = "RestartFromLatest"
    """Relaunch from the newest complete checkpoint with LR and data unchanged."""
    ALERT = "Alert"
    """Event, condition and metric only; the run is not touched."""
    FAIL = "Fail"
    """Stop all pods and mark the job Failed."""
