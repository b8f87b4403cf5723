"""Consecutive counting: a fault is a run of anomalous steps, not a single bad value.

Requiring several steps in a row is what separates a sustained spike (BLOOM-176B,
OPT-175B) from the benign one-step outliers every long run shows.
"""

from __future__ import annotations

from typing import Any


class Streak:
    """Length and first step of the current run of anomalous steps."""

    def __init__(self) -> None:
        self._count = 0
        self._onset: int | None = None

    @property
    def count(self) -> int:
        return self._count

    @property
    def onset(self) -> int | None:
        """First step of the current run; None when the series is healthy."""
        return self._onset

    def hit(self, step: int) -> None:
        if self._count == 0:
            self._onset = step
        self._count += 1

    def clear(self) -> None:
        self._count = 0
        self._onset = None

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count, "onset": self._onset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        count = int(state["count"])
        onset = state["onset"]
        if count < 0 or (count > 0) != (onset is not None):
            raise ValueError(f"inconsistent saved streak: count={count}, onset={onset}")
        self._count = count
        self._onset = None if onset is None else int(onset)
