"""User-named series (validation loss, MoE aux loss, policy entropy, reward, ...).

The training loop knows signals stabletrain cannot compute; it reports them by name and
the directives say how each one reads. Steps that do not report a series (a validation
loss measured every few hundred steps) leave its streak untouched instead of clearing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stabletrain_contract.detection import (
    BaselineConfig,
    CustomSignalConfig,
    DetectionConfig,
    ThresholdKind,
)
from stabletrain_contract.names import Signal
from stabletrain_contract.signals.detector import Detector
from stabletrain_contract.signals.finding import Finding, onset_of
from stabletrain_contract.signals.monitored import NOTHING_FIRED, MonitoredSignal
from stabletrain_contract.signals.step_observation import StepObservation


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


class CustomDetector(Detector[CustomSignalConfig]):
    """Judges one custom series by its configured threshold kind."""

    def __init__(self, config: CustomSignalConfig, baseline: BaselineConfig) -> None:
        super().__init__(config, baseline)
        self.last: CustomReading | None = None
        """The latest judged reading: a step that does not report the series still stands
        by it, so a sparse series that is anomalous keeps firing between its reports."""

    def observe(self, step: int, value: float) -> CustomReading | None:
        """None when the step is not judged (non-finite, warm-up, baseline still filling)."""
        config = self._rule
        relative = config.kind is ThresholdKind.RELATIVE_JUMP
        if self._ignored(step, value):
            self.last = None
            return None
        ema = self._baseline.ema
        if relative and (ema is None or not self._baseline.ready):
            self._baseline.accept(value)
            self.last = None
            return None
        anomalous = config.breached(value, ema)
        self._record(step, value, anomalous=anomalous)
        threshold = config.threshold * ema if relative and ema is not None else config.threshold
        self.last = CustomReading(
            value=value,
            baseline=ema,
            anomalous=anomalous,
            threshold=threshold,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=self._sustained(config.consecutive_steps),
        )
        return self.last


class CustomSignals(MonitoredSignal):
    """Every ``custom:<name>`` signal the directives define, one detector each.

    A live directive may add or drop entries: kept ones keep their baselines, new ones
    start fresh, and a checkpoint's entries that are no longer configured are dropped.
    """

    fires = frozenset[Signal]()

    def __init__(self, config: DetectionConfig) -> None:
        self._detectors = {c.name: CustomDetector(c, config.baseline) for c in config.custom}

    def observe(self, obs: StepObservation) -> Sequence[Finding]:
        if not self._detectors:
            return NOTHING_FIRED
        findings = []
        for detector in self._detectors.values():
            value = obs.custom.get(detector.rule.metric_key)
            reading = detector.last if value is None else detector.observe(obs.step, value)
            if reading is not None and reading.anomalous:
                findings.append(_finding(detector.rule, reading))
        return findings

    def retune(self, config: DetectionConfig) -> None:
        kept = {}
        for custom in config.custom:
            detector = self._detectors.get(custom.name)
            if detector is None:
                detector = CustomDetector(custom, config.baseline)
            else:
                detector.retune(custom, config.baseline)
            kept[custom.name] = detector
        self._detectors = kept

    def save(self, state: dict[str, Any]) -> None:
        state["custom"] = {name: d.state_dict() for name, d in self._detectors.items()}

    def load(self, state: dict[str, Any]) -> None:
        for name, saved in state["custom"].items():
            if name in self._detectors:
                self._detectors[name].load_state_dict(saved)


def _finding(config: CustomSignalConfig, reading: CustomReading) -> Finding:
    onset = onset_of(reading)
    evidence = (
        f"{config.metric_key} = {reading.value:.4g}, {config.kind.value} bound "
        f"{reading.threshold:.4g}, {reading.consecutive} step(s) since step {onset}"
    )
    return Finding.of(config.signal, config.anomaly_class, reading, evidence)
