"""A decision as status keeps it: a history entry, or the plan a stopping decision starts.

Here and not on the status models, so the API stays the ground floor: the policy reads
status (its ledger is rebuilt from it), and status knows nothing of the policy.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from stabletrain_contract.directives import SkipRange
from stabletrain_operator.api.status import Plan, RollbackRecord, Suspect
from stabletrain_operator.policy.decision import Decision


def history_entry(
    decision: Decision,
    *,
    time: datetime,
    reached_step: int | None,
    lr_scale: float,
    attempt: int,
) -> RollbackRecord:
    """A decision that launches nothing (ReduceLR, Alert), as it is recorded when taken;
    `reached_step` stands in for a decision that names no step."""
    return RollbackRecord(
        time=time,
        reason=decision.reason,
        **_identity(decision, reached_step),
        lr_scale=lr_scale,
        attempt=attempt,
    )


def stopping_plan(
    decision: Decision,
    *,
    started_at: datetime,
    reached_step: int | None,
    from_attempt: int,
    added_skip: tuple[SkipRange, ...],
    suspects: tuple[Suspect, ...],
    confirm_step: int | None,
    loss_baseline: float | None,
) -> Plan:
    """The plan of a stopping decision, persisted before any pod is touched; the
    checkpoint and directives are filled in by Planning and Relaunching."""
    return Plan(
        **_identity(decision, reached_step),
        started_at=started_at,
        from_attempt=from_attempt,
        next_attempt=from_attempt + 1,
        lr_scale=decision.lr_scale,
        rewarmup_steps=decision.rewarmup_steps or 0,
        added_skip=added_skip,
        recurrence=decision.escalation_level,
        suspects=suspects,
        backoff_seconds=decision.backoff_seconds,
        confirm_step=confirm_step,
        loss_baseline=loss_baseline,
    )


def _identity(decision: Decision, reached_step: int | None) -> dict[str, Any]:
    """What both records say of the decision: which, why and from which step (the job's
    newest when the decision names none)."""
    return {
        "action": decision.action,
        "rule": decision.rule,
        "request_id": decision.request_id,
        "signal": decision.signal,
        "anomaly_class": decision.anomaly_class,
        "onset_step": decision.onset_step,
        "from_step": decision.step if decision.step is not None else (reached_step or 0),
    }
