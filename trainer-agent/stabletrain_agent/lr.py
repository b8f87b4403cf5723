"""The directives' LR multiplier, applied so that the user's scheduler never sees it.

A scale written into ``param_groups[i]["lr"]`` once does not survive: closed-form
schedulers (LambdaLR) overwrite it on their next step, chainable ones (ExponentialLR,
CosineAnnealingLR's recursive form) compound it, and ``scheduler.load_state_dict``
restores ``base_lrs`` and quietly undoes a scale baked into them. So the scale lives
here, not in the optimizer: it is multiplied in only for the duration of
``optimizer.step()`` and the scheduler's own value is put back before the scheduler
runs. Whatever the scheduler (or a restored checkpoint) sets, the step uses
``scheduler's LR x factor``.

The factor is the directives' LR scale times an optional linear re-warm-up ramp that
starts at the resume step, so a rolled-back run does not restart at full LR on the same
weights that just diverged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class LrScale:
    """Multiplier on every param group's LR: a scale and a re-warm-up ramp."""

    scale: float = 1.0
    """The directives' LR scale (0 < scale <= 1 after rollbacks, 1 otherwise)."""
    rewarmup_from_step: int = 0
    """Steps finished when the ramp started (the resume step)."""
    rewarmup_steps: int = 0
    """Length of the ramp; 0 means no ramp."""

    def __post_init__(self) -> None:
        self.set_scale(self.scale)
        self.start_rewarmup(self.rewarmup_from_step, self.rewarmup_steps)

    def set_scale(self, scale: float) -> None:
        if not scale > 0.0 or scale == float("inf"):
            raise ValueError(f"LR scale must be a positive finite number, got {scale!r}")
        self.scale = float(scale)

    def start_rewarmup(self, from_step: int, steps: int) -> None:
        """Ramp the factor linearly up to ``scale`` over the ``steps`` after ``from_step``."""
        if from_step < 0 or steps < 0:
            raise ValueError(
                f"re-warm-up needs from_step >= 0 and steps >= 0, got {from_step}, {steps}"
            )
        self.rewarmup_from_step = int(from_step)
        self.rewarmup_steps = int(steps)

    def factor(self, step: int) -> float:
        """The multiplier for optimizer step ``step`` (1-based: the step about to be taken)."""
        ramp = 1.0
        if self.rewarmup_steps > 0:
            into_ramp = step - self.rewarmup_from_step
            ramp = min(1.0, max(into_ramp, 1) / self.rewarmup_steps)
        return self.scale * ramp

    def applied(self, optimizer: torch.optim.Optimizer, step: int) -> _Applied:
        """Scale every param group's LR while the body runs; restore the scheduler's values.

        ``with scale.applied(optimizer, step) as factor:``. A small class rather than a
        generator-based context manager: it is entered on every step.
        """
        return _Applied(optimizer.param_groups, self.factor(step))

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "rewarmup_from_step": self.rewarmup_from_step,
            "rewarmup_steps": self.rewarmup_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_scale(float(state["scale"]))
        self.start_rewarmup(int(state["rewarmup_from_step"]), int(state["rewarmup_steps"]))


class _Applied:
    """The LRs scaled by ``factor`` between enter and exit, the scheduled ones put back."""

    __slots__ = ("_factor", "_groups", "_scheduled")

    def __init__(self, groups: list[dict[str, Any]], factor: float) -> None:
        self._groups = groups
        self._factor = factor
        self._scheduled: list[float] = []

    def __enter__(self) -> float:
        self._scheduled = [_float_lr(group, index) for index, group in enumerate(self._groups)]
        for group, lr in zip(self._groups, self._scheduled, strict=True):
            group["lr"] = lr * self._factor
        return self._factor

    def __exit__(self, *_: object) -> None:
        for group, lr in zip(self._groups, self._scheduled, strict=True):
            group["lr"] = lr


def _float_lr(group: dict[str, Any], index: int) -> float:
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) or not isinstance(lr, int | float):
        raise TypeError(
            f"param group {index} has lr of type {type(lr).__name__}; the guard scales "
            "plain float LRs only (a tensor LR would need an in-place update the "
            "optimizer may have captured)"
        )
    return float(lr)
