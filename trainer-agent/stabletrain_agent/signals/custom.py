"""User-named series (validation loss, MoE aux loss, policy entropy, reward, ...).

The training loop knows signals stabletrain cannot compute; it reports them by name and
the directives say how each one reads. Steps that do not report a series (a validation
loss measured every few hundred steps) leave its streak untouched instead of clearing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stabletrain_agent.contract.detection import (
    BaselineConfig,
    CustomSignalConfig,
    ThresholdKind,
)
from stabletrain_agent.signals.baseline import Baseline
from stabletrain_agent.signals.streak import Streak


@dataclass(frozen=True)
class CustomReading:
    value: float
    baseline: float | None
    anomalous: bool
    threshold: float
    """In the series' own unit: the absolute bound, or ratio x baseline for RelativeJump."""
    consecutive: int
    onset_step: int | None
    sustained: bool


class CustomDetector:
    """Judges one custom series by its configured threshold kind."""

    def __init__(self, config: CustomSignalConfig, baseline: BaselineConfig) -> None:
        self._config = config
        self._baseline_config = baseline
        self._baseline = Baseline(baseline.ema_factor, baseline.window, baseline.min_samples)
        self._streak = Streak()
        self.last: CustomReading | None = None
        """The latest judged reading: a step that does not report the series still stands
        by it, so a sparse series that is anomalous keeps firing between its reports."""

    @property
    def config(self) -> CustomSignalConfig:
        return self._config

    @property
    def baseline(self) -> float | None:
        return self._baseline.ema

    def retune(self, config: CustomSignalConfig, baseline: BaselineConfig) -> None:
        self._baseline.retune(baseline.ema_factor, baseline.window, baseline.min_samples)
        self._config = config
        self._baseline_config = baseline

    def observe(self, step: int, value: float) -> CustomReading | None:
        """None when the step is not judged (non-finite, warm-up, baseline still filling)."""
        config = self._config
        relative = config.kind is ThresholdKind.RELATIVE_JUMP
        if not math.isfinite(value) or step < self._baseline_config.warmup_steps:
            self.last = None
            return None
        ema = self._baseline.ema
        if relative and (ema is None or not self._baseline.ready):
            self._baseline.accept(value)
            self.last = None
            return None
        anomalous = config.breached(value, ema)
        if anomalous:
            self._streak.hit(step)
        else:
            self._streak.clear()
            self._baseline.accept(value)
        threshold = config.threshold * ema if relative and ema is not None else config.threshold
        self.last = CustomReading(
            value=value,
            baseline=ema,
            anomalous=anomalous,
            threshold=threshold,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=self._streak.count >= config.consecutive_steps,
        )
        return self.last

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self._baseline.state_dict(), "streak": self._streak.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._baseline.load_state_dict(state["baseline"])
        self._streak.load_state_dict(state["streak"])
