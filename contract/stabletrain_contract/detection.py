"""What counts as anomalous: the thresholds the operator hands to every rank.

The defaults are calibrated against public training logbooks, and the evidence sits next
to each number so nobody has to guess why it is what it is:

* BLOOM-176B (BigScience tr11 logbook): loss 2.20 -> 5.10 around step 31219, ratio 2.3.
* BigScience 104B (tr8 logbook): 6.44 -> 11.42, ratio 1.77.
* BigScience 13B (tr1 logbook): 2.77 -> 7.34, ratio 2.65.
  Those spikes lasted hundreds of steps before people rolled back by hand.
* Benign outliers: single steps at about 1.5x a running median appear throughout healthy
  runs (one unlucky batch) and recover on the next step; rolling back on them wastes hours.
* llm-foundry's KillLossSpike waits for 4 consecutive steps above 2x a 100-step mean;
  OLMo-core's SkipStepOptimizer uses a z-score above 6 over the last 128 steps.

The arithmetic lives here too (`next_ema`, `ratio_breached`, ...) so that the agent's
detectors and the documentation cannot disagree about what a threshold means.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Self

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from stabletrain_contract.base import ContractModel, as_written, kubernetes_rules
from stabletrain_contract.names import (
    CUSTOM_NAME_PATTERN,
    AnomalyClass,
    Signal,
    custom_signal,
)

CUSTOM_SIGNALS_MAX = 16
"""Custom signals one job may define."""

PositiveRatio = Annotated[float, Field(gt=1.0, le=1000.0, allow_inf_nan=False)]
"""A multiple of a baseline that counts as a jump; 1 or less would fire on healthy steps."""


class BaselineConfig(ContractModel):
    """How each series (loss, grad norm, tokens/s, custom) learns what normal looks like.

    Only healthy steps feed a baseline: a spike must not drag its own reference up and hide
    its continuation.
    """

    ema_factor: float = Field(default=0.02, gt=0.0, le=1.0, allow_inf_nan=False)
    """Weight of the newest healthy value in the EMA. 0.02 averages over roughly the last
    100 steps (2/(N+1)), the window llm-foundry's KillLossSpike uses."""
    window: int = Field(default=128, ge=8, le=100_000)
    """Healthy values kept for robust statistics (median/MAD z-score); OLMo-core uses 128."""
    min_samples: int = Field(default=20, ge=1, le=100_000)
    """Healthy values after the warm-up that seed the baseline before its EMA is the
    reference. While it fills, loss and grad-norm values are judged by the same spike rules
    against the median of the healthy values so far (from the third on), so a spike then
    is detected and never learned; once full, seeds the final median shows were outliers
    are dropped and refilled."""
    warmup_steps: int = Field(default=100, ge=0)
    """Global steps at the start of training that are neither judged nor learned from: the
    loss falls steeply then and any baseline would be stale within steps."""

    def next_ema(self, previous: float | None, healthy_value: float) -> float:
        """The EMA after one more healthy value; the first value seeds it."""
        if previous is None:
            return healthy_value
        return previous + self.ema_factor * (healthy_value - previous)


class SpikeConfig(ContractModel):
    """Upward spikes of one series against its baseline; either rule marks a step anomalous.

    "Neither rule" is refused by the operator on the effective detection (the job's values
    over its StableTrainingPolicy defaults), not by the API server: CEL sees an explicit
    null as an absent field, so it cannot tell a disabled rule from an inherited one."""

    ratio: PositiveRatio | None = 1.6
    """Anomalous when value / EMA baseline >= ratio; null disables the ratio rule."""
    zscore: float | None = Field(default=None, gt=0.0, le=1000.0, allow_inf_nan=False)
    """Anomalous when (value - median) / (1.4826 * MAD) over the window >= zscore; null
    disables it. The robust alternative for series whose scale drifts."""
    consecutive_steps: int = Field(default=4, ge=1, le=100_000)
    """Anomalous steps in a row before the spike is sustained; only sustained spikes trip."""

    @model_validator(mode="after")
    def _one_rule_at_least(self, info: ValidationInfo) -> Self:
        if as_written(info):
            return self  # the other rule may be inherited; the effective one is checked
        if self.ratio is None and self.zscore is None:
            raise ValueError("set ratio, zscore or both: a spike rule with neither never fires")
        return self

    def ratio_breached(self, value: float, baseline: float) -> bool:
        """The ratio rule for one step. Baselines at or below zero never make a ratio fire."""
        return self.ratio is not None and baseline > 0.0 and value / baseline >= self.ratio

    def zscore_breached(self, robust_zscore: float) -> bool:
        """The z-score rule for one step, given the robust z-score the detector computed."""
        return self.zscore is not None and robust_zscore >= self.zscore


