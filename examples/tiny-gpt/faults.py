"""The faults the example can suffer on purpose, so the healing loop can be shown and tested.

Poisoned shards are data: they stay poisoned in every attempt, and only the skip-list the
operator hands to the relaunched pods keeps training away from them. The other faults
(NaN, a killed rank, a stalled rank) are accidents of one moment, so they strike only in
the attempt named by `fault_attempt` (the first, by default): a relaunch that hit them again
would never finish. A bad node (`kill_node`) is the exception: it kills whatever runs on it.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Faults:
    fault_attempt: int = 0
    nan_at: int = -1
    """First step whose loss is NaN on `nan_rank`."""
    nan_steps: int = 3
    """NaN steps in a row: the default detection needs 3 before it counts (one is skipped)."""
    nan_rank: int = 0
    kill_at: int = -1
    """Step at which `kill_rank` SIGKILLs itself (before its forward pass)."""
    kill_rank: int = 1
    kill_node: str = ""
    """A bad node: whichever rank runs on the node of this name SIGKILLs itself at `kill_at`,
    in every attempt (the node is the fault, not the moment)."""
    node: str = ""
    """The node this rank runs on."""
    stall_at: int = -1
    """Step at which `stall_rank` stops making progress for `stall_seconds`."""
    stall_rank: int = 1
    stall_seconds: float = 0.0
    slow_rank: int = -1
    """A slow rank: it sleeps `slow_seconds` before every step, in every attempt."""
    slow_seconds: float = 0.0

    def strikes(self, attempt: int) -> bool:
        return attempt == self.fault_attempt

    def kills(self, step: int, rank: int, attempt: int) -> bool:
        """Whether this rank dies before `step`: on the bad node, or as the chosen accident."""
        if step != self.kill_at:
            return False
        bad_node = bool(self.kill_node) and self.node == self.kill_node
        return bad_node or (self.strikes(attempt) and rank == self.kill_rank)

    def before_step(self, step: int, rank: int, attempt: int) -> None:
        """Kill or stall this rank when the step and the attempt are the chosen ones."""
        if self.kills(step, rank, attempt):
            print(f"tiny-gpt: rank {rank} on node {self.node} dies at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == self.slow_rank:
            time.sleep(self.slow_seconds)
        if not self.strikes(attempt):
            return
        if step == self.stall_at and rank == self.stall_rank:
            print(f"tiny-gpt: rank {rank} stalls {self.stall_seconds} s at step {step}", flush=True)
            time.sleep(self.stall_seconds)

    def loss(self, loss: torch.Tensor, step: int, rank: int, attempt: int) -> torch.Tensor:
        """The loss as the step computed it, or NaN inside the chosen window."""
        inside = self.nan_at <= step < self.nan_at + self.nan_steps
        if self.strikes(attempt) and self.nan_at >= 0 and inside and rank == self.nan_rank:
            return loss * float("nan")
        return loss
