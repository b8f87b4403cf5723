"""The faults the example can suffer on purpose, so the healing loop can be shown and tested.

Two ways to ask for them. `Faults` holds the scripted ones, fixed before the run starts (the
TINYGPT_* options): poisoned shards are data, so they stay poisoned in every attempt, and
only the skip-list the operator hands to the relaunched pods keeps training away from them.
The other faults (NaN, a killed rank, a stalled rank) are accidents of one moment, so they
strike only in the attempt named by `fault_attempt` (the first, by default): a relaunch
that hit them again would never finish. A bad node (`kill_node`) is the exception: it kills
whatever runs on it.

`Triggered` holds the ones a chaos harness asks for while the run goes, through trigger
files (triggers.py): a NaN burst, a rank that hangs inside a step for good, a shard that
turns bad from the next one read on. Each strikes once in the whole run, whichever attempt
sees it first; a shard a spike poisoned stays poisoned in every later attempt. (A killed
rank, a lost node and the rest come from outside the process: tests/support/chaos.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from triggers import Fired, TriggerBox

HANG_SLEEP_SECONDS = 3600.0


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
    stall_ignores_term: bool = False
    """The stalled rank ignores SIGTERM, as a process stuck in a driver call can: a stop must
    KILL it once its grace period is over."""
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
            if self.stall_ignores_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(self.stall_seconds)

    def loss(self, loss: torch.Tensor, step: int, rank: int, attempt: int) -> torch.Tensor:
        """The loss as the step computed it, or NaN inside the chosen window."""
        inside = self.nan_at <= step < self.nan_at + self.nan_steps
        if self.strikes(attempt) and self.nan_at >= 0 and inside and rank == self.nan_rank:
            return loss * float("nan")
        return loss


class Triggered:
    """The faults the trigger directory asks this rank for, as they act on its steps."""

    def __init__(
        self,
        box: TriggerBox,
        next_shard: Callable[[], str],
        poison: Callable[[Collection[str]], None],
    ) -> None:
        self.box = box
        self._next_shard = next_shard
        self._poison = poison
        self._nan_left = 0
        self._hang: Fired | None = None
        box.scan()
        poison(box.poisoned_shards())

    def before_step(self, step: int) -> list[Fired]:
        """Claims and arms what is due (one stat when nothing changed); keeps every shard a
        spike poisoned, whichever rank and attempt fired it, poisoned here too."""
        fired = self.box.due(step, self._next_shard)
        for strike in fired:
            what = {"nan": f"{strike.steps} NaN steps", "hang": "hangs inside the step",
                    "spike": f"poisons {strike.shard}"}[strike.kind]  # fmt: skip
            print(f"tiny-gpt: rank {self.box.rank} trigger {strike.trigger_id}: {what} "
                  f"from step {step} (attempt {strike.attempt})", flush=True)  # fmt: skip
            if strike.kind == "nan":
                self._nan_left = strike.steps
            elif strike.kind == "hang":
                self._hang = strike
        self._poison(self.box.poisoned_shards())
        return fired

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """NaN while a triggered burst lasts."""
        if self._nan_left <= 0:
            return loss
        self._nan_left -= 1
        return loss * float("nan")

    def inside_step(self, step: int) -> None:
        """A triggered hang: forward done, backward never starts, so the other ranks wait in
        the gradients' collective; the agent's status endpoint still answers."""
        if self._hang is None:
            return
        print(f"tiny-gpt: rank {self.box.rank} hangs inside step {step}", flush=True)
        while True:
            time.sleep(HANG_SLEEP_SECONDS)
