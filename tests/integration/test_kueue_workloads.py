"""The operator beside a real Kueue manager (tests/support/kueue.py): a job without the
queue-name label never meets Kueue, and a queued job's Workload goes with the job."""

from __future__ import annotations

import time
from typing import Any

from support.kueue import KueueManager, KueueObjects
from support.kueue_queues import queues
from support.operator import Jobs, OperatorProcess, job_manifest

CPU = {"requests": {"cpu": "1"}}


def queued_manifest(name: str, queue: str | None, steps: str = "30") -> dict[str, Any]:
    manifest = job_manifest(name, {"ST_STEPS": steps, "ST_STEP_SECONDS": "0.1"})
    manifest["spec"]["workers"]["template"]["spec"]["containers"][0]["resources"] = CPU
    if queue is not None:
        manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    return manifest


def test_a_job_without_the_queue_label_is_untouched_by_kueue(
    kueue_operator: OperatorProcess, kueue: KueueManager, kueue_objects: KueueObjects,
    jobs: Jobs, job_namespace: str,
) -> None:  # fmt: skip
    with queues(kueue_objects, job_namespace, cpu="0"):
        jobs.create(queued_manifest("free", None))
        done = jobs.wait("free", lambda s: s.get("phase") in ("Succeeded", "Failed"), 120,
                         "the unqueued job to run to the end")  # fmt: skip
        assert done["phase"] == "Succeeded", done.get("conditions")
        assert "queue" not in done
        assert not [c for c in done["conditions"] if c["type"] == "Admitted"]
        assert kueue_objects.workloads(job_namespace) == [], "Kueue never saw it"
        for pod in jobs.pods("free"):
            assert not [k for k in pod["metadata"].get("labels", {}) if "kueue" in k]
            assert not pod["spec"].get("schedulingGates")
    assert kueue.process is not None
    assert kueue.process.alive()


def test_a_queued_job_waits_and_deleting_it_leaves_no_workload(
    kueue_operator: OperatorProcess, kueue_objects: KueueObjects, jobs: Jobs,
    job_namespace: str,
) -> None:  # fmt: skip
    with queues(kueue_objects, job_namespace, cpu="1") as made:  # a 2-pod job needs 2
        jobs.create(queued_manifest("waiting", made.local_queue))
        status = jobs.wait("waiting", lambda s: (s.get("queue") or {}).get("state") == "Queued",
                           60, "the job to be queued")  # fmt: skip
        assert status["phase"] == "Pending"
        deadline = time.monotonic() + 30
        while not kueue_objects.workloads(job_namespace) and time.monotonic() < deadline:
            time.sleep(0.2)
        made_workloads = kueue_objects.workloads(job_namespace)
        assert len(made_workloads) == 1, kueue_operator.log()[-3000:]
        (workload,) = made_workloads
        assert status["queue"]["workload"] == workload["metadata"]["name"]
        assert workload["metadata"]["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
        (owner,) = workload["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("StableTrainingJob", "waiting")
        (pod_set,) = workload["spec"]["podSets"]
        assert pod_set["count"] == 2
        assert pod_set["template"]["spec"]["containers"][0]["resources"] == CPU
        admitted = [c for c in status["conditions"] if c["type"] == "Admitted"]
        assert admitted[0]["status"] == "False"
        time.sleep(3)
        assert jobs.pods("waiting") == [], "no pod before admission"
        reasons = [e["reason"] for e in jobs.events("waiting")]
        assert "WorkloadCreated" in reasons
        assert "Queued" in reasons

        jobs.custom.delete_namespaced_custom_object(
            "stabletrain.dev", "v1alpha1", job_namespace, "stabletrainingjobs", "waiting"
        )
        deadline = time.monotonic() + 60
        while kueue_objects.workloads(job_namespace) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert kueue_objects.workloads(job_namespace) == [], "the Workload went with the job"
