"""The per-step seam between the torch guard and the torch-free detectors.

The guard hands over plain host numbers that every rank already agrees on, so the
monitor's verdict is identical on every rank without another collective. The monitor
never reads the clock or does I/O: the replay CLI feeds it a recorded run and must get
the verdicts the live run got.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from stabletrain_agent.contract.channel import FindingReport
from stabletrain_agent.contract.detection import CustomSignalConfig, DetectionConfig
from stabletrain_agent.contract.names import AnomalyClass, Signal
from stabletrain_agent.contract.trip import EVIDENCE_MAX
from stabletrain_agent.signals.attribution import (
    RECURRENCE_STEPS,
    Attribution,
    StepRecord,
    attribute_grad_norm_spike,
    attribute_loss_spike,
)
from stabletrain_agent.signals.custom import CustomDetector, CustomReading
from stabletrain_agent.signals.spike import SpikeDetector, SpikeReading
from stabletrain_agent.signals.streak import Streak
from stabletrain_agent.signals.throughput import ThroughputDetector, ThroughputReading


@dataclass(frozen=True, kw_only=True)
class StepObservation:
    """What one finished optimizer step looked like, in values all ranks agree on.

    Keyword-only, and the restart/save facts have no defaults: a forgotten
    ``steps_since_start`` would read as "just restarted" forever and silence the
    throughput detector.
    """

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
    checkpoint_in_flight: bool
    """A save ran during this step, so a throughput dip is expected and not a fault."""
    steps_since_start: int
    """Steps since this process (re)started, 0 on the first; those are slow while caches warm."""


@dataclass(frozen=True)
class Finding:
    """One signal firing at one step, with the evidence a person needs to trust it."""

    signal: str
    """Signal name as the directives' trip list spells it (``LossSpike``, ``custom:<name>``)."""
    anomaly_class: AnomalyClass
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

    def to_report(self) -> FindingReport:
        """The finding as the status endpoint carries it (evidence cut to the contract's bound);
        the agent's exporter and the replay CLI both go through here, so they agree."""
        return FindingReport(
            signal=self.signal,
            anomaly_class=self.anomaly_class,
            value=self.value,
            threshold=self.threshold,
            onset_step=self.onset_step,
            consecutive=self.consecutive,
            sustained=self.sustained,
            evidence=self.evidence[:EVIDENCE_MAX],
        )


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
    anomaly_class: AnomalyClass | None
    """Class of the most recent sustained finding, None while the run looks healthy."""
    custom: Mapping[str, float] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


STATE_VERSION = 1
"""Bumped whenever the layout of ``state_dict`` changes incompatibly."""