class LossSpikeConfig(SpikeConfig):
    """Loss spikes. Ratio 1.6 for 4 steps: below the smallest logbook ratio (1.77,
    BigScience 104B) with 10% margin, above benign one-step outliers (~1.5x), and sustained
    as llm-foundry's KillLossSpike demands (patience 4)."""

    SIGNAL: ClassVar[Signal] = Signal.LOSS_SPIKE


class GradNormSpikeConfig(SpikeConfig):
    """Gradient-norm spikes. Ratio 4 for 4 steps. Grad-norm spikes without a loss spike are
    common and usually harmless (the OPT-175B logbook records many), so the default policy
    only reports them."""

    SIGNAL: ClassVar[Signal] = Signal.GRAD_NORM_SPIKE
    ratio: PositiveRatio | None = 4.0
    """Anomalous when value / EMA baseline >= ratio; null disables the ratio rule."""


class NonFiniteConfig(ContractModel):
    """NaN/Inf in loss or gradient norm. The update of such a step never reaches the weights."""

    SIGNAL: ClassVar[Signal] = Signal.NON_FINITE

    consecutive_steps: int = Field(default=3, ge=1, le=100_000)
    """Non-finite steps in a row that count as sustained. Isolated overflow steps are
    routine with dynamic loss scaling (PyTorch's GradScaler skips them silently); three in a
    row mean the state is broken."""


class ThroughputConfig(ContractModel):
    """Tokens/s falling well below its baseline: a slow rank, a throttled GPU, a sick disk."""

    SIGNAL: ClassVar[Signal] = Signal.THROUGHPUT_DROP

    drop_fraction: float = Field(default=0.5, gt=0.0, lt=1.0, allow_inf_nan=False)
    """Anomalous when tokens/s <= (1 - drop_fraction) * baseline."""
    grace_steps: int = Field(default=20, ge=0, le=100_000)
    """Steps after a (re)start or during/after a checkpoint save that are not judged: caches
    warm, the compiler runs, and saves pause the loop, all expected dips."""
    consecutive_steps: int = Field(default=10, ge=1, le=100_000)
    """Slow steps in a row that count as sustained."""

    def drop_breached(
        self, tokens_per_second: float, baseline: float, steps_since_event: int
    ) -> bool:
        """One step's verdict; `steps_since_event` counts from the last restart or save."""
        if steps_since_event < self.grace_steps or baseline <= 0.0:
            return False
        return tokens_per_second <= (1.0 - self.drop_fraction) * baseline


class ThresholdKind(StrEnum):
    """How a custom signal's threshold reads."""

    ABOVE = "Above"
    """Anomalous when value >= threshold (e.g. validation loss above 3.2)."""
    BELOW = "Below"
    """Anomalous when value <= threshold (e.g. policy entropy below 0.5)."""
    RELATIVE_JUMP = "RelativeJump"
    """Anomalous when value / own EMA baseline >= threshold (threshold must exceed 1)."""


