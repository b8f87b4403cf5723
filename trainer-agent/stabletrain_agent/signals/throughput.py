"""Throughput drops: a slow node, a throttled link, a failing disk.

Two dips are expected and say nothing about the infrastructure: the first steps after
a (re)start, while allocators, kernels and data loaders warm up, and the steps during and
just after a checkpoint save, which competes for the same disks and cores. Those steps are
neither judged nor allowed into the baseline, so they cannot lower what "normal" means.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from stabletrain_agent.contract.detection import BaselineConfig, ThroughputConfig
from stabletrain_agent.signals.baseline import Baseline
from stabletrain_agent.signals.streak import Streak

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


class ThroughputDetector:
    """Judges tokens/s against its healthy baseline outside the expected dips."""

    def __init__(self, rule: ThroughputConfig, baseline: BaselineConfig) -> None:
        self._rule = rule
        self._baseline_config = baseline
        self._baseline = Baseline(baseline.ema_factor, baseline.window, baseline.min_samples)
        self._streak = Streak()
        self._steps_since_save: int | None = None

    @property
    def baseline(self) -> float | None:
        return self._baseline.ema

    def retune(self, rule: ThroughputConfig, baseline: BaselineConfig) -> None:
        self._baseline.retune(baseline.ema_factor, baseline.window, baseline.min_samples)
        self._rule = rule
        self._baseline_config = baseline

    def observe(
        self,
        step: int,
        tokens_per_second: float,
        *,
        steps_since_start: int,
        checkpoint_in_flight: bool,
    ) -> ThroughputReading:
        excuse = self._excuse(steps_since_start, checkpoint_in_flight)
        if (
            excuse is not None
            or step < self._baseline_config.warmup_steps
            or not math.isfinite(tokens_per_second)
            or tokens_per_second < 0.0
        ):
            return self._unjudged(tokens_per_second, excuse)
        ema = self._baseline.ema
        if ema is None or not self._baseline.ready:
            self._baseline.accept(tokens_per_second)
            return self._unjudged(tokens_per_second, None)
        since_event = steps_since_start
        if self._steps_since_save is not None:
            since_event = min(since_event, self._steps_since_save)
        anomalous = self._rule.drop_breached(tokens_per_second, ema, since_event)
        if anomalous:
            self._streak.hit(step)
        else:
            self._streak.clear()
            self._baseline.accept(tokens_per_second)
        return ThroughputReading(
            value=tokens_per_second,
            baseline=ema,
            judged=True,
            anomalous=anomalous,
            threshold=(1.0 - self._rule.drop_fraction) * ema,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=self._streak.count >= self._rule.consecutive_steps,
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

    def state_dict(self) -> dict[str, Any]:
        return {
            "baseline": self._baseline.state_dict(),
            "streak": self._streak.state_dict(),
            "steps_since_save": self._steps_since_save,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._baseline.load_state_dict(state["baseline"])
        self._streak.load_state_dict(state["streak"])
        since = state["steps_since_save"]
        self._steps_since_save = None if since is None else int(since)
