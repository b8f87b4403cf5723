"""The numbers of a rollback: LR scale, skip range and target bound, escalation included.

Escalation makes each recurrence near the same onset harder than the last, the way the
OPT-175B and BLOOM teams did by hand: the LR factor applied once more per level, the skip
range and the distance to the target checkpoint doubled per level.
"""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_contract.directives import SkipRange, SkipUnit
from stabletrain_operator.api.spec import RollbackParams, SkipData

SCALE_DIGITS = 12
"""Significant digits an LR scale keeps."""


def tidy_scale(scale: float) -> float:
    """`scale` to SCALE_DIGITS significant digits: 0.7 x 0.7 is 0.49 in the status, the
    Events and kubectl's LR SCALE column, not 0.48999999999999994; the learning rate it sets
    moves by less than one part in 10^11."""
    return float(f"{scale:.{SCALE_DIGITS}g}")


def reduced_lr_scale(current: float, factor: float, floor: float, *, times: int = 1) -> float:
    """`current` x factor^times, never below `floor`, and never above `current`.

    The upper bound matters when a person already lowered the LR below the floor: a
    rollback must not raise it again.
    """
    return min(current, max(tidy_scale(current * factor**times), floor))


def widening(level: int) -> int:
    """How much wider than the base a level's skip range and target distance are: 2^level."""
    return 1 << level


def skip_around(
    onset_step: int, params: RollbackParams, level: int, suspect_shards: Sequence[str] = ()
) -> SkipRange:
    """[onset - before, onset + after] in steps, both widened by the escalation level.

    A first occurrence with the lineage's suspect shards skips only their data in that
    window (SkipData.SuspectShards): the clean data read around them is kept. A recurrence
    near the same onset means the suspects were not all of it, so it skips the whole
    widened window, as does a policy that asks for StepRange.
    """
    wider = widening(level)
    narrowed = level == 0 and params.skip_data is SkipData.SUSPECT_SHARDS
    return SkipRange(
        first=max(onset_step - params.skip_steps_before_onset * wider, 0),
        last=onset_step + params.skip_steps_after_onset * wider,
        unit=SkipUnit.STEP,
        shard_ids=tuple(suspect_shards) if narrowed else (),
    )


def target_bound(onset_step: int, params: RollbackParams, level: int) -> int:
    """Newest step the rollback target may have; 0 leaves only a step-0 checkpoint (or a
    start from scratch) when the onset is closer to the start than the distance asks."""
    return max(onset_step - params.min_steps_before_onset * widening(level), 0)
