"""NaN or Inf in the loss or the grad norm: the one signal that also gates the update.

It has no baseline (any non-finite value is anomalous), only a run of such steps; a lone
overflow step is routine under dynamic loss scaling, a run of them means the state broke.
Whatever the run length, the step's update must not reach the weights, so the monitor asks
this signal, not the findings, whether to skip it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.signals.finding import Finding
from stabletrain_contract.signals.monitored import NOTHING_FIRED, MonitoredSignal
from stabletrain_contract.signals.step_observation import StepObservation
from stabletrain_contract.signals.streak import Streak


class NonFiniteValues(MonitoredSignal):
    """Counts runs of steps whose loss or grad norm is not finite."""

    fires = frozenset({Signal.NON_FINITE})

    def __init__(self, config: DetectionConfig) -> None:
        self._config = config.non_finite
        self._streak = Streak()
        self._total = 0

    @property
    def skip_update(self) -> bool:
        """The step just observed was non-finite (every step either extends or ends the run)."""
        return self._streak.count > 0

    @property
    def total(self) -> int:
        """Non-finite steps since training began, restarts included."""
        return self._total

    def observe(self, obs: StepObservation) -> Sequence[Finding]:
        if math.isfinite(obs.loss) and (obs.grad_norm is None or math.isfinite(obs.grad_norm)):
            self._streak.clear()  # the usual step, without building the list below
            return NOTHING_FIRED
        bad = [
            (name, value)
            for name, value in (("loss", obs.loss), ("grad norm", obs.grad_norm))
            if value is not None and not math.isfinite(value)
        ]
        if not bad:
            self._streak.clear()
            return NOTHING_FIRED
        self._streak.hit(obs.step)
        self._total += 1
        onset = self._streak.onset
        assert onset is not None  # set by hit()
        required = self._config.consecutive_steps
        described = " and ".join(f"{name} is {value}" for name, value in bad)
        finding = Finding(
            signal=Signal.NON_FINITE.value,
            anomaly_class=AnomalyClass.NUMERICAL,
            value=bad[0][1],
            threshold=math.inf,
            onset_step=onset,
            consecutive=self._streak.count,
            sustained=self._streak.count >= required,
            evidence=(
                f"{described} at step {obs.step}; {self._streak.count} non-finite "
                f"step(s) in a row since step {onset} ({required} count as sustained); "
                "the update was not applied"
            ),
        )
        return (finding,)

    def retune(self, config: DetectionConfig) -> None:
        self._config = config.non_finite

    def save(self, state: dict[str, Any]) -> None:
        state["non_finite"] = self._streak.state_dict()
        state["non_finite_total"] = self._total

    def load(self, state: dict[str, Any]) -> None:
        self._streak.load_state_dict(state["non_finite"])
        self._total = int(state["non_finite_total"])
