"""``LossSpike`` and ``GradNormSpike``: one signal pair, because each explains the other.

A loss spike's class depends on what the grad norm did in the steps before it (leading,
climbing with it, recurring), so both series are judged here, the grad norm first, and the
short history the attribution reads is kept next to them and saved with them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import Signal
from stabletrain_contract.signals.attribution import (
    RECURRENCE_STEPS,
    Attribution,
    StepRecord,
    attribute_grad_norm_spike,
    attribute_loss_spike,
)
from stabletrain_contract.signals.finding import Finding, onset_of
from stabletrain_contract.signals.monitored import MonitoredSignal
from stabletrain_contract.signals.spike import SpikeDetector, SpikeReading
from stabletrain_contract.signals.step_observation import StepObservation
from stabletrain_contract.signals.streak import Streak


class LossAndGradNormSpikes(MonitoredSignal):
    """Upward spikes of the loss and of the pre-clip grad norm, with their likely cause."""

    fires = frozenset({Signal.LOSS_SPIKE, Signal.GRAD_NORM_SPIKE})

    def __init__(self, config: DetectionConfig) -> None:
        self._loss = SpikeDetector(config.loss_spike, config.baseline)
        self._grad_norm = SpikeDetector(config.grad_norm_spike, config.baseline)
        self._history: deque[StepRecord] = deque(maxlen=RECURRENCE_STEPS)
        self._loss_judged = False

    @property
    def loss_judged(self) -> bool:
        """The last step's loss was judged (outside warm-up, finite, baseline seeded)."""
        return self._loss_judged

    @property
    def loss_streak(self) -> Streak:
        return self._loss.streak

    @property
    def loss_baseline(self) -> float | None:
        return self._loss.baseline

    @property
    def grad_norm_baseline(self) -> float | None:
        return self._grad_norm.baseline

    def observe(self, obs: StepObservation) -> Sequence[Finding]:
        grad = None if obs.grad_norm is None else self._grad_norm.observe(obs.step, obs.grad_norm)
        grad_anomalous = grad is not None and grad.anomalous
        record = StepRecord(
            step=obs.step,
            loss=obs.loss,
            lr=obs.lr,
            grad_anomalous=grad_anomalous,
            grad_onset=grad is not None and grad.anomalous and grad.consecutive == 1,
        )
        self._history.append(record)
        fired: list[Finding] = []
        if grad is not None and grad.anomalous:
            attribution = attribute_grad_norm_spike(record, self._history)
            fired.append(_finding(Signal.GRAD_NORM_SPIKE, "grad norm", grad, attribution))
        loss = self._loss.observe(obs.step, obs.loss)
        self._loss_judged = loss.judged
        if loss.anomalous:
            attribution = attribute_loss_spike(onset_of(loss), record, self._history)
            fired.append(_finding(Signal.LOSS_SPIKE, "loss", loss, attribution))
        return fired

    def retune(self, config: DetectionConfig) -> None:
        self._loss.retune(config.loss_spike, config.baseline)
        self._grad_norm.retune(config.grad_norm_spike, config.baseline)

    def save(self, state: dict[str, Any]) -> None:
        state["loss"] = self._loss.state_dict()
        state["grad_norm"] = self._grad_norm.state_dict()
        state["history"] = [r._asdict() for r in self._history]

    def load(self, state: dict[str, Any]) -> None:
        self._loss.load_state_dict(state["loss"])
        self._grad_norm.load_state_dict(state["grad_norm"])
        self._history.extend(StepRecord(**r) for r in state["history"])


def _finding(
    signal: Signal, series: str, reading: SpikeReading, attribution: Attribution
) -> Finding:
    """Loss and grad-norm spikes report the same way; only the series and its cause differ."""
    evidence = f"{series} {_versus(reading)}; {attribution.evidence}"
    return Finding.of(signal.value, attribution.anomaly_class, reading, evidence)


def _versus(reading: SpikeReading) -> str:
    ratio = "" if reading.ratio is None else f" = {reading.ratio:.2f}x"
    zscore = "" if reading.zscore is None else f", robust z {reading.zscore:.1f}"
    return (
        f"{reading.value:.4g} vs healthy baseline {reading.baseline:.4g}{ratio}{zscore}, "
        f"{reading.consecutive} step(s) since step {reading.onset_step}"
    )
