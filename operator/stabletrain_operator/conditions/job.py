"""What each of the job's conditions says, one helper per condition and polarity.

The state machine's phases change Ready, Healthy, Recovering, Suspended, Complete, Failed
and BudgetExhausted; naming each change (`set_recovering`, `clear_suspended`) keeps the
phases readable and puts the reasons that never vary, and the fixed messages people read
in `kubectl describe`, in one place. The Preflight condition has its own module
(conditions/preflight_condition.py) because it also decides when to post an Event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from stabletrain_operator.api.constants import ConditionType, Reason
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.entries import set_condition

CREATED_SUSPENDED = "created suspended"
"""Suspended: the job was created with spec.suspend set, so nothing ever ran."""
NO_SIGNAL_YET = "no signal"
"""Healthy when the first attempt is created, before any scrape."""
NO_SIGNAL_FIRES = "no signal fires"
"""Healthy once a scrape of the running pods shows no signal firing."""
SUSPENDED_NO_PODS = "suspended: no pods run"
FAILED_NO_PODS = "failed: no pods run"
RESUMING = "spec.suspend is false: relaunching from the newest checkpoint"
RELAUNCHING_AFTER_SUSPEND = "relaunching after suspend"
FAILED_BY_POLICY = "the policy failed the job"
"""Failed with no Recovering condition to name why (a Fail without an incident)."""


class Stamp(Protocol):
    """When a condition changed: the tick's time and the spec generation it acted on.

    A protocol so the state machine's World passes as it is, without this module
    importing the machine.
    """

    @property
    def now(self) -> datetime: ...

    @property
    def generation(self) -> int | None: ...


def _with(
    status: StableTrainingJobStatus,
    stamp: Stamp,
    kind: ConditionType,
    *,
    ok: bool,
    reason: Reason | str,
    message: str,
) -> StableTrainingJobStatus:
    conditions = set_condition(
        status.conditions, kind, ok, reason, message, now=stamp.now, generation=stamp.generation
    )
    return status.model_copy(update={"conditions": conditions})


def set_ready(
    status: StableTrainingJobStatus, stamp: Stamp, *, message: str
) -> StableTrainingJobStatus:
    """Every pod of the attempt runs and reports."""
    return _with(
        status, stamp, ConditionType.READY, ok=True, reason=Reason.PODS_RUNNING, message=message
    )


def clear_ready(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """Not every pod of the attempt runs: being created, stopped, or gone for good."""
    return _with(status, stamp, ConditionType.READY, ok=False, reason=reason, message=message)


def set_healthy(
    status: StableTrainingJobStatus, stamp: Stamp, *, message: str
) -> StableTrainingJobStatus:
    """No signal fires."""
    return _with(
        status, stamp, ConditionType.HEALTHY, ok=True, reason=Reason.NO_SIGNAL, message=message
    )


def clear_healthy(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """A signal fires, or an anomaly of the model is being handled or only alerted."""
    return _with(status, stamp, ConditionType.HEALTHY, ok=False, reason=reason, message=message)


def set_recovering(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """An action that needs the attempt's processes ended is in flight."""
    return _with(status, stamp, ConditionType.RECOVERING, ok=True, reason=reason, message=message)


def clear_recovering(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """The action in flight ended: confirmed, timed out, or the job ended."""
    return _with(status, stamp, ConditionType.RECOVERING, ok=False, reason=reason, message=message)


def set_suspended(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """spec.suspend holds, Kueue evicted the job, or its pods were released while
    unschedulable: the pods save, stop, or were never created."""
    return _with(status, stamp, ConditionType.SUSPENDED, ok=True, reason=reason, message=message)


def clear_suspended(
    status: StableTrainingJobStatus, stamp: Stamp, *, message: str | None = None
) -> StableTrainingJobStatus:
    """spec.suspend was cleared (or Kueue admitted the job again): the job resumes."""
    return _with(
        status,
        stamp,
        ConditionType.SUSPENDED,
        ok=False,
        reason=Reason.RESUMED,
        message=message or RESUMING,
    )


def set_complete(
    status: StableTrainingJobStatus, stamp: Stamp, *, message: str
) -> StableTrainingJobStatus:
    """Every worker trained to the end."""
    return _with(
        status,
        stamp,
        ConditionType.COMPLETE,
        ok=True,
        reason=Reason.TRAINING_COMPLETE,
        message=message,
    )


def set_failed(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """The job ended Failed."""
    return _with(status, stamp, ConditionType.FAILED, ok=True, reason=reason, message=message)


def set_budget_exhausted(
    status: StableTrainingJobStatus, stamp: Stamp, *, reason: Reason | str, message: str
) -> StableTrainingJobStatus:
    """The job failed because an action's budget ran out."""
    return _with(
        status, stamp, ConditionType.BUDGET_EXHAUSTED, ok=True, reason=reason, message=message
    )
