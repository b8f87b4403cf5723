"""The Workload a queued job asks Kueue to admit: its name and the object the operator creates.

Kueue's built-in integrations (sigs.k8s.io/kueue pkg/controller/jobframework) create one
Workload per job, owned by the job, named `<kind>-<job>-<hash>` where the hash is the first
five hex digits of sha1(kind, group, name, uid); it carries the job's queue, its pod sets and
its priority, and Kueue's resource-in-use finalizer, which the job's controller removes once
the Workload is finished or the job is gone. The operator does the same for a
StableTrainingJob (an external framework to Kueue): one pod set, `workers`, of
`spec.workers.nodes` pods with the workers' template (its requests, node selector, affinity
and tolerations are what Kueue's flavors and quotas are matched against).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stabletrain_operator.api.constants import GROUP, KIND, VERSION
from stabletrain_operator.api.spec import StableTrainingJobSpec

Json = dict[str, Any]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
"""The version Kueue v0.17 stores Workloads in."""
WORKLOADS = "workloads"
RESOURCE_FLAVORS = "resourceflavors"
WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"
QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"
JOB_UID_LABEL = f"{KUEUE_GROUP}/job-uid"
RESOURCE_IN_USE_FINALIZER = f"{KUEUE_GROUP}/resource-in-use"
EXTERNAL_FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"
"""The name Kueue's `integrations.externalFrameworks` takes for this kind."""
POD_SET = "workers"
_HASH_LENGTH = 5
_MAX_NAME = 253


def queue_name(labels: Mapping[str, str] | None) -> str | None:
    """The LocalQueue a job asks for, or None for a job Kueue does not manage."""
    value = (labels or {}).get(QUEUE_LABEL)
    return value or None


def workload_name(job: str, uid: str) -> str:
    """The Workload's name as Kueue's GetWorkloadNameForOwnerWithGVK computes it."""
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job}\n{uid}".encode()).hexdigest()
    prefix = f"{KIND.lower()}-{job}"[: _MAX_NAME - 1 - _HASH_LENGTH]
    return f"{prefix}-{digest[:_HASH_LENGTH]}"


@dataclass(frozen=True)
class Priority:
    """What the Workload's spec.priorityClassRef and spec.priority say."""

    value: int
    kind: str | None = None
    """WorkloadPriorityClass or PriorityClass; None: no class (priority 0)."""
    name: str = ""

    def spec(self) -> Json:
        if self.kind is None:
            return {"priority": self.value}
        group = KUEUE_GROUP if self.kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
        ref = {"group": group, "kind": self.kind, "name": self.name}
        return {"priorityClassRef": ref, "priority": self.value}


def pod_set(spec: StableTrainingJobSpec) -> Json:
    """The one pod set: every worker pod, with the template's requests and placement."""
    template = copy.deepcopy(spec.workers.template)
    metadata = template.get("metadata") or {}
    return {
        "name": POD_SET,
        "count": spec.workers.nodes,
        "template": {
            "metadata": {k: metadata[k] for k in ("labels", "annotations") if metadata.get(k)},
            "spec": template["spec"],
        },
    }


def build_workload(
    *,
    job: str,
    namespace: str,
    uid: str,
    spec: StableTrainingJobSpec,
    queue: str,
    priority: Priority,
) -> Json:
    """The Workload of a queued job, owned by it (garbage collected with it)."""
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": job,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job, uid),
            "namespace": namespace,
            "labels": {JOB_UID_LABEL: uid},
            "finalizers": [RESOURCE_IN_USE_FINALIZER],
            "ownerReferences": [owner],
        },
        "spec": {"queueName": queue, "podSets": [pod_set(spec)], **priority.spec()},
    }
