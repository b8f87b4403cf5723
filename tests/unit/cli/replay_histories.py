"""Synthetic metrics histories with known anomalies, written as the CSV files replay reads.

Deterministic (seeded) so a failing test shows the same numbers every time; the noise is
real noise, not a flat line, so the detectors see what a training log looks like.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from pathlib import Path

Row = dict[str, float | int | str]


def decaying_loss(step: int) -> float:
    """A plausible LM loss curve: fast early drop, slow tail."""
    return 2.0 + 3.0 * math.exp(-step / 2500)


def history(
    steps: Iterable[int],
    *,
    seed: int = 7,
    noise: float = 0.02,
    loss: Callable[[int, float], float | str] = lambda step, healthy: healthy,
    extra: Callable[[int], dict[str, float | str]] | None = None,
) -> list[Row]:
    """Rows with loss = healthy curve x (1 + gaussian noise), then `loss` may bend it."""
    rng = random.Random(seed)
    rows: list[Row] = []
    for step in steps:
        healthy = decaying_loss(step) * (1.0 + rng.gauss(0.0, noise))
        row: Row = {
            "step": step,
            "loss": loss(step, healthy),
            "grad_norm": round(1.0 + 0.1 * rng.random(), 5),
            "lr": 3e-4,
        }
        if extra is not None:
            row.update(extra(step))
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[Row]) -> Path:
    columns = list(rows[0])
    lines = [",".join(columns)]
    for row in rows:
        lines.append(",".join(_cell(row.get(column, "")) for column in columns))
    path.write_text("\n".join(lines) + "\n")
    return path


def _cell(value: float | int | str) -> str:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)
