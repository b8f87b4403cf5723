"""The Workload status writes a job's controller owes Kueue, as pure functions.

As Kueue's jobframework reconciler does for its built-in jobs:
- PodsReady (read by Kueue's waitForPodsReady): False/WaitForStart until every pod of the
  admitted job runs, True/Started then, False/WaitForRecovery while a recovery replaces
  pods, True/Recovered when they run again;
- after an eviction, once no pod of the job is left, the admission is cleared (QuotaReserved
  False with reason Pending, the Admitted condition synced, Requeued set; True only for a
  preemption or a node failure): that is what returns the quota to the ClusterQueue;
- Finished (Succeeded or Failed) when the job ends, then the resource-in-use finalizer goes.

Each is a JSON merge patch of the status subresource carrying the whole conditions list and
fenced by the resourceVersion it was computed from, so a concurrent write by Kueue makes it
fail (409) instead of being overwritten; the next tick computes it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.queue.facts import WorkloadFacts
from stabletrain_operator.queue.workload import RESOURCE_IN_USE_FINALIZER

Json = dict[str, Any]

NOT_READY = "Not all pods are ready or succeeded"
RECOVERING = "At least one pod has failed, waiting for recovery"
READY = "All pods reached readiness and the workload is running"
REQUEUED_REASONS = frozenset({"Preempted", "NodeFailures"})
"""Evictions after which Kueue's Requeued condition is True (jobframework's rule)."""
ENDED = frozenset({Phase.SUCCEEDED, Phase.FAILED})
PODS_MAY_RUN = frozenset({Phase.RUNNING, Phase.CONFIRMING, Phase.STOPPING})
"""Phases in which pods of the job may exist or be on their way: the quota is not given
back in them, even when the pod index shows none yet."""


def _time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def with_condition(
    conditions: Sequence[Mapping[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: datetime,
) -> list[Json]:
    """metav1 SetStatusCondition: the transition time moves only when the status flips."""
    wanted = "True" if status else "False"
    result: list[Json] = []
    found = False
    for condition in conditions:
        if condition.get("type") != kind:
            result.append(dict(condition))
            continue
        found = True
        changed = condition.get("status") != wanted
        when = _time(now) if changed else condition.get("lastTransitionTime", _time(now))
        result.append({**condition, "status": wanted, "reason": reason,
                       "message": message[:32_768], "lastTransitionTime": when})  # fmt: skip
    if not found:
        result.append({"type": kind, "status": wanted, "reason": reason,
                       "message": message[:32_768], "lastTransitionTime": _time(now)})  # fmt: skip
    return result


def _patch(facts: WorkloadFacts, status: Json) -> Json:
    return {"metadata": {"resourceVersion": facts.resource_version}, "status": status}


def pods_ready(current: tuple[str, str] | None, admitted: bool, ready: bool) -> tuple[bool, str]:
    """(status, reason) of PodsReady, as jobframework's generatePodsReadyCondition."""
    if not admitted:
        return False, "WaitForStart"
    if ready:
        recovering = current is not None and current[1] in ("WaitForRecovery", "Recovered")
        return True, "Recovered" if recovering else "Started"
    if current is not None and (current[0] == "True" or current[1] == "WaitForRecovery"):
        return False, "WaitForRecovery"
    return False, "WaitForStart"


def pods_ready_patch(facts: WorkloadFacts, ready: bool, now: datetime) -> Json | None:
    status, reason = pods_ready(facts.pods_ready, facts.admitted, ready)
    if facts.pods_ready == ("True" if status else "False", reason):
        return None
    message = READY if status else RECOVERING if reason == "WaitForRecovery" else NOT_READY
    conditions = with_condition(facts.conditions, "PodsReady", status, reason, message, now=now)
    return _patch(facts, {"conditions": conditions})


def release_patch(facts: WorkloadFacts, now: datetime) -> Json | None:
    """After an eviction the job stopped: give the quota back (jobframework step 6)."""
    if facts.eviction is None or not facts.quota_reserved:
        return None
    eviction = facts.eviction
    conditions = with_condition(
        facts.conditions, "Requeued", eviction.reason in REQUEUED_REASONS, eviction.reason,
        eviction.message, now=now,
    )  # fmt: skip
    conditions = with_condition(conditions, "QuotaReserved", False, "Pending", eviction.message,
                                now=now)  # fmt: skip
    # Not admitted: WaitForStart, as jobframework says. A WaitForRecovery left from before
    # the eviction would be timed from its old transition by Kueue's recoveryTimeout as soon
    # as the Workload is admitted again, and evict it at once.
    conditions = with_condition(conditions, "PodsReady", False, "WaitForStart", NOT_READY,
                                now=now)  # fmt: skip
    if facts.admitted:
        conditions = with_condition(conditions, "Admitted", False, "NoReservation",
                                    "The workload has no reservation", now=now)  # fmt: skip
    return _patch(facts, {"conditions": conditions, "admission": None})


def finish_patch(facts: WorkloadFacts, succeeded: bool, message: str, now: datetime) -> Json:
    reason = "Succeeded" if succeeded else "Failed"
    conditions = with_condition(facts.conditions, "Finished", True, reason, message, now=now)
    return _patch(facts, {"conditions": conditions})


@dataclass(frozen=True)
class WorkloadWrites:
    """What this tick writes to the job's Workload (at most one status patch)."""

    create: bool = False
    status_patch: Json | None = None
    drop_finalizer: bool = False
    finishes: bool = False
    """The patch declares the Workload finished (an Event says so)."""


def workload_writes(
    phase: Phase,
    facts: WorkloadFacts | None,
    *,
    pods_left: bool,
    pods_ready: bool,
    end_message: str,
    now: datetime,
) -> WorkloadWrites:
    """The writes the job's state and its pods call for. `pods_left`: some pod of the job
    still exists; `pods_ready`: every pod of the current attempt runs or succeeded."""
    if facts is None:
        return WorkloadWrites(create=phase not in ENDED)
    in_use = RESOURCE_IN_USE_FINALIZER in facts.finalizers
    if facts.deleting or facts.finished:
        return WorkloadWrites(drop_finalizer=in_use and not (facts.deleting and pods_left))
    if phase in ENDED:
        patch = finish_patch(facts, phase is Phase.SUCCEEDED, end_message, now)
        return WorkloadWrites(status_patch=patch, finishes=True)
    if facts.eviction is not None:
        if pods_left or phase in PODS_MAY_RUN:
            return WorkloadWrites()
        return WorkloadWrites(status_patch=release_patch(facts, now))
    if not facts.admitted:
        return WorkloadWrites(status_patch=pods_ready_patch(facts, False, now))
    ready = pods_ready and phase in (Phase.RUNNING, Phase.CONFIRMING)
    return WorkloadWrites(status_patch=pods_ready_patch(facts, ready, now))
