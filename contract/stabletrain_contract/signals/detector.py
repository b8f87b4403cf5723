"""What every baseline detector shares: its healthy baseline, its run of anomalous steps,
live retuning and checkpointed state.

The spike, throughput and custom detectors differ only in how one value is judged; the
hygiene around the judgement is the part that must never drift between them. An anomalous
value extends the run and stays out of the baseline (else a spike drags "normal" up and
hides its own continuation); a healthy one ends the run and is learned. Warm-up steps and
non-finite values are neither judged nor learned. A live directive changes the bounds but
keeps what was learned, and a checkpoint restores both the baseline and the run.
"""

from __future__ import annotations

import math
from typing import Any, Generic, TypeVar

from stabletrain_contract.detection import BaselineConfig
from stabletrain_contract.signals.baseline import Baseline
from stabletrain_contract.signals.streak import Streak

RuleT = TypeVar("RuleT")
"""The contract's threshold model of one detector kind (SpikeConfig, ThroughputConfig, ...)."""


class Detector(Generic[RuleT]):
    """One series judged against its own healthy baseline under a rule of type ``RuleT``."""

    def __init__(self, rule: RuleT, baseline: BaselineConfig) -> None:
        self._rule = rule
        self._baseline_config = baseline
        self._baseline = Baseline(baseline.ema_factor, baseline.window, baseline.min_samples)
        self._streak = Streak()

    @property
    def rule(self) -> RuleT:
        return self._rule

    @property
    def baseline(self) -> float | None:
        return self._baseline.ema

    @property
    def streak(self) -> Streak:
        return self._streak

    def retune(self, rule: RuleT, baseline: BaselineConfig) -> None:
        """New bounds from a live directive; the healthy values learned so far are kept."""
        self._baseline.retune(baseline.ema_factor, baseline.window, baseline.min_samples)
        self._rule = rule
        self._baseline_config = baseline

    def _ignored(self, step: int, value: float) -> bool:
        """Neither judged nor learned: a non-finite value, or a step inside the warm-up."""
        return not math.isfinite(value) or step < self._baseline_config.warmup_steps

    def _record(self, step: int, value: float, *, anomalous: bool) -> None:
        """An anomalous value extends the run and stays out of the baseline; a healthy one
        ends the run and is learned."""
        if anomalous:
            self._streak.hit(step)
        else:
            self._streak.clear()
            self._baseline.accept(value)

    def _sustained(self, consecutive_steps: int) -> bool:
        return self._streak.count >= consecutive_steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "baseline": self._baseline.state_dict(),
            "streak": self._streak.state_dict(),
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._baseline.load_state_dict(state["baseline"])
        self._streak.load_state_dict(state["streak"])
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        """What a detector remembers beyond its baseline and run (none by default)."""
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``_extra_state`` saved."""
