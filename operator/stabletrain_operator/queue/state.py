"""status.queue and the Admitted condition from the Workload's state, and an Event whenever
the state changes: what `kubectl get stj` (QUEUE) and `kubectl describe` say about Kueue."""

from __future__ import annotations

import re
from dataclasses import dataclass

from stabletrain_operator.api.constants import ConditionType, Reason
from stabletrain_operator.api.status import QueueState, QueueStatus, StableTrainingJobStatus
from stabletrain_operator.conditions.entries import set_condition
from stabletrain_operator.conditions.job import Stamp
from stabletrain_operator.queue.admission import Admission

_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class Notice:
    type: str
    reason: str
    message: str


def _state(admission: Admission, previous: QueueStatus | None) -> QueueState:
    if admission.finished:
        return QueueState.FINISHED
    if admission.eviction is not None:
        return QueueState.EVICTED
    if admission.admitted:
        return QueueState.ADMITTED
    if previous is not None and previous.state is QueueState.EVICTED:
        return QueueState.EVICTED  # given back, waiting to be admitted again
    return QueueState.QUEUED


def _waiting(admission: Admission) -> str:
    said = f": {admission.waiting}" if admission.waiting else ""
    where = f"Workload {admission.workload}" if admission.workload else "its Workload"
    return f"{where} waits in LocalQueue {admission.local_queue} for admission{said}"


def observed(
    status: StableTrainingJobStatus, stamp: Stamp, admission: Admission
) -> tuple[StableTrainingJobStatus, tuple[Notice, ...]]:
    """`status` with the queue state of `admission`, and the Event of a change."""
    previous = status.queue
    state = _state(admission, previous)
    cluster_queue = admission.cluster_queue if state is QueueState.ADMITTED else None
    queue = QueueStatus(
        state=state,
        workload=admission.workload,
        local_queue=admission.local_queue,
        cluster_queue=cluster_queue,
    )
    admitted = state is QueueState.ADMITTED
    if state is QueueState.ADMITTED:
        reason: str = Reason.ADMITTED
        message = f"admitted by ClusterQueue {admission.cluster_queue}"
    elif state is QueueState.FINISHED:
        reason = Reason.WORKLOAD_FINISHED
        message = "the job ended and its Workload is finished: the quota is released"
    elif admission.eviction is not None:
        kueue_reason = admission.eviction.reason
        reason = kueue_reason if _REASON.match(kueue_reason) else Reason.EVICTED
        message = f"evicted by Kueue ({kueue_reason}): {admission.eviction.message}"
    elif state is QueueState.EVICTED:
        reason, message = Reason.EVICTED, f"evicted earlier; {_waiting(admission)}"
    else:
        reason, message = Reason.QUEUED, _waiting(admission)
    conditions = set_condition(
        status.conditions, ConditionType.ADMITTED, admitted, reason, message[:32_768],
        now=stamp.now, generation=stamp.generation,
    )  # fmt: skip
    updated = status.model_copy(update={"queue": queue, "conditions": conditions})
    if previous is not None and previous.state is state:
        return updated, ()
    if state is QueueState.ADMITTED:
        notice = Notice("Normal", Reason.ADMITTED, message)
    elif state is QueueState.EVICTED:
        notice = Notice("Warning", Reason.EVICTED, message)
    elif state is QueueState.QUEUED:
        notice = Notice("Normal", Reason.QUEUED, message)
    else:
        notice = Notice("Normal", Reason.WORKLOAD_FINISHED, message)
    return updated, (Notice(notice.type, notice.reason, notice.message[:1024]),)
