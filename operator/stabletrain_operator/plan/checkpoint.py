"""The checkpoint the next attempt resumes from, by the agent's own selection function.

The bound comes from the plan: a rollback's rule puts it before the onset (further on each
escalation level), a manual request names it, a restart takes the newest checkpoint. It is
recomputed here from the persisted plan with the policy's own arithmetic, so an operator
restarted between the decision and the choice reaches the same bound.

The step chosen is the step the pods restore, exactly (0: nothing is restored): the agent
never falls back to another one. When nothing lies far enough back, the rule's
`noCheckpointFarEnough` decides, and a rollback never resumes at or after its onset.

A restart from the latest may also resume from the pods' memory tier, when every pod of the
next attempt is kept (its memory survives a restart of its processes) and holds the step
(`surviving_memory`); every other action chooses from the local tier and the PFS.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.checkpoint.selection import NoCheckpointError, select_checkpoint
from stabletrain_operator.api.spec import (
    CheckpointSelection,
    NoCheckpointDecision,
    RecoveryRule,
    StableTrainingJobSpec,
)
from stabletrain_operator.api.status import Plan
from stabletrain_operator.policy.action_kind import Relaunch
from stabletrain_operator.policy.action_registry import kind_of
from stabletrain_operator.policy.arithmetic import target_bound


@dataclass(frozen=True)
class Choice:
    """Where the next attempt starts: a checkpoint step, or 0 for a start from scratch."""

    step: int
    reason: str
    usable: bool = True
    """False when the job must fail with NoUsableCheckpoint: checkpoints exist before the
    bound but none can be trusted (a person may still rescue the run), or the rule says
    Fail when none is far enough back."""


def _rule(plan: Plan, spec: StableTrainingJobSpec) -> RecoveryRule | None:
    return next((r for r in spec.recovery.rules if r.name == plan.rule), None)


def step_bound(plan: Plan, spec: StableTrainingJobSpec) -> int | None:
    """Newest step the target may have; None means the newest stable checkpoint."""
    if not kind_of(plan.action).goes_before_onset:
        return None
    manual = spec.manual_rollback
    if plan.request_id:
        if manual is not None and manual.request_id == plan.request_id:
            return manual.to_step
        return None
    rule = _rule(plan, spec)
    if rule is None or plan.onset_step is None:
        return plan.onset_step
    return target_bound(plan.onset_step, rule.rollback_params(), plan.recurrence)


def no_checkpoint_decision(plan: Plan, spec: StableTrainingJobSpec) -> NoCheckpointDecision:
    """The rule's choice when nothing lies far enough back; a manual request or a restart
    without any checkpoint starts from step 0."""
    rule = _rule(plan, spec)
    before_onset = kind_of(plan.action).goes_before_onset
    if before_onset and rule is not None and plan.onset_step is not None:
        return rule.rollback_params().no_checkpoint_far_enough
    return NoCheckpointDecision.FROM_SCRATCH


def surviving_memory(plan: Plan, next_pods: Sequence[str | None]) -> tuple[str | None, ...]:
    """The `memory_pods` of `choose_checkpoint` for this plan: `next_pods` (one entry per pod
    of the next attempt, by node rank: the pod's name when it is kept and restarts in
    place, None when it is new) for a RestartFromLatest, nothing for any other action: a
    Rollback's target lies before the onset, on the tiers that keep history."""
    if kind_of(plan.action).relaunch is not Relaunch.FROM_LATEST:
        return ()
    return tuple(next_pods)


def choose_checkpoint(
    records: Sequence[CheckpointRecord],
    bound: int | None,
    nodes: Sequence[str],
    *,
    selection: CheckpointSelection = CheckpointSelection.BOTH_TIERS,
    onset: int | None = None,
    when_none: NoCheckpointDecision = NoCheckpointDecision.FROM_SCRATCH,
    excluded: Collection[int] = (),
    stable_only: bool = True,
    memory_pods: Sequence[str | None] = (),
) -> Choice:
    """The selection function's answer, else the explicit no-checkpoint decision.

    `excluded` are steps the pods of an earlier try of this plan could not restore;
    `stable_only=False` for a restart, which takes the newest checkpoint whatever the
    signals said when it was saved (never a spike marker). `memory_pods` (see
    `surviving_memory`; default: no pod is kept) lets a step held verified in the memory
    tier of every pod of the next attempt be chosen.
    """
    pool = [r for r in records if r.step not in excluded]
    limit = bound if bound is not None else max((r.step for r in pool), default=0)
    if onset is not None:
        limit = min(limit, onset - 1)
    both = selection is CheckpointSelection.BOTH_TIERS
    names = list(nodes) or ["unknown"]
    steps = sorted(excluded)
    plural = "steps" if len(steps) > 1 else "step"
    failed = f" (the pods could not restore {plural} {', '.join(map(str, steps))})" if steps else ""
    try:
        selected = select_checkpoint(
            pool,
            onset_step=limit,
            margin=0,
            nodes=names,
            both_tiers=both,
            stable_only=stable_only,
            memory_pods=memory_pods,
        )
    except NoCheckpointError as error:
        if any(r.step <= limit for r in pool):
            return Choice(0, f"{error}{failed}", usable=False)
        nothing = f"no checkpoint at or before step {limit}{failed}"
    else:
        return Choice(selected.step, f"{selected.reason}{failed}")
    if onset is None or when_none is NoCheckpointDecision.FROM_SCRATCH:
        return Choice(0, f"{nothing}: starting from step 0, nothing restored")
    if when_none is NoCheckpointDecision.FAIL:
        return Choice(0, f"{nothing}, and the rule says Fail", usable=False)
    return _narrowed(pool, onset, names, both=both, nothing=nothing)


def _narrowed(
    pool: Sequence[CheckpointRecord],
    onset: int,
    nodes: Sequence[str],
    *,
    both: bool,
    nothing: str,
) -> Choice:
    """NarrowMargin: the newest stable checkpoint before the onset, whatever the margin."""
    try:
        closer = select_checkpoint(
            pool, onset_step=onset - 1, margin=0, nodes=nodes, both_tiers=both
        )
    except NoCheckpointError:
        return Choice(0, f"{nothing} nor before onset {onset}: starting from step 0")
    return Choice(
        closer.step,
        f"{nothing}: margin narrowed to {onset - closer.step} steps before onset {onset} "
        f"({closer.reason})",
    )
