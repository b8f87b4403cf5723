"""A custom series reported only every few steps (a validation loss) keeps its state between
reports: while its last reading is anomalous it keeps firing, so the operator's scrape of
any step sees it, and a healthy reading ends it."""

from __future__ import annotations

from stabletrain_contract.detection import (
    BaselineConfig,
    CustomSignalConfig,
    DetectionConfig,
    ThresholdKind,
)
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation

SIGNAL = "custom:val_high"


def observe(monitor: SignalMonitor, step: int, val: float | None) -> list[tuple[str, int, int]]:
    verdict = monitor.observe(
        StepObservation(
            step=step, loss=1.0, grad_norm=1.0, lr=0.1, tokens_per_second=None,
            custom={} if val is None else {"val": val}, checkpoint_in_flight=False,
            steps_since_start=step,
        )
    )  # fmt: skip
    return [(f.signal, f.onset_step, f.consecutive) for f in verdict.findings]


def test_a_sparse_series_fires_between_its_reports_until_a_healthy_one() -> None:
    custom = CustomSignalConfig(
        name="val_high", metric="val", kind=ThresholdKind.ABOVE, threshold=2.0,
        consecutive_steps=2,
    )  # fmt: skip
    config = DetectionConfig(
        baseline=BaselineConfig(warmup_steps=0, min_samples=1), custom=(custom,)
    )
    monitor = SignalMonitor(config, (SIGNAL,))
    assert observe(monitor, 1, 1.0) == []
    assert observe(monitor, 2, None) == []
    assert observe(monitor, 3, 3.0) == [(SIGNAL, 3, 1)]
    assert observe(monitor, 4, None) == [(SIGNAL, 3, 1)], "still firing, streak unchanged"
    verdict_rows = observe(monitor, 5, 3.5)
    assert verdict_rows == [(SIGNAL, 3, 2)]
    assert monitor.snapshot().findings[0].sustained
    assert observe(monitor, 6, 1.0) == []
    assert observe(monitor, 7, None) == [], "a healthy reading ends the episode"
