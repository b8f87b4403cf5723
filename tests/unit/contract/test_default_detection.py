"""The default thresholds against public logbook spikes, using only the contract's arithmetic.

The reference loop below is the smallest faithful reading of DetectionConfig: warm-up
steps are ignored, the EMA learns from healthy steps only, a step is anomalous when the
ratio rule fires, and a spike trips once it has lasted `consecutive_steps`.
"""

from __future__ import annotations

import math

import pytest

from stabletrain_contract.detection import (
    CustomSignalConfig,
    DetectionConfig,
    LossSpikeConfig,
    SpikeConfig,
    ThresholdKind,
    ThroughputConfig,
)
from stabletrain_contract.names import AGENT_SIGNALS, Signal


def healthy_losses(level: float, steps: int) -> list[float]:
    """A flat loss with +-2% deterministic wiggle, the texture of a real curve late in training."""
    return [level * (1.0 + 0.02 * math.sin(1.7 * i)) for i in range(steps)]


def first_trip_step(config: DetectionConfig, losses: list[float]) -> int | None:
    baseline: float | None = None
    accepted = 0
    streak = 0
    for step, loss in enumerate(losses):
        if step < config.baseline.warmup_steps:
            continue
        if baseline is None or accepted < config.baseline.min_samples:
            baseline = config.baseline.next_ema(baseline, loss)
            accepted += 1
            continue
        if config.loss_spike.ratio_breached(loss, baseline):
            streak += 1
            if streak >= config.loss_spike.consecutive_steps:
                return step
        else:
            streak = 0
            baseline = config.baseline.next_ema(baseline, loss)
            accepted += 1
    return None


LOGBOOK_SPIKES = [
    pytest.param(2.20, 5.10, id="BLOOM-176B step 31219: 2.20->5.10"),
    pytest.param(6.44, 11.42, id="BigScience 104B: 6.44->11.42"),
    pytest.param(2.77, 7.34, id="BigScience 13B: 2.77->7.34"),
]


@pytest.mark.parametrize(("before", "during"), LOGBOOK_SPIKES)
def test_default_trips_on_sustained_logbook_spike(before: float, during: float) -> None:
    config = DetectionConfig()
    onset = 400
    losses = healthy_losses(before, onset) + [during] * 50
    assert first_trip_step(config, losses) == onset + config.loss_spike.consecutive_steps - 1


@pytest.mark.parametrize(("before", "during"), LOGBOOK_SPIKES)
def test_logbook_spike_for_fewer_steps_than_required_does_not_trip(
    before: float, during: float
) -> None:
    config = DetectionConfig()
    short = config.loss_spike.consecutive_steps - 1
    losses = healthy_losses(before, 400) + [during] * short + healthy_losses(before, 200)
    assert first_trip_step(config, losses) is None


def test_default_ignores_one_step_outliers_of_one_and_a_half_times() -> None:
    config = DetectionConfig()
    losses = healthy_losses(2.2, 2000)
    for step in range(300, 2000, 97):
        losses[step] = 1.5 * 2.2
    assert first_trip_step(config, losses) is None
    assert not config.loss_spike.ratio_breached(1.5 * 2.2, 2.2)


def test_default_ignores_the_steep_fall_of_the_first_steps() -> None:
    config = DetectionConfig()
    losses = [11.0 * math.exp(-i / 30) + 2.5 for i in range(100)] + healthy_losses(2.5, 500)
    assert first_trip_step(config, losses) is None


def test_stricter_config_would_miss_the_smallest_logbook_ratio() -> None:
    """Guards the calibration: llm-foundry's 2x would miss BigScience 104B (ratio 1.77)."""
    config = DetectionConfig(loss_spike=LossSpikeConfig(ratio=2.0, consecutive_steps=4))
    losses = healthy_losses(6.44, 400) + [11.42] * 50
    assert first_trip_step(config, losses) is None


def test_ema_factor_weights_the_newest_value() -> None:
    config = DetectionConfig()
    assert config.baseline.next_ema(None, 3.0) == 3.0
    assert config.baseline.next_ema(2.0, 3.0) == pytest.approx(2.02)


def test_zscore_rule_and_ratio_rule_are_alternatives() -> None:
    rule = SpikeConfig(ratio=None, zscore=6.0)
    assert not rule.ratio_breached(100.0, 1.0)
    assert rule.zscore_breached(6.0)
    assert not rule.zscore_breached(5.9)
    with pytest.raises(ValueError, match="ratio, zscore or both"):
        SpikeConfig(ratio=None, zscore=None)


def test_throughput_drop_respects_grace_after_restart_or_save() -> None:
    rule = ThroughputConfig()
    assert not rule.drop_breached(400.0, 1000.0, steps_since_event=rule.grace_steps - 1)
    assert rule.drop_breached(400.0, 1000.0, steps_since_event=rule.grace_steps)
    assert not rule.drop_breached(600.0, 1000.0, steps_since_event=10_000)


@pytest.mark.parametrize(
    ("kind", "threshold", "value", "baseline", "fires"),
    [
        (ThresholdKind.ABOVE, 3.2, 3.2, None, True),
        (ThresholdKind.ABOVE, 3.2, 3.1, None, False),
        (ThresholdKind.BELOW, 0.5, 0.4, None, True),
        (ThresholdKind.BELOW, 0.5, 0.6, None, False),
        (ThresholdKind.RELATIVE_JUMP, 1.3, 1.4, 1.0, True),
        (ThresholdKind.RELATIVE_JUMP, 1.3, 1.2, 1.0, False),
        (ThresholdKind.RELATIVE_JUMP, 1.3, 1.4, None, False),
    ],
)
def test_custom_signal_threshold_kinds(
    kind: ThresholdKind, threshold: float, value: float, baseline: float | None, fires: bool
) -> None:
    signal = CustomSignalConfig(name="val_loss", kind=kind, threshold=threshold)
    assert signal.breached(value, baseline) is fires
    assert signal.signal == "custom:val_loss"


def test_relative_jump_threshold_must_be_a_ratio_above_one() -> None:
    with pytest.raises(ValueError, match="must exceed 1"):
        CustomSignalConfig(name="reward", kind=ThresholdKind.RELATIVE_JUMP, threshold=0.9)


def test_duplicate_custom_signal_names_are_refused() -> None:
    twice = [{"name": "entropy", "kind": "Below", "threshold": 0.5}] * 2
    with pytest.raises(ValueError, match="'entropy' is defined twice"):
        DetectionConfig.model_validate({"custom": twice})


def test_each_signal_waits_its_own_consecutive_steps_after_the_onset() -> None:
    """A rollback is confirmed past onset + this window; an agent signal whose config named
    no SIGNAL would get 0 and confirm at the onset, before its detector could trip again."""
    fields = {
        Signal.LOSS_SPIKE: "lossSpike",
        Signal.GRAD_NORM_SPIKE: "gradNormSpike",
        Signal.NON_FINITE: "nonFinite",
        Signal.THROUGHPUT_DROP: "throughput",
    }
    assert set(fields) == AGENT_SIGNALS
    steps = {signal: 5 + n for n, signal in enumerate(fields)}
    custom = {"name": "val_loss", "kind": "Above", "threshold": 3.0, "consecutiveSteps": 11}
    detection = DetectionConfig.model_validate(
        {**{fields[s]: {"consecutiveSteps": n} for s, n in steps.items()}, "custom": [custom]}
    )
    assert {s: detection.detection_window(s) for s in fields} == steps
    assert detection.detection_window("custom:val_loss") == 11
    assert detection.detection_window(Signal.STALLED) == 0, "the operator's own: no onset"
