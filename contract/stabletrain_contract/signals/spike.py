"""Upward spikes of one series (loss, grad norm) against its own healthy baseline.

Two rules users already know, either of which marks a step anomalous: a ratio over the
EMA (llm-foundry's KillLossSpike compares with a running mean) and a robust z-score
over a recent window (OLMo-core's skip-step rule), made robust with median/MAD so a
single outlier in the window does not widen the band. Only upward moves count: a
loss falling faster than usual is good news.

While the baseline fills after the warm-up, each value is judged by the same rules against
the median of the healthy values seen so far, so a bad shard read right then is a spike
(it trips like any other) instead of becoming part of "normal"; and once the baseline is
full its seeds are re-examined against their final median (see Baseline.settle).
"""

from __future__ import annotations

from typing import NamedTuple

from stabletrain_contract.detection import SpikeConfig
from stabletrain_contract.signals.detector import Detector


class SpikeReading(NamedTuple):
    """How one step of a series compares with its baseline (a tuple: two are built on
    every step, where a frozen dataclass costs several times more)."""

    value: float
    baseline: float | None
    ratio: float | None
    zscore: float | None
    """Computed when the z-score rule is on or the step is anomalous, None otherwise."""
    judged: bool
    """False during warm-up, while the baseline fills, and for non-finite values."""
    anomalous: bool
    threshold: float | None
    """The value at which the rule that fired (or the ratio rule) would fire; only on an
    anomalous step, the one a finding reports (the z-score's costs the window's medians)."""
    consecutive: int
    onset_step: int | None
    sustained: bool


class SpikeDetector(Detector[SpikeConfig]):
    """Judges each step of one series against the spike rules, upward moves only."""

    def observe(self, step: int, value: float) -> SpikeReading:
        rule = self._rule
        if self._ignored(step, value):
            return self._unjudged(value)
        ema = self._baseline.ema
        if ema is None or not self._baseline.ready:
            return self._seed(step, value)
        by_ratio = rule.ratio_breached(value, ema)
        # The window's median costs a sort; only pay it when a rule or the evidence needs it.
        zscore = None
        if rule.zscore is not None or by_ratio:
            zscore = self._baseline.robust_zscore(value)
        by_zscore = zscore is not None and rule.zscore_breached(zscore)
        anomalous = by_ratio or by_zscore
        self._record(step, value, anomalous=anomalous)
        return SpikeReading(
            value=value,
            baseline=ema,
            ratio=self._baseline.ratio(value),
            zscore=zscore,
            judged=True,
            anomalous=anomalous,
            threshold=self._threshold(ema, prefer_zscore=not by_ratio) if anomalous else None,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=self._sustained(rule.consecutive_steps),
        )

    def _seed(self, step: int, value: float) -> SpikeReading:
        """A value while the baseline fills: judged against the seeds' median, learned only
        if healthy; the baseline settles once full."""
        median = self._baseline.seed_median()
        anomalous = median is not None and self._breaches_seeds(value, median)
        self._record(step, value, anomalous=anomalous)
        if not anomalous and self._baseline.ready:
            self._baseline.settle(self._breaches_seeds)
        if median is None:
            return self._unjudged(value)
        by_ratio = self._rule.ratio_breached(value, median)
        return SpikeReading(
            value=value,
            baseline=median,
            ratio=value / median if median > 0.0 else None,
            zscore=self._baseline.robust_zscore(value) if anomalous else None,
            judged=True,
            anomalous=anomalous,
            threshold=(self._threshold(median, prefer_zscore=not by_ratio) if anomalous else None),
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=self._sustained(self._rule.consecutive_steps),
        )

    def _breaches_seeds(self, value: float, median: float) -> bool:
        if self._rule.ratio_breached(value, median):
            return True
        zscore = self._baseline.robust_zscore(value) if self._rule.zscore is not None else None
        return zscore is not None and self._rule.zscore_breached(zscore)

    def _threshold(self, ema: float, *, prefer_zscore: bool) -> float | None:
        ratio_bound = None if self._rule.ratio is None or ema <= 0.0 else self._rule.ratio * ema
        zscore_bound = None
        if self._rule.zscore is not None:
            zscore_bound = self._baseline.zscore_bound(self._rule.zscore)
        if prefer_zscore or ratio_bound is None:
            return zscore_bound
        return ratio_bound

    def _unjudged(self, value: float) -> SpikeReading:
        return SpikeReading(
            value=value,
            baseline=self._baseline.ema,
            ratio=None,
            zscore=None,
            judged=False,
            anomalous=False,
            threshold=None,
            consecutive=self._streak.count,
            onset_step=self._streak.onset,
            sustained=False,
        )
