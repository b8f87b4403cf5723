"""NaN and infinity kept out of what the operator writes, prints and draws.

A diverging run reports NaN and infinite losses and norms, and a NonFinite trip's `value`
is NaN; JSON has no NaN, the API server refuses a status patch that carries one (HTTP 400,
which would stall the job), and a plot's axis cannot hold infinity. Each consumer replaces
them with what it can carry, through these two functions only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

Fallback = TypeVar("Fallback")


def finite_or(value: float | None, fallback: Fallback) -> float | Fallback:
    """`value` when it is a finite number, else `fallback` (also for None)."""
    return value if value is not None and math.isfinite(value) else fallback


def non_finite_replaced(data: Any, replacement: Callable[[float], Any]) -> Any:
    """JSON-shaped `data` (dicts, lists, scalars) with every NaN or infinite float replaced
    by `replacement(value)`, recursively."""
    if isinstance(data, float) and not math.isfinite(data):
        return replacement(data)
    if isinstance(data, dict):
        return {key: non_finite_replaced(item, replacement) for key, item in data.items()}
    if isinstance(data, list):
        return [non_finite_replaced(item, replacement) for item in data]
    return data