class CustomSignalConfig(ContractModel):
    """A user-named series the training loop reports (validation loss, entropy, reward, ...)."""

    model_config = ConfigDict(
        json_schema_extra=kubernetes_rules(
            (
                "self.kind != 'RelativeJump' || self.threshold > 1.0",
                "threshold of a RelativeJump signal is a ratio over the baseline and must exceed 1",
                ".threshold",
            )
        )
    )

    name: str = Field(pattern=f"^{CUSTOM_NAME_PATTERN}$", max_length=63)
    """Rules and directives refer to it as `custom:<name>`."""
    metric: str | None = Field(default=None, pattern=f"^{CUSTOM_NAME_PATTERN}$", max_length=63)
    """Key the loop reports the value under; null means the same as `name`. Two signals may
    watch one metric (e.g. a hard and a soft bound)."""
    kind: ThresholdKind
    threshold: float = Field(allow_inf_nan=False)
    """The bound, in the unit of the series (a ratio for RelativeJump)."""
    consecutive_steps: int = Field(default=1, ge=1, le=100_000)
    """Anomalous steps in a row before the signal counts as sustained."""
    anomaly_class: AnomalyClass = AnomalyClass.DIVERGENCE
    """Class reported when it fires; a custom series says nothing about its cause by itself."""

    @model_validator(mode="after")
    def _jump_means_a_ratio(self) -> Self:
        if self.kind is ThresholdKind.RELATIVE_JUMP and self.threshold <= 1.0:
            raise ValueError(
                f"threshold of a RelativeJump signal is a ratio over the baseline and must "
                f"exceed 1, got {self.threshold}"
            )
        return self

    @property
    def signal(self) -> str:
        return custom_signal(self.name)

    @property
    def metric_key(self) -> str:
        return self.metric or self.name

    def breached(self, value: float, baseline: float | None) -> bool:
        """One step's verdict; RelativeJump needs a positive baseline and is quiet without."""
        if self.kind is ThresholdKind.ABOVE:
            return value >= self.threshold
        if self.kind is ThresholdKind.BELOW:
            return value <= self.threshold
        return baseline is not None and baseline > 0.0 and value / baseline >= self.threshold


class DetectionConfig(ContractModel):
    """Every threshold of the agent's detectors. The default trips on the logbook spikes."""

    baseline: BaselineConfig = Field(default_factory=BaselineConfig)
    loss_spike: LossSpikeConfig = Field(default_factory=LossSpikeConfig)
    grad_norm_spike: GradNormSpikeConfig = Field(default_factory=GradNormSpikeConfig)
    non_finite: NonFiniteConfig = Field(default_factory=NonFiniteConfig)
    throughput: ThroughputConfig = Field(default_factory=ThroughputConfig)
    stall_seconds: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    """No rank completing a step for this long raises Stalled (decided by the operator from
    the agents' heartbeats). Null sizes it from the job's own step time: 10x the slowest
    recent step, at least 120 s, which for steps up to 48 s fires before torch's default
    process-group timeouts (10 min NCCL, 30 min gloo). Checkpoint saves and restores never
    count. The first two steps of every launch are held to the start-up bound instead,
    counted from the end of the process's restore: twice this value but at least 30 s, or
    600 s when null (docs/policy.md, Stalled)."""
    custom: tuple[CustomSignalConfig, ...] = Field(
        default=(),
        max_length=CUSTOM_SIGNALS_MAX,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """User-named signals, unique by name; rules refer to them as `custom:<name>`."""

    @model_validator(mode="after")
    def _custom_names_unique(self) -> Self:
        seen: set[str] = set()
        for signal in self.custom:
            if signal.name in seen:
                raise ValueError(f"custom signal name {signal.name!r} is defined twice")
            seen.add(signal.name)
        return self

    def detection_window(self, signal: str) -> int:
        """Steps after an onset `signal` needs to trip: its consecutiveSteps. Each built-in
        signal's config names its signal (`SIGNAL`), so a new one is found here without a
        table to extend; 0 for the signals the operator observes itself (no onset in data)."""
        for name in type(self).model_fields:
            config = getattr(self, name)
            if getattr(type(config), "SIGNAL", None) == signal:
                return int(config.consecutive_steps)
        return next((c.consecutive_steps for c in self.custom if c.signal == signal), 0)

    def custom_signal_names(self) -> frozenset[str]:
        """The `custom:<name>` signals this config defines."""
        return frozenset(signal.signal for signal in self.custom)
