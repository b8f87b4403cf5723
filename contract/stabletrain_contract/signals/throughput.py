"""Throughput drops: a slow node, a throttled link, a failing disk.

Two dips are expected and say nothing about the infrastructure: the first steps after
a (re)start, while allocators, kernels and data loaders warm up, and the steps during and
just after a checkpoint save, which competes for the same disks and cores. Those steps are
neither judged nor allowed into the baseline, so they cannot lower what "normal" means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from stabletrain_contract.detection import BaselineConfig, DetectionConfig, ThroughputConfig
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.signals.detector import Detector
from stabletrain_contract.signals.finding import Finding, onset_of
from stabletrain_contract.signals.monitored import NOTHING_FIRED, MonitoredSignal
from stabletrain_contract.signals.step_observation import StepObservation

_SAVING = -1
"""Steps-since-save while a save is in flight, so the first step after it counts as 0,
matching steps_since_start, which is 0 on the first step after a (re)start."""


class ThroughputReading(NamedTuple):
    """How one step's tokens/s compares with its baseline (a tuple: one per step)."""

    value: float
    baseline: float | None
    judged: bool
    anomalous: bool
    threshold: float | None
    consecutive: int
    onset_step: int | None
    sustained: bool
    excused_by: str | None
    """Why this step was not judged ("restart", "checkpoint save"), for the evidence."""


class ThroughputDetector(Detector[ThroughputConfig]):
    """Judges tokens/s against its healthy baseline outside the expected dips."""

    def __init__(self, rule: ThroughputConfig, baseline: BaselineConfig) -> None:
        super().__init__(rule, baseline)
        self._steps_since_save: int | None = None

    def observe(
        self,
        step: int,
        tokens_per_second: float,
        *,
        steps_since_start: int,
        checkpoint_in_flight: bool,
    ) -> ThroughputReading:
        excuse = self._excuse(steps_since_start, checkpoint_in_flight)
        if excuse is not None or self._ignored(step, tokens_per_second) or tokens_per_second < 0.0:
            return self._unjudged(tokens_per_second, excuse)
        ema = self._baseline.ema
        if ema is None or not self._baseline.ready:
            self._baseline.accept(tokens_per_second)
            return self._unjudged(tokens_per_second, None)
        since_event = steps_since_start
        if self._steps_since_save is not None:
            since_event = min(since_event, self._steps_since_save)
        anomalous = self._rule.drop_breached(tokens_per_second, ema, since_event)
        self._record(step, tokens_per_second, anomalous=anomalous)
        return ThroughputReading(
            value=tokens_per_second,
            baseline=ema,
            judged=True,
            anomalous=anomalous,
            threshold=(1.0 - self._rule.drop_fraction) * ema,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=self._sustained(self._rule.consecutive_steps),
            excused_by=None,
        )

    def _excuse(self, steps_since_start: int, checkpoint_in_flight: bool) -> str | None:
        """Counts steps since the last save and names the reason a dip is expected now."""
        if checkpoint_in_flight:
            self._steps_since_save = _SAVING
            return "checkpoint save in flight"
        if self._steps_since_save is not None:
            self._steps_since_save += 1
        if steps_since_start < self._rule.grace_steps:
            return f"step {steps_since_start} after a (re)start"
        if self._steps_since_save is not None and self._steps_since_save < self._rule.grace_steps:
            return f"step {self._steps_since_save} after a checkpoint save"
        return None

    def _unjudged(self, value: float, excuse: str | None) -> ThroughputReading:
        return ThroughputReading(
            value=value,
            baseline=self._baseline.ema,
            judged=False,
            anomalous=False,
            threshold=None,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=False,
            excused_by=excuse,
        )

    def _extra_state(self) -> dict[str, Any]:
        return {"steps_since_save": self._steps_since_save}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        since = state["steps_since_save"]
        self._steps_since_save = None if since is None else int(since)


class ThroughputDrop(MonitoredSignal):
    """``ThroughputDrop``: judged on the steps that report token counts, always
    Infrastructure (a slow node is never the model's fault)."""

    fires = frozenset({Signal.THROUGHPUT_DROP})

    def __init__(self, config: DetectionConfig) -> None:
        self._detector = ThroughputDetector(config.throughput, config.baseline)

    @property
    def baseline(self) -> float | None:
        return self._detector.baseline

    def observe(self, obs: StepObservation) -> Sequence[Finding]:
        if obs.tokens_per_second is None:
            return NOTHING_FIRED
        reading = self._detector.observe(
            obs.step,
            obs.tokens_per_second,
            steps_since_start=obs.steps_since_start,
            checkpoint_in_flight=obs.checkpoint_in_flight,
        )
        if not reading.anomalous:
            return NOTHING_FIRED
        onset = onset_of(reading)
        assert reading.baseline is not None  # anomalous => judged against a baseline
        evidence = (
            f"{reading.value:.4g} tokens/s vs healthy baseline {reading.baseline:.4g} for "
            f"{reading.consecutive} step(s) since step {onset}, outside restart and save grace"
        )
        signal = Signal.THROUGHPUT_DROP.value
        return (Finding.of(signal, AnomalyClass.INFRASTRUCTURE, reading, evidence),)

    def retune(self, config: DetectionConfig) -> None:
        self._detector.retune(config.throughput, config.baseline)

    def save(self, state: dict[str, Any]) -> None:
        state["throughput"] = self._detector.state_dict()

    def load(self, state: dict[str, Any]) -> None:
        self._detector.load_state_dict(state["throughput"])