class SignalMonitor:
    """Runs every detector on each step and turns their readings into one verdict.

    Deterministic and free of clocks and I/O: identical observations give identical
    verdicts on every rank and in the replay CLI.
    """

    def __init__(self, config: DetectionConfig, trip_on: Collection[str]) -> None:
        self._config = config
        self._trip_on = frozenset(trip_on)
        self._loss = SpikeDetector(config.loss_spike, config.baseline)
        self._grad_norm = SpikeDetector(config.grad_norm_spike, config.baseline)
        self._throughput = ThroughputDetector(config.throughput, config.baseline)
        self._custom = {c.name: CustomDetector(c, config.baseline) for c in config.custom}
        self._non_finite = Streak()
        self._non_finite_total = 0
        self._last_good_step: int | None = None
        self._history: deque[StepRecord] = deque(maxlen=RECURRENCE_STEPS)
        self._snapshot = _empty_snapshot()

    @property
    def trip_on(self) -> frozenset[str]:
        return self._trip_on

    @property
    def last_good_step(self) -> int | None:
        """Last step every judged signal found healthy; the trip report's pre-spike anchor."""
        return self._last_good_step

    def reconfigure(self, config: DetectionConfig, trip_on: Collection[str]) -> None:
        """Apply live threshold directives; learned baselines survive, as do streaks."""
        self._config = config
        self._trip_on = frozenset(trip_on)
        self._loss.retune(config.loss_spike, config.baseline)
        self._grad_norm.retune(config.grad_norm_spike, config.baseline)
        self._throughput.retune(config.throughput, config.baseline)
        kept = {}
        for custom in config.custom:
            detector = self._custom.get(custom.name)
            if detector is None:
                detector = CustomDetector(custom, config.baseline)
            else:
                detector.retune(custom, config.baseline)
            kept[custom.name] = detector
        self._custom = kept

    def observe(self, obs: StepObservation) -> Verdict:
        findings: list[Finding] = []
        non_finite = self._observe_non_finite(obs, findings)

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
        if grad is not None and grad.anomalous:
            findings.append(self._grad_norm_finding(grad, record))

        loss = self._loss.observe(obs.step, obs.loss)
        if loss.anomalous:
            findings.append(self._loss_finding(loss, record))

        throughput = None
        if obs.tokens_per_second is not None:
            throughput = self._throughput.observe(
                obs.step,
                obs.tokens_per_second,
                steps_since_start=obs.steps_since_start,
                checkpoint_in_flight=obs.checkpoint_in_flight,
            )
            if throughput.anomalous:
                findings.append(_throughput_finding(throughput))

        for detector in self._custom.values():
            value = obs.custom.get(detector.config.metric_key)
            custom = detector.last if value is None else detector.observe(obs.step, value)
            if custom is not None and custom.anomalous:
                findings.append(_custom_finding(detector.config, custom))

        if loss.judged and not findings:
            self._last_good_step = obs.step
        tripping = tuple(f for f in findings if f.sustained and f.signal in self._trip_on)
        self._snapshot = self._take_snapshot(obs, findings)
        return Verdict(
            step=obs.step,
            trip=bool(tripping),
            findings=tuple(findings),
            tripping=tripping,
            skip_update=non_finite,
        )

    def snapshot(self) -> MonitorSnapshot:
        return self._snapshot

    def _observe_non_finite(self, obs: StepObservation, findings: list[Finding]) -> bool:
        if math.isfinite(obs.loss) and (obs.grad_norm is None or math.isfinite(obs.grad_norm)):
            self._non_finite.clear()  # the usual step, without building the list below
            return False
        bad = [
            (name, value)
            for name, value in (("loss", obs.loss), ("grad norm", obs.grad_norm))
            if value is not None and not math.isfinite(value)
        ]
        if not bad:
            self._non_finite.clear()
            return False
        self._non_finite.hit(obs.step)
        self._non_finite_total += 1
        onset = self._non_finite.onset
        assert onset is not None  # set by hit()
        required = self._config.non_finite.consecutive_steps
        described = " and ".join(f"{name} is {value}" for name, value in bad)
        findings.append(
            Finding(
                signal=Signal.NON_FINITE.value,
                anomaly_class=AnomalyClass.NUMERICAL,
                value=bad[0][1],
                threshold=math.inf,
                onset_step=onset,
                consecutive=self._non_finite.count,
                sustained=self._non_finite.count >= required,
                evidence=(
                    f"{described} at step {obs.step}; {self._non_finite.count} non-finite "
                    f"step(s) in a row since step {onset} ({required} count as sustained); "
                    "the update was not applied"
                ),
            )
        )
        return True

    def _loss_finding(self, reading: SpikeReading, record: StepRecord) -> Finding:
        onset = _onset(reading)
        attribution = attribute_loss_spike(onset, record, self._history)
        return _spike_finding(Signal.LOSS_SPIKE, "loss", reading, attribution)

    def _grad_norm_finding(self, reading: SpikeReading, record: StepRecord) -> Finding:
        attribution = attribute_grad_norm_spike(record, self._history)
        return _spike_finding(Signal.GRAD_NORM_SPIKE, "grad norm", reading, attribution)

    def _take_snapshot(self, obs: StepObservation, findings: list[Finding]) -> MonitorSnapshot:
        sustained = [f for f in findings if f.sustained]
        streak = self._loss.streak
        return MonitorSnapshot(
            step=obs.step,
            loss=obs.loss,
            loss_baseline=self._loss.baseline,
            grad_norm=obs.grad_norm,
            grad_norm_baseline=self._grad_norm.baseline,
            lr=obs.lr,
            tokens_per_second=obs.tokens_per_second,
            throughput_baseline=self._throughput.baseline,
            spike_active=streak.count > 0,
            consecutive_spike_steps=streak.count,
            spike_onset_step=streak.onset,
            non_finite_total=self._non_finite_total,
            anomaly_class=sustained[0].anomaly_class if sustained else None,
            custom=dict(obs.custom),
            findings=tuple(findings),
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for checkpoints: baselines hold healthy values only."""
        return {
            "version": STATE_VERSION,
            "loss": self._loss.state_dict(),
            "grad_norm": self._grad_norm.state_dict(),
            "throughput": self._throughput.state_dict(),
            "custom": {name: d.state_dict() for name, d in self._custom.items()},
            "non_finite": self._non_finite.state_dict(),
            "non_finite_total": self._non_finite_total,
            "last_good_step": self._last_good_step,
            "history": [r._asdict() for r in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore saved state; unconfigured custom signals are dropped, new ones start fresh.

        Raises ValueError naming the problem on a state from another layout version or
        with missing/corrupt parts, leaving this monitor unchanged.
        """
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"monitor state version {version!r} is not the supported {STATE_VERSION}"
            )
        fresh = SignalMonitor(self._config, self._trip_on)
        try:
            fresh._loss.load_state_dict(state["loss"])
            fresh._grad_norm.load_state_dict(state["grad_norm"])
            fresh._throughput.load_state_dict(state["throughput"])
            for name, saved in state["custom"].items():
                if name in fresh._custom:
                    fresh._custom[name].load_state_dict(saved)
            fresh._non_finite.load_state_dict(state["non_finite"])
            fresh._non_finite_total = int(state["non_finite_total"])
            good = state["last_good_step"]
            fresh._last_good_step = None if good is None else int(good)
            fresh._history.extend(StepRecord(**r) for r in state["history"])
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"monitor state is incomplete or malformed: {error!r}") from None
        self.__dict__.update(fresh.__dict__)


