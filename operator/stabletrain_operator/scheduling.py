"""Pods of an attempt the scheduler cannot place: the Unschedulable condition, the Event, and
the count `kubectl get stj` shows, from the pods' own PodScheduled conditions.

Without a queue that admits a job whole, part of an attempt can run (holding its nodes)
while the rest waits. After spec.scheduling.unschedulableSeconds the job says which pods
wait and the scheduler's own words for why; spec.scheduling.whenUnschedulable decides
whether it keeps waiting or releases the placed pods (machine.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from stabletrain_operator.api.constants import ConditionType, Reason
from stabletrain_operator.api.spec import SchedulingSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.entries import condition, set_condition
from stabletrain_operator.conditions.job import Stamp
from stabletrain_operator.observe.pod_facts import PodFacts

MESSAGE_MAX = 1024


@dataclass(frozen=True)
class Stuck:
    """Pods unschedulable for longer than the bound, and what the scheduler says."""

    pods: tuple[str, ...]
    message: str


def stuck_pods(
    pods: Sequence[PodFacts], attempt: int, now: datetime, scheduling: SchedulingSpec
) -> Stuck | None:
    bound = timedelta(seconds=scheduling.unschedulable_seconds)
    waiting = sorted(
        (p for p in pods if p.attempt == attempt and p.unschedulable is not None
         and p.created_at is not None and now - p.created_at >= bound),
        key=lambda p: p.rank,
    )  # fmt: skip
    if not waiting:
        return None
    said = sorted({str(p.unschedulable) for p in waiting})
    names = tuple(p.name for p in waiting)
    message = (
        f"pod(s) {', '.join(names)} of attempt {attempt} unschedulable for over "
        f"{scheduling.unschedulable_seconds} s: {' | '.join(said)}"
    )
    return Stuck(names, message[:MESSAGE_MAX])


def said(
    status: StableTrainingJobStatus, stamp: Stamp, stuck: Stuck | None
) -> tuple[StableTrainingJobStatus, tuple[tuple[str, str, str], ...]]:
    """The condition and count for `stuck`, and (type, reason, message) of the Event when
    the pods became stuck or got their nodes."""
    before = condition(status.conditions, ConditionType.UNSCHEDULABLE)
    was_stuck = before is not None and before.status == "True"
    if stuck is None:
        if not was_stuck:
            return status, ()
        message = "every pod that waited has a node now"
        conditions = set_condition(status.conditions, ConditionType.UNSCHEDULABLE, False,
                                   Reason.SCHEDULED, message, now=stamp.now,
                                   generation=stamp.generation)  # fmt: skip
        changed = status.model_copy(update={"conditions": conditions, "unschedulable_pods": None})
        return changed, (("Normal", Reason.SCHEDULED, message),)
    conditions = set_condition(status.conditions, ConditionType.UNSCHEDULABLE, True,
                               Reason.UNSCHEDULABLE, stuck.message, now=stamp.now,
                               generation=stamp.generation)  # fmt: skip
    changed = status.model_copy(
        update={"conditions": conditions, "unschedulable_pods": len(stuck.pods)}
    )
    news = before is None or before.message != stuck.message or not was_stuck
    return changed, ((("Warning", Reason.UNSCHEDULABLE, stuck.message),) if news else ())
