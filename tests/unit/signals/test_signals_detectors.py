"""The building blocks on their own: baseline hygiene, spike rules, throughput excuses."""

from __future__ import annotations

import math
import random

import pytest

from stabletrain_contract.detection import BaselineConfig, SpikeConfig, ThroughputConfig
from stabletrain_contract.signals.baseline import Baseline
from stabletrain_contract.signals.spike import SpikeDetector
from stabletrain_contract.signals.throughput import ThroughputDetector


def _detector(
    ratio: float | None = 1.5,
    zscore: float | None = None,
    warmup_steps: int = 10,
    min_samples: int = 20,
) -> SpikeDetector:
    return SpikeDetector(
        SpikeConfig(ratio=ratio, zscore=zscore, consecutive_steps=3),
        BaselineConfig(
            ema_factor=0.05, window=64, min_samples=min_samples, warmup_steps=warmup_steps
        ),
    )


def test_baseline_refuses_non_finite_values() -> None:
    baseline = Baseline(ema_factor=0.1, window=8, min_samples=1)
    with pytest.raises(ValueError, match="finite"):
        baseline.accept(math.nan)
    assert baseline.ema is None


def test_robust_zscore_ignores_one_outlier_in_the_window() -> None:
    baseline = Baseline(ema_factor=0.1, window=9, min_samples=1)
    for value in [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 50.0, 1.02]:
        baseline.accept(value)
    zscore = baseline.robust_zscore(1.3)
    assert zscore is not None
    assert zscore > 3.0  # a plain standard deviation would be inflated to ~16 by the 50


def test_warmup_steps_are_neither_judged_nor_learned() -> None:
    detector = _detector(warmup_steps=10, min_samples=1)
    for step in range(10):
        reading = detector.observe(step, 100.0)
        assert not reading.judged
    assert detector.baseline is None
    detector.observe(10, 2.0)
    assert detector.baseline == 2.0


def test_anomalous_values_never_enter_the_baseline() -> None:
    detector = _detector(warmup_steps=0, min_samples=5)
    for step in range(50):
        detector.observe(step, 2.0)
    for step in range(50, 80):
        reading = detector.observe(step, 5.0)
        assert reading.anomalous
    assert detector.baseline == pytest.approx(2.0)
    assert reading.onset_step == 50
    assert reading.consecutive == 30


def test_zscore_rule_fires_where_the_ratio_rule_would_not() -> None:
    rng = random.Random(7)
    detector = _detector(ratio=None, zscore=6.0, warmup_steps=0, min_samples=32)
    for step in range(200):
        detector.observe(step, 3.0 + rng.gauss(0.0, 0.01))
    reading = detector.observe(200, 3.3)  # 1.1x: far inside the ratio band, 30 sigma out
    assert reading.anomalous
    assert reading.zscore is not None
    assert reading.zscore > 6.0
    assert reading.threshold is not None
    assert 3.0 < reading.threshold < 3.3


def _throughput() -> ThroughputDetector:
    return ThroughputDetector(
        ThroughputConfig(drop_fraction=0.5, grace_steps=5, consecutive_steps=3),
        BaselineConfig(ema_factor=0.1, window=16, min_samples=5, warmup_steps=0),
    )


def _feed(detector: ThroughputDetector, step: int, value: float, since_start: int) -> bool:
    reading = detector.observe(
        step, value, steps_since_start=since_start, checkpoint_in_flight=False
    )
    return reading.anomalous


def test_throughput_grace_follows_restart_and_save_then_a_real_drop_counts() -> None:
    detector = _throughput()
    for step in range(5):
        reading = detector.observe(step, 10.0, steps_since_start=step, checkpoint_in_flight=False)
        assert reading.excused_by is not None
        assert "start" in reading.excused_by
    for step in range(5, 40):
        assert not _feed(detector, step, 1000.0, since_start=step)
    saving = detector.observe(40, 100.0, steps_since_start=40, checkpoint_in_flight=True)
    assert not saving.judged
    for step in range(41, 45):
        after_save = detector.observe(
            step, 200.0, steps_since_start=step, checkpoint_in_flight=False
        )
        assert not after_save.judged
        assert after_save.excused_by is not None
        assert "after a checkpoint save" in after_save.excused_by
    assert detector.baseline == pytest.approx(1000.0)
    assert not _feed(detector, 45, 990.0, since_start=45)
    drops = [_feed(detector, step, 300.0, since_start=step) for step in range(46, 49)]
    assert drops == [True, True, True]


def test_state_dict_round_trip_continues_identically() -> None:
    rng = random.Random(3)
    values = [2.0 + rng.gauss(0.0, 0.05) for _ in range(120)] + [4.5] * 5
    first = _detector(zscore=6.0)
    for step, value in enumerate(values[:100]):
        first.observe(step, value)
    second = _detector(zscore=6.0)
    second.load_state_dict(first.state_dict())
    for step, value in enumerate(values[100:], start=100):
        assert first.observe(step, value) == second.observe(step, value)


def test_a_spike_while_the_baseline_seeds_is_judged_and_not_learned() -> None:
    detector = _detector(warmup_steps=10, min_samples=20)
    for step in range(10, 15):
        assert not detector.observe(step, 2.0).anomalous
    assert detector.observe(15, 2.0).judged, "judged against the seeds' median (2.0)"
    readings = [detector.observe(step, 6.0) for step in range(15, 19)]
    assert all(r.judged and r.anomalous for r in readings)
    assert readings[-1].onset_step == 15
    assert readings[2].sustained, "three steps at 3x the seeds' median are a sustained spike"
    assert readings[0].baseline == 2.0
    for step in range(19, 40):
        detector.observe(step, 2.0)
    assert detector.baseline == pytest.approx(2.0)


def test_seeds_that_slipped_in_before_the_median_meant_anything_are_dropped() -> None:
    detector = _detector(warmup_steps=0, min_samples=5)
    # The first seeds are a spike: nothing to compare them with yet, so they are taken...
    for step, value in enumerate([6.0, 6.0, 2.0, 2.0, 2.0]):
        detector.observe(step, value)
    # ...and the full baseline re-examines them against its median (2.0) and drops them.
    assert detector.baseline is not None
    assert detector.baseline < 2.5
    detector.observe(5, 2.0)  # two seeds dropped: the baseline fills again
    detector.observe(6, 2.0)
    assert detector.baseline == pytest.approx(2.0)
    assert detector.observe(7, 3.5).anomalous


def test_seeding_state_survives_a_round_trip() -> None:
    detector = _detector(warmup_steps=0, min_samples=10)
    for step, value in enumerate([2.0, 2.1, 1.9, 2.0]):
        detector.observe(step, value)
    restored = _detector(warmup_steps=0, min_samples=10)
    restored.load_state_dict(detector.state_dict())
    assert restored.observe(4, 6.0).anomalous


@pytest.mark.parametrize("factor", [0.02, 0.5])
def test_the_baseline_ema_moves_by_the_configured_factor(factor: float) -> None:
    config = BaselineConfig(ema_factor=factor, window=8, min_samples=1, warmup_steps=0)
    detector = SpikeDetector(SpikeConfig(ratio=10.0, consecutive_steps=3), config)
    expected = None
    for step, value in enumerate([2.0, 2.4, 1.8, 2.2]):
        detector.observe(step, value)
        expected = config.next_ema(expected, value)
    assert detector.baseline == pytest.approx(expected)
