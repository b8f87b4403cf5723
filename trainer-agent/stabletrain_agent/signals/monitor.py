"""The per-step seam between the torch guard and the torch-free detectors.

The guard hands over plain host numbers that every rank already agrees on, so the
monitor's verdict is identical on every rank without another collective. The monitor
never reads the clock or does I/O: the replay CLI feeds it a recorded run and must get
the verdicts the live run got.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepObservation:
    """What one finished optimizer step looked like, in values all ranks agree on."""

    step: int
    """Global optimizer step just finished."""
    loss: float
    """Loss averaged across all ranks; may be nan or inf."""
    grad_norm: float | None
    """Total pre-clip grad norm across all ranks; None when the loop does not clip."""
    lr: float
    """Effective LR of param group 0 after directives were applied."""
    tokens_per_second: float | None
    """Throughput of this step; None when the loop does not report token counts."""
    custom: Mapping[str, float] = field(default_factory=dict)
    """Named custom signals (validation loss, MoE aux loss, entropy, ...)."""
    checkpoint_in_flight: bool = False
    """A save ran during this step, so a throughput dip is expected and not a fault."""
    steps_since_start: int = 0
    """Steps since this process (re)started; the first ones are slow while caches warm."""


@dataclass(frozen=True)
class Finding:
    """One signal firing at one step, with the evidence a person needs to trust it."""

    signal: str
    """Signal name as used in the directives' trip list (e.g. ``loss_spike``)."""
    anomaly_class: str
    """Attribution class from the contract (bad batch, divergence, numerical, ...)."""
    value: float
    """The observed value that fired (loss, grad norm, tokens/s, custom value)."""
    threshold: float
    """The bound it crossed, in the same unit as ``value``."""
    onset_step: int
    """First step of the current consecutive run of anomalous steps."""
    consecutive: int
    """How many consecutive steps (including this one) have been anomalous."""
    sustained: bool
    """The run is long enough to count: only sustained findings can trip."""
    evidence: str
    """One sentence saying why this fired and why this class was chosen."""


@dataclass(frozen=True)
class Verdict:
    """The monitor's answer for one step."""

    step: int
    trip: bool
    """Stop training now: a sustained finding names a signal the directives trip on."""
    findings: tuple[Finding, ...] = ()
    """Every signal firing this step, report-only ones included."""
    tripping: tuple[Finding, ...] = ()
    """The findings responsible for ``trip``; what the trip report names."""
    skip_update: bool = False
    """Loss or grad norm is non-finite: this step's update must not reach the weights."""


@dataclass(frozen=True)
class MonitorSnapshot:
    """What the exporter and the trip report show about the monitor's state."""

    step: int | None
    loss: float | None
    loss_baseline: float | None
    grad_norm: float | None
    grad_norm_baseline: float | None
    lr: float | None
    tokens_per_second: float | None
    throughput_baseline: float | None
    spike_active: bool
    consecutive_spike_steps: int
    spike_onset_step: int | None
    non_finite_total: int
    anomaly_class: str | None
    """Class of the most recent sustained finding, None while the run looks healthy."""
    custom: Mapping[str, float] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
