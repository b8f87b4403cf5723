"""A detector of the user's runs in the monitor like a built-in one: it fires, trips,
retunes with the directives and keeps its state across a checkpoint; one that claims a
built-in signal or fires a name outside `custom:` is refused, naming it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from stabletrain_contract.detection import CustomSignalConfig, DetectionConfig, ThresholdKind
from stabletrain_contract.names import AnomalyClass, Signal, custom_signal
from stabletrain_contract.signals.finding import Finding
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation
from stabletrain_contract.signals.monitored import NOTHING_FIRED, MonitoredSignal

PLATEAU = custom_signal("loss_plateau")


class LossPlateau(MonitoredSignal):
    """Fires when the loss moved less than the entry's threshold for its consecutive steps."""

    fires = frozenset[Signal]()

    def __init__(self, signal: str = PLATEAU) -> None:
        self.signal = signal
        self.entry: CustomSignalConfig | None = None
        self.last: float | None = None
        self.flat = 0

    def observe(self, obs: StepObservation) -> Sequence[Finding]:
        entry = self.entry
        moved = None if self.last is None else abs(obs.loss - self.last)
        self.last = obs.loss
        if entry is None or moved is None or moved >= entry.threshold:
            self.flat = 0
            return NOTHING_FIRED
        self.flat += 1
        return (
            Finding(
                signal=self.signal,
                anomaly_class=AnomalyClass.DIVERGENCE,
                value=moved,
                threshold=entry.threshold,
                onset_step=obs.step - self.flat + 1,
                consecutive=self.flat,
                sustained=self.flat >= entry.consecutive_steps,
                evidence=f"loss moved {moved:.3g} for {self.flat} steps",
            ),
        )

    def retune(self, config: DetectionConfig) -> None:
        self.entry = next((c for c in config.custom if c.signal == PLATEAU), None)

    def save(self, state: dict[str, Any]) -> None:
        state["loss_plateau"] = {"last": self.last, "flat": self.flat}

    def load(self, state: dict[str, Any]) -> None:
        saved = state["loss_plateau"]
        self.last, self.flat = saved["last"], int(saved["flat"])


def config() -> DetectionConfig:
    entry = CustomSignalConfig(
        name="loss_plateau", kind=ThresholdKind.BELOW, threshold=0.01, consecutive_steps=3
    )
    return DetectionConfig(custom=(entry,))


def step(n: int, loss: float) -> StepObservation:
    return StepObservation(
        step=n, loss=loss, grad_norm=1.0, lr=0.1, tokens_per_second=None,
        checkpoint_in_flight=False, steps_since_start=n,
    )  # fmt: skip


def test_a_user_detector_fires_trips_and_keeps_its_state() -> None:
    detector = LossPlateau()
    monitor = SignalMonitor(DetectionConfig(), (PLATEAU,), detectors=(detector,))
    monitor.reconfigure(config(), (PLATEAU,))  # the directives define its entry
    verdicts = [monitor.observe(step(n, 2.0)) for n in range(1, 5)]
    assert [v.trip for v in verdicts] == [False, False, False, True]
    assert verdicts[-1].tripping[0].signal == PLATEAU
    assert verdicts[-1].tripping[0].onset_step == 2

    saved = monitor.state_dict()
    assert saved["loss_plateau"] == {"last": 2.0, "flat": 3}
    detector.flat = 0
    monitor.load_state_dict(saved)
    assert detector.flat == 3


def test_a_user_detector_may_not_claim_a_built_in_signal() -> None:
    class Impostor(LossPlateau):
        fires = frozenset({Signal.LOSS_SPIKE})

    with pytest.raises(ValueError, match="Impostor claims built-in signals \\(LossSpike\\)"):
        SignalMonitor(config(), (), detectors=(Impostor(),))


@pytest.mark.parametrize("name", ["LossSpike", "loss_plateau"])
def test_a_user_finding_outside_custom_names_is_refused(name: str) -> None:
    monitor = SignalMonitor(config(), (), detectors=(LossPlateau(signal=name),))
    monitor.reconfigure(config(), ())
    monitor.observe(step(1, 2.0))
    with pytest.raises(ValueError, match=f"LossPlateau fired '{name}'"):
        monitor.observe(step(2, 2.0))


class SavesUnderLoss(LossPlateau):
    """A detector that picked a key the built-in spike signals save under."""

    def save(self, state: dict[str, Any]) -> None:
        state["loss"] = {"last": self.last, "flat": self.flat}


def test_a_detector_saving_under_a_key_another_signal_uses_is_refused() -> None:
    with pytest.raises(ValueError, match=r"SavesUnderLoss saves its state under 'loss', which "
                       r"LossAndGradNormSpikes uses already"):  # fmt: skip
        SignalMonitor(config(), (PLATEAU,), detectors=(SavesUnderLoss(),))
    with pytest.raises(ValueError, match=r"LossPlateau saves its state under 'loss_plateau', "
                       r"which LossPlateau uses already"):  # fmt: skip
        SignalMonitor(config(), (PLATEAU,), detectors=(LossPlateau(), LossPlateau()))


def test_a_checkpoint_from_before_a_detector_was_added_still_restores_the_built_in_signals() -> (
    None
):
    """The loop adds a detector and resumes from a checkpoint without its key: the built-in
    signals get their state back, the newcomer keeps its own (fresh in a process that just
    started); a missing key every version-1 state has is still refused."""
    before = SignalMonitor(config(), (PLATEAU,))
    for n in range(150):
        before.observe(step(n, 2.0 + 0.1 * (n % 3)))
    state = before.state_dict()
    after = SignalMonitor(config(), (PLATEAU,), detectors=(LossPlateau(),))
    after.load_state_dict(state)
    restored = after.state_dict()
    assert {k: restored[k] for k in state} == state
    assert restored["loss_plateau"] == {"last": None, "flat": 0}
    broken = {k: v for k, v in state.items() if k != "throughput"}
    with pytest.raises(ValueError, match="throughput"):
        after.load_state_dict(broken)
