"""The checkpoint the next attempt resumes from, by the agent's own selection function.

The bound comes from the plan: a rollback's rule puts it before the onset (further on each
escalation level), a manual request names it, a restart takes the newest checkpoint. It is
recomputed here from the persisted plan with the policy's own arithmetic, so an operator
restarted between the decision and the choice reaches the same bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stabletrain_agent.checkpoint.selection import NoCheckpointError, select_checkpoint
from stabletrain_agent.contract.inventory import CheckpointRecord
from stabletrain_agent.contract.names import Action
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import Plan
from stabletrain_operator.policy.arithmetic import target_bound


@dataclass(frozen=True)
class Choice:
    """Where the next attempt starts: a checkpoint step, or None for a fresh start."""

    step: int | None
    reason: str
    usable: bool = True
    """False when checkpoints exist before the bound but none can be trusted: resuming
    from scratch would silently throw away a run that a person may still rescue."""


def step_bound(plan: Plan, spec: StableTrainingJobSpec) -> int | None:
    """Newest step the target may have; None means the newest stable checkpoint."""
    if plan.action is not Action.ROLLBACK:
        return None
    manual = spec.manual_rollback
    if plan.request_id:
        if manual is not None and manual.request_id == plan.request_id:
            return manual.to_step
        return None
    rule = next((r for r in spec.recovery.rules if r.name == plan.rule), None)
    if rule is None or plan.onset_step is None:
        return plan.onset_step
    return target_bound(plan.onset_step, rule.rollback_params(), plan.recurrence)


def choose_checkpoint(
    records: Sequence[CheckpointRecord], bound: int | None, nodes: Sequence[str]
) -> Choice:
    """The selection function's answer, or a fresh start when nothing precedes the bound."""
    limit = bound if bound is not None else max((r.step for r in records), default=0)
    try:
        selected = select_checkpoint(
            records, onset_step=limit, margin=0, nodes=list(nodes) or ["unknown"]
        )
    except NoCheckpointError as error:
        if any(r.step <= limit for r in records):
            return Choice(None, str(error), usable=False)
        return Choice(None, f"no checkpoint at or before step {limit}: starting from scratch")
    return Choice(selected.step, selected.reason)
