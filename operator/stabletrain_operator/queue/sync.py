"""The reconcile's side of a queued job: its admission read from the Workload (and the
admitted flavors, read once per admission), and the Workload writes carried out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.queue.admission import Admission, Placement, admission_of, placement_of
from stabletrain_operator.queue.api import KueueApi
from stabletrain_operator.queue.facts import WorkloadFacts
from stabletrain_operator.queue.workload import (
    RESOURCE_IN_USE_FINALIZER,
    build_workload,
    workload_name,
)
from stabletrain_operator.queue.workload_status import WorkloadWrites


@dataclass
class QueueMemory:
    """Placements of the flavors this job was admitted into, read once each."""

    placements: dict[tuple[str, ...], Placement] = field(default_factory=dict)


@dataclass(frozen=True)
class QueuedJob:
    name: str
    namespace: str
    uid: str
    labels: dict[str, str]
    queue: str

    @property
    def workload(self) -> str:
        return workload_name(self.name, self.uid)


def own_workload(job: QueuedJob, workloads: Iterable[WorkloadFacts]) -> WorkloadFacts | None:
    """The job's Workload (by its name: a Workload of an earlier job of the same name, which
    garbage collection has not removed yet, is not this job's)."""
    return next((w for w in workloads if w.name == job.workload), None)


def read_admission(
    api: KueueApi, job: QueuedJob, facts: WorkloadFacts | None, memory: QueueMemory
) -> Admission:
    placement = None
    if facts is not None and facts.admitted and facts.flavors:
        placement = memory.placements.get(facts.flavors)
        if placement is None:
            flavors = [api.flavor(name) for name in facts.flavors]
            placement = placement_of([f for f in flavors if f is not None])
            memory.placements[facts.flavors] = placement
    return admission_of(job.queue, job.workload, facts, placement)


def carry_out(
    api: KueueApi,
    job: QueuedJob,
    spec: StableTrainingJobSpec,
    writes: WorkloadWrites,
    facts: WorkloadFacts | None,
) -> list[tuple[str, str, str]]:
    """The writes, and (type, reason, message) of the Events they call for."""
    events: list[tuple[str, str, str]] = []
    if writes.create:
        body = build_workload(
            job=job.name, namespace=job.namespace, uid=job.uid, spec=spec, queue=job.queue,
            priority=api.priority(job.labels, spec),
        )  # fmt: skip
        if api.create_workload(body):
            message = f"created Workload {job.workload} in LocalQueue {job.queue}"
            events.append(("Normal", Reason.WORKLOAD_CREATED, message))
    if facts is None:
        return events
    if writes.status_patch is not None:
        patched = api.patch_workload_status(job.namespace, facts.name, writes.status_patch)
        if patched and writes.finishes:
            message = f"Workload {facts.name} is declared finished: its quota is released"
            events.append(("Normal", Reason.WORKLOAD_FINISHED, message))
    if writes.drop_finalizer:
        kept = [f for f in facts.finalizers if f != RESOURCE_IN_USE_FINALIZER]
        patch = {"metadata": {"resourceVersion": facts.resource_version, "finalizers": kept}}
        api.patch_workload(job.namespace, facts.name, patch)
    return events
