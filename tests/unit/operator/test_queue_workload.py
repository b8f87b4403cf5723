"""The Workload a queued job asks Kueue for, and what a Workload's status tells the job."""

from __future__ import annotations

import hashlib

from operator_builders import spec

from stabletrain_operator.queue.facts import Eviction, workload_facts
from stabletrain_operator.queue.workload import Priority, build_workload, workload_name

UID = "3f0c7c3e-1111-2222-3333-444455556666"


def test_name_is_kueues_own_for_the_job() -> None:
    """Kueue's GetWorkloadNameForOwnerWithGVK: `<kind lowercase>-<name>-<5 hex>` of
    sha1("Kind\\ngroup\\nname\\nuid")."""
    digest = hashlib.sha1(f"StableTrainingJob\nstabletrain.dev\ntrain\n{UID}".encode())
    assert workload_name("train", UID) == f"stabletrainingjob-train-{digest.hexdigest()[:5]}"
    assert len(workload_name("x" * 300, UID)) == 253


def test_one_pod_set_of_every_worker_with_the_templates_requests_and_placement() -> None:
    container = {"name": "trainer", "command": ["torchrun", "t.py"],
                 "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "8"}}}  # fmt: skip
    template = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {
            "containers": [container],
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "high",
        },
    }
    job = spec(workers={"nodes": 4, "template": template})
    body = build_workload(
        job="train", namespace="ns", uid=UID, spec=job, queue="team-a",
        priority=Priority(1000, "PriorityClass", "high"),
    )  # fmt: skip
    metadata = body["metadata"]
    assert body["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert metadata["name"] == workload_name("train", UID)
    assert metadata["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
    assert metadata["labels"] == {"kueue.x-k8s.io/job-uid": UID}
    (owner,) = metadata["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "StableTrainingJob", "train", UID, True,
    )  # fmt: skip
    (pod_set,) = body["spec"]["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("workers", 4)
    pod_spec = pod_set["template"]["spec"]
    assert pod_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert pod_spec["nodeSelector"] == {"pool": "h100"}
    assert pod_spec["tolerations"][0]["key"] == "gpu"
    assert pod_set["template"]["metadata"] == {"labels": {"team": "a"}}
    assert body["spec"]["queueName"] == "team-a"
    assert body["spec"]["priority"] == 1000
    assert body["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high",
    }  # fmt: skip
    workload_class = Priority(5, "WorkloadPriorityClass", "urgent").spec()
    assert workload_class["priorityClassRef"]["group"] == "kueue.x-k8s.io"
    assert Priority(0).spec() == {"priority": 0}


def _workload(conditions: list[dict[str, str]], admission: dict[str, object] | None) -> dict:
    status: dict[str, object] = {"conditions": conditions}
    if admission is not None:
        status["admission"] = admission
    return {
        "metadata": {
            "name": "stabletrainingjob-train-abcde", "resourceVersion": "7",
            "finalizers": ["kueue.x-k8s.io/resource-in-use"],
            "ownerReferences": [{"kind": "StableTrainingJob", "name": "train",
                                 "controller": True}],
        },
        "spec": {"queueName": "team-a"},
        "status": status,
    }  # fmt: skip


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "on-demand", "gpu": "h100"}}],
}


def test_facts_of_an_admitted_then_evicted_workload() -> None:
    admitted = workload_facts(
        _workload(
            [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
            ADMISSION,
        )
    )
    assert admitted is not None
    assert (admitted.job, admitted.admitted, admitted.quota_reserved) == ("train", True, True)
    assert admitted.cluster_queue == "cq"
    assert admitted.flavors == ("h100", "on-demand")
    assert admitted.eviction is None
    evicted = workload_facts(
        _workload(
            [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"},
             {"type": "Evicted", "status": "True", "reason": "Preempted",
              "message": "Preempted to accommodate a workload (UID: u) due to prioritization"}],
            ADMISSION,
        )
    )  # fmt: skip
    assert evicted is not None
    assert evicted.eviction == Eviction(
        "Preempted", "Preempted to accommodate a workload (UID: u) due to prioritization"
    )
    waiting = workload_facts(
        _workload([{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                    "message": "couldn't assign flavors to pod set workers"}], None)
    )  # fmt: skip
    assert waiting is not None
    assert not waiting.admitted
    assert waiting.waiting == "couldn't assign flavors to pod set workers"
    foreign = _workload([], None)
    foreign["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "x", "controller": True}]
    assert workload_facts(foreign) is None, "a batch Job's Workload is not a StableTrainingJob's"
