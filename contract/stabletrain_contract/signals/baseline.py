"""What "normal" looks like for one series: an EMA plus a window for robust statistics.

Only values the caller accepted as healthy are ever added, so a spike cannot drag the
baseline up after it and hide its own continuation (the failure mode of a plain moving
average fed with everything).

While the baseline fills (fewer than `min_samples` healthy values) there is no EMA worth
comparing with, so the values accepted so far are also kept as seeds: a caller judges new
values against their median, and once the baseline is full it can `settle` it, dropping
seeds that the final median shows were outliers (those accepted before the median meant
anything) and filling again without them.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

_MAD_TO_SIGMA = 1.4826
"""Scales the median absolute deviation to a standard deviation for normal noise."""
MIN_SEEDS_TO_JUDGE = 3
"""Seeds needed before their median is a reference: one or two values have no middle."""


class Baseline:
    """EMA and recent-window statistics of the healthy values of one series."""

    def __init__(self, ema_factor: float, window: int, min_samples: int) -> None:
        self._ema: float | None = None
        self._accepted = 0
        self._window: deque[float] = deque()
        self._seeds: list[float] = []
        self.retune(ema_factor, window, min_samples)

    def retune(self, ema_factor: float, window: int, min_samples: int) -> None:
        """New parameters from a live directive; the healthy values learned so far stay."""
        if not 0.0 < ema_factor <= 1.0:
            raise ValueError(f"ema_factor must be in (0, 1], got {ema_factor}")
        if window < 3:
            raise ValueError(f"window must hold at least 3 values, got {window}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, got {min_samples}")
        self._ema_factor = ema_factor
        self._min_samples = min_samples
        self._window = deque(self._window, maxlen=window)

    @property
    def ready(self) -> bool:
        """Enough healthy values were seen for comparisons to mean something."""
        return self._accepted >= self._min_samples

    @property
    def ema(self) -> float | None:
        return self._ema

    @property
    def accepted(self) -> int:
        return self._accepted

    def accept(self, value: float) -> None:
        """Add one healthy value; non-finite values are refused loudly, never absorbed."""
        if not math.isfinite(value):
            raise ValueError(f"a baseline only takes finite values, got {value}")
        if not self.ready:
            self._seeds.append(value)
        self._add(value)

    def _add(self, value: float) -> None:
        if self._ema is None:
            self._ema = value
        else:
            self._ema += self._ema_factor * (value - self._ema)
        self._accepted += 1
        self._window.append(value)

    def seed_median(self) -> float | None:
        """Median of the healthy values accepted while the baseline fills, once there are
        enough of them to have a middle; None otherwise (and once the baseline settled)."""
        if len(self._seeds) < MIN_SEEDS_TO_JUDGE:
            return None
        return statistics.median(self._seeds)

    def settle(self, is_outlier: Callable[[float, float], bool]) -> int:
        """Re-examine the seeds of a baseline that just became ready against their median.

        `is_outlier(value, median)` is the caller's spike rule.  Outliers are dropped and
        the EMA, window and count are rebuilt from the rest in their order, so the baseline
        is not ready again until enough clean values arrived.  Returns how many were dropped;
        with none, the seeds are released and the baseline stays as it is.
        """
        if not self.ready or not self._seeds:
            return 0
        median = statistics.median(self._seeds)
        clean = [value for value in self._seeds if not is_outlier(value, median)]
        dropped = len(self._seeds) - len(clean)
        if dropped == 0:
            self._seeds = []
            return 0
        self._ema, self._accepted, self._seeds = None, 0, []
        self._window.clear()
        for value in clean:
            self.accept(value)
        return dropped

    def ratio(self, value: float) -> float | None:
        """``value`` over the EMA; None when the EMA is not positive (a ratio means nothing)."""
        if self._ema is None or self._ema <= 0.0:
            return None
        return value / self._ema

    def robust_zscore(self, value: float) -> float | None:
        """Distance from the window's median in MAD-derived sigmas; None on a flat window."""
        spread = self._median_and_sigma()
        if spread is None:
            return None
        median, sigma = spread
        return (value - median) / sigma

    def zscore_bound(self, zscore: float) -> float | None:
        """The value that sits ``zscore`` robust sigmas above the median, for evidence."""
        spread = self._median_and_sigma()
        if spread is None:
            return None
        median, sigma = spread
        return median + zscore * sigma

    def _median_and_sigma(self) -> tuple[float, float] | None:
        if len(self._window) < 3:
            return None
        median = statistics.median(self._window)
        mad = statistics.median(abs(v - median) for v in self._window)
        if mad <= 0.0:
            return None
        return median, _MAD_TO_SIGMA * mad

    def state_dict(self) -> dict[str, Any]:
        return {
            "ema": self._ema,
            "accepted": self._accepted,
            "window": list(self._window),
            "seeds": list(self._seeds),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ema = state["ema"]
        window = [float(v) for v in state["window"]]
        seeds = [float(v) for v in state.get("seeds", ())]  # absent in older checkpoints
        if ema is not None and not math.isfinite(float(ema)):
            raise ValueError(f"saved baseline EMA is not finite: {ema}")
        if not all(math.isfinite(v) for v in (*window, *seeds)):
            raise ValueError("saved baseline window holds non-finite values")
        self._ema = None if ema is None else float(ema)
        self._accepted = int(state["accepted"])
        self._window.clear()
        self._window.extend(window)
        self._seeds = seeds
