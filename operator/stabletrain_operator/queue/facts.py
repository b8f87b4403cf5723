"""What a Workload's status says, reduced to the facts the job's reconcile acts on.

Kueue's conditions (sigs.k8s.io/kueue apis/kueue/v1beta2 workload_types.go): QuotaReserved
(the ClusterQueue reserved the quota, `status.admission` says where), Admitted (reserved and
every admission check ready: the job may run), Evicted (Kueue wants the quota back: the job
must stop, and its controller then clears the admission), PodsReady (written by the job's
controller for waitForPodsReady) and Finished (written by the job's controller at the end).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stabletrain_operator.api.constants import KIND

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Eviction:
    """Kueue's Evicted condition: its own reason (Preempted, PodsReadyTimeout,
    ClusterQueueStopped, Deactivated, ...) and message."""

    reason: str
    message: str


@dataclass(frozen=True)
class WorkloadFacts:
    name: str
    job: str
    """The owning StableTrainingJob."""
    resource_version: str
    queue: str
    quota_reserved: bool
    admitted: bool
    finished: bool
    eviction: Eviction | None
    cluster_queue: str | None
    flavors: tuple[str, ...]
    """ResourceFlavors of the admission's pod-set assignments (empty while not admitted)."""
    waiting: str
    """Kueue's message while it is not admitted (why it waits)."""
    pods_ready: tuple[str, str] | None
    """(status, reason) of its PodsReady condition."""
    conditions: tuple[Json, ...]
    finalizers: tuple[str, ...]
    deleting: bool


def _condition(conditions: tuple[Json, ...], kind: str) -> Json | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def _true(conditions: tuple[Json, ...], kind: str) -> bool:
    found = _condition(conditions, kind)
    return found is not None and found.get("status") == "True"


def _owner(metadata: Json) -> str | None:
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == KIND and owner.get("controller"):
            return str(owner.get("name"))
    return None


def workload_facts(body: Json) -> WorkloadFacts | None:
    """Facts of a Workload a StableTrainingJob owns; None for any other Workload."""
    metadata = body.get("metadata") or {}
    job = _owner(metadata)
    if job is None:
        return None
    status = body.get("status") or {}
    conditions = tuple(status.get("conditions") or ())
    admission = status.get("admission") or {}
    flavors = sorted(
        {
            str(flavor)
            for assignment in admission.get("podSetAssignments") or []
            for flavor in (assignment.get("flavors") or {}).values()
        }
    )
    evicted = _condition(conditions, "Evicted")
    eviction = None
    if evicted is not None and evicted.get("status") == "True":
        eviction = Eviction(str(evicted.get("reason", "")), str(evicted.get("message", "")))
    admitted = _true(conditions, "Admitted")
    reserved = _condition(conditions, "QuotaReserved")
    waiting = "" if admitted else str((reserved or {}).get("message", ""))
    ready = _condition(conditions, "PodsReady")
    return WorkloadFacts(
        name=str(metadata.get("name", "")),
        job=job,
        resource_version=str(metadata.get("resourceVersion", "")),
        queue=str((body.get("spec") or {}).get("queueName", "")),
        quota_reserved=_true(conditions, "QuotaReserved"),
        admitted=admitted,
        finished=_true(conditions, "Finished"),
        eviction=eviction,
        cluster_queue=admission.get("clusterQueue") if admission else None,
        flavors=tuple(flavors),
        waiting=waiting,
        pods_ready=(str(ready.get("status")), str(ready.get("reason"))) if ready else None,
        conditions=conditions,
        finalizers=tuple(metadata.get("finalizers") or ()),
        deleting=bool(metadata.get("deletionTimestamp")),
    )
