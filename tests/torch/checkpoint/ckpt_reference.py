"""The state a test run holds at each step, computed from the step alone.

Both the saving child and the checking test call `reference(step)`; the check never goes
through the checkpoint code, so a checkpoint that loads but holds another step's state fails.
"""

from __future__ import annotations

from typing import Any

import torch

PARAMS = 256 * 1024


def reference(step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1000 + step)
    return {
        "weights": torch.randn(PARAMS, generator=generator),
        "momentum": torch.randn(PARAMS // 4, generator=generator).to(torch.float64),
        "step": step,
    }


def reference_cursor(step: int) -> dict[str, Any]:
    return {"samples": step * 32, "shard": f"shard-{step % 5}"}


class Holder:
    """A generic stateful object (what the manager gets from a guard or a data helper)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = dict(state_dict)


def empty_app() -> Holder:
    return Holder(
        {
            "weights": torch.zeros(PARAMS),
            "momentum": torch.zeros(PARAMS // 4, dtype=torch.float64),
            "step": -1,
        }
    )


def empty_cursor() -> Holder:
    return Holder({"samples": -1, "shard": ""})


def matches(holder: Holder, expected: dict[str, Any]) -> bool:
    got = holder.state
    if set(got) != set(expected):
        return False
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            if not (isinstance(got[key], torch.Tensor) and torch.equal(got[key], value)):
                return False
        elif got[key] != value:
            return False
    return True
