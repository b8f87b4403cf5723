"""Fencing by attempt: which checkpoints belong to the run's current history.

Each attempt records, in a FENCE file at the tier root, the step it resumed from.  A
checkpoint written by attempt `a` at step `s` is on the lineage unless some later attempt
resumed from a step before `s`: then that checkpoint lies on a trajectory that was
abandoned (a rollback, or a pod of an old attempt that kept running on a lost node).  This
rule holds however late a stale writer finishes, so it does not depend on the stale writer
noticing the fence; writers do check it before committing, which only saves the garbage.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stabletrain_agent.checkpoint.atomic import write_file_atomic
from stabletrain_agent.checkpoint.layout import FENCE_NAME


class StaleAttemptError(Exception):
    """This writer's attempt has been superseded; it must not write any more."""


class FenceCorruptError(Exception):
    """The FENCE file exists but cannot be read; refusing to guess the lineage."""


class AttemptStart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: int = Field(ge=0)
    resume_step: int = Field(ge=0, description="step restored from; 0 for a fresh start")


class Fence(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    starts: tuple[AttemptStart, ...] = ()

    @property
    def newest_attempt(self) -> int:
        return max((start.attempt for start in self.starts), default=-1)

    def on_lineage(self, step: int, attempt: int) -> bool:
        return all(step <= start.resume_step for start in self.starts if start.attempt > attempt)


def read_fence(root: Path) -> Fence:
    path = root / FENCE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Fence()
    try:
        return Fence.model_validate_json(raw)
    except ValidationError as error:
        problem = error.errors()[0]["msg"]
        raise FenceCorruptError(f"{path} is not a valid fence: {problem}") from None


def check_not_stale(root: Path, attempt: int) -> None:
    newest = read_fence(root).newest_attempt
    if newest > attempt:
        raise StaleAttemptError(
            f"attempt {attempt} is superseded by attempt {newest} (fence at {root}); "
            "refusing to write"
        )


def advance_fence(root: Path, attempt: int, resume_step: int) -> Fence:
    """Record this attempt's start; idempotent for the same attempt, refused for a stale one."""
    fence = read_fence(root)
    if fence.newest_attempt > attempt:
        raise StaleAttemptError(
            f"attempt {attempt} cannot start: attempt {fence.newest_attempt} already started "
            f"(fence at {root})"
        )
    known = {start.attempt: start for start in fence.starts}
    if attempt in known:
        if known[attempt].resume_step != resume_step:
            raise StaleAttemptError(
                f"attempt {attempt} already started from step {known[attempt].resume_step}, "
                f"not {resume_step} (fence at {root})"
            )
        return fence
    updated = Fence(starts=(*fence.starts, AttemptStart(attempt=attempt, resume_step=resume_step)))
    write_file_atomic(root / FENCE_NAME, updated.model_dump_json(indent=1).encode())
    return updated
