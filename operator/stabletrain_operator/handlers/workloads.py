"""Kueue Workloads (imported only with --kueue): an index of the Workloads jobs own, the
wake-up of a job's daemon when its Workload changes, and the release of a deleted job's
Workloads.

The daemon reads its Workload from the index each tick, as it reads its pods, so admission,
eviction and readmission reach it within a watch event and cost no GET. Kueue's
resource-in-use finalizer on a Workload is the job controller's to remove (Kueue's
jobframework removes it when the job is deleted); without that, the job's deletion would
leave its Workload Terminating for good.
"""

from __future__ import annotations

from typing import Any

import kopf

from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.handlers.pod_index import PodKey
from stabletrain_operator.queue.api import KueueApi
from stabletrain_operator.queue.facts import WorkloadFacts, workload_facts
from stabletrain_operator.queue.workload import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    RESOURCE_IN_USE_FINALIZER,
    WORKLOADS,
)


@kopf.on.startup()
def kueue_api(memo: kopf.Memo, **_: Any) -> None:
    memo["kueue"] = KueueApi(memo["kube"].api)  # one pool of connections for both


@kopf.index(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS)
async def job_workloads(
    namespace: str | None, body: kopf.Body, **_: Any
) -> dict[PodKey, WorkloadFacts] | None:
    facts = workload_facts(body)
    if facts is None or namespace is None:
        return None
    return {(namespace, facts.job): facts}


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS)
async def wake_for_workload(namespace: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    facts = workload_facts(body)
    if namespace is not None and facts is not None:
        memo["wakeups"].wake((namespace, facts.job))


@kopf.on.delete(GROUP, VERSION, PLURAL)
def release_workloads(namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    """The deleted job's Workloads lose Kueue's finalizer; garbage collection removes them."""
    if namespace is None:
        return
    kueue: KueueApi = memo["kueue"]
    job_workloads: kopf.Index[PodKey, WorkloadFacts] = kwargs["job_workloads"]
    for facts in job_workloads.get((namespace, name), []):
        if RESOURCE_IN_USE_FINALIZER not in facts.finalizers:
            continue
        kept = [f for f in facts.finalizers if f != RESOURCE_IN_USE_FINALIZER]
        patch = {"metadata": {"resourceVersion": facts.resource_version, "finalizers": kept}}
        if not kueue.patch_workload(namespace, facts.name, patch):
            raise kopf.TemporaryError(f"Workload {facts.name} changed; retrying", delay=1)