def _versus(reading: SpikeReading) -> str:
    ratio = "" if reading.ratio is None else f" = {reading.ratio:.2f}x"
    zscore = "" if reading.zscore is None else f", robust z {reading.zscore:.1f}"
    return (
        f"{reading.value:.4g} vs healthy baseline {reading.baseline:.4g}{ratio}{zscore}, "
        f"{reading.consecutive} step(s) since step {reading.onset_step}"
    )


def _bound(threshold: float | None) -> float:
    return math.nan if threshold is None else threshold


def _throughput_finding(reading: ThroughputReading) -> Finding:
    onset = reading.onset_step
    assert onset is not None  # anomalous => judged, with a streak
    assert reading.baseline is not None
    return Finding(
        signal=Signal.THROUGHPUT_DROP.value,
        anomaly_class=AnomalyClass.INFRASTRUCTURE,
        value=reading.value,
        threshold=_bound(reading.threshold),
        onset_step=onset,
        consecutive=reading.consecutive,
        sustained=reading.sustained,
        evidence=(
            f"{reading.value:.4g} tokens/s vs healthy baseline {reading.baseline:.4g} for "
            f"{reading.consecutive} step(s) since step {onset}, outside restart and save grace"
        ),
    )


def _custom_finding(config: CustomSignalConfig, reading: CustomReading) -> Finding:
    onset = reading.onset_step
    assert onset is not None  # an anomalous reading has started a streak
    return Finding(
        signal=config.signal,
        anomaly_class=config.anomaly_class,
        value=reading.value,
        threshold=reading.threshold,
        onset_step=onset,
        consecutive=reading.consecutive,
        sustained=reading.sustained,
        evidence=(
            f"{config.metric_key} = {reading.value:.4g}, {config.kind.value} bound "
            f"{reading.threshold:.4g}, {reading.consecutive} step(s) since step {onset}"
        ),
    )


def _empty_snapshot() -> MonitorSnapshot:
    return MonitorSnapshot(
        step=None,
        loss=None,
        loss_baseline=None,
        grad_norm=None,
        grad_norm_baseline=None,
        lr=None,
        tokens_per_second=None,
        throughput_baseline=None,
        spike_active=False,
        consecutive_spike_steps=0,
        spike_onset_step=None,
        non_finite_total=0,
        anomaly_class=None,
    )


def _onset(reading: SpikeReading) -> int:
    onset = reading.onset_step
    assert onset is not None  # an anomalous reading has started a streak
    return onset


def _spike_finding(
    signal: Signal, series: str, reading: SpikeReading, attribution: Attribution
) -> Finding:
    """Loss and grad-norm spikes report the same way; only the series and its cause differ."""
    return Finding(
        signal=signal.value,
        anomaly_class=attribution.anomaly_class,
        value=reading.value,
        threshold=_bound(reading.threshold),
        onset_step=_onset(reading),
        consecutive=reading.consecutive,
        sustained=reading.sustained,
        evidence=f"{series} {_versus(reading)}; {attribution.evidence}",
    )
