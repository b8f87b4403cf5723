"""Tiny-GPT jobs queued in a real Kueue (tests/support/kueue.py) on the local node: admitted
whole, one at a time within the quota, the admission kept through a rollback, and a
preemption handled as a suspend that saves first and resumes from that save."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from support.controlplane import ControlPlane
from support.kubectl_table import kubectl_get, rows
from support.kueue import KueueObjects, condition, is_true
from support.kueue_queues import queues
from support.localnode import LocalCluster
from support.operator import Jobs
from support.timeline import Recorder
from support.tinygpt import StepLogs, job_manifest

Json = dict[str, Any]
EVERY = 25
"""The example's checkpoints.intervalSteps."""
ARCH = {"kubernetes.io/arch": "amd64"}
"""The flavor's node labels (every local node has them): admitted pods must carry them."""


def queued(name: str, queue: str, env: dict[str, str | None], priority: str = "") -> Json:
    """The example's job asking for one CPU per pod in `queue`, its PFS tier in a directory
    of its own (two jobs share the claim)."""
    manifest = job_manifest(name, {"TINYGPT_STEP_SECONDS": "0.05", **env})
    manifest["spec"]["checkpoints"]["pfs"]["subPath"] = name
    container = manifest["spec"]["workers"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "1"}}
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    manifest["metadata"]["labels"] = labels
    return manifest


def workload_of(objects: KueueObjects, namespace: str, job: str) -> Json:
    (found,) = [w for w in objects.workloads(namespace)
                if w["metadata"]["ownerReferences"][0]["name"] == job]  # fmt: skip
    return found


def finished_workload(objects: KueueObjects, namespace: str, job: str) -> Json:
    """The job's Workload once Finished: the operator declares it right after the status
    write that ends the job."""
    deadline = time.monotonic() + 30
    while True:
        workload = workload_of(objects, namespace, job)
        if is_true(workload, "Finished") or time.monotonic() > deadline:
            return workload
        time.sleep(0.5)


def row(table: str, job: str) -> dict[str, str]:
    return rows(table)[job]


@pytest.mark.usefixtures("kueue_operator", "local_cluster")
def test_a_second_job_waits_for_the_quota_through_the_firsts_rollback(
    kueue_objects: KueueObjects,
    jobs: Jobs,
    job_namespace: str,
    api_client: client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    with queues(kueue_objects, job_namespace, cpu="2", node_labels=ARCH) as made:
        with Recorder(api_client, job_namespace, "first") as recorder:
            # 170 steps: the poisoned shard spikes the loss at 129 and the default policy
            # rolls back to step 25; the resumed run passes the old onset before it ends.
            jobs.create(queued("first", made.local_queue, {"TINYGPT_STEPS": "170"}))
            jobs.wait("first", lambda s: (s.get("queue") or {}).get("state") == "Admitted", 60,
                      "the first job to be admitted")  # fmt: skip
            healthy = {"TINYGPT_STEPS": "40", "TINYGPT_POISON_SHARDS": None}
            jobs.create(queued("second", made.local_queue, healthy))
            jobs.wait("second", lambda s: (s.get("queue") or {}).get("state") == "Queued", 60,
                      "the second job to wait")  # fmt: skip
            table = kubectl_get(control_plane, "stj", "-n", job_namespace)
            print(f"\n{table}")
            assert row(table, "first")["QUEUE"] == "Admitted"
            assert (row(table, "second")["STATE"], row(table, "second")["QUEUE"]) == (
                "Pending", "Queued",
            )  # fmt: skip
            seen_second: set[str] = set()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                first = jobs.status("first")
                if first.get("phase") in ("Succeeded", "Failed"):
                    break
                second = jobs.status("second")
                seen_second.add(f"{second.get('phase')}/{second['queue']['state']}")
                assert jobs.pods("second") == [], "no pod of the second job before admission"
                time.sleep(0.5)
        assert first["phase"] == "Succeeded", first.get("conditions")
        assert seen_second == {"Pending/Queued"}, seen_second
        phases = [phase for _, phase, _ in recorder.phases()]
        assert phases[phases.index("Stopping"):][:4] == [
            "Stopping", "Planning", "Relaunching", "Confirming",
        ], "the first job's rollback ran while the second waited"  # fmt: skip
        (rollback,) = [e for e in first["rollbackHistory"] if e["action"] == "Rollback"]
        assert rollback["toStep"] == 25
        first_workload = finished_workload(kueue_objects, job_namespace, "first")
        assert condition(first_workload, "Requeued") is None, "admitted once, never given back"
        finished = condition(first_workload, "Finished")
        assert finished is not None
        assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
        pods_ready = condition(first_workload, "PodsReady")
        assert pods_ready is not None
        assert (pods_ready["status"], pods_ready["reason"]) == ("True", "Recovered")
        for pod in jobs.pods("first"):
            assert pod["spec"]["nodeSelector"] == ARCH, "placed by the admitted flavor"

        second = jobs.wait("second", lambda s: s.get("phase") in ("Succeeded", "Failed"), 300,
                           "the second job to run after the first")  # fmt: skip
        assert second["phase"] == "Succeeded", second.get("conditions")
        second_workload = finished_workload(kueue_objects, job_namespace, "second")
        reserved = condition(second_workload, "QuotaReserved")
        assert reserved is not None
        assert reserved["lastTransitionTime"] >= finished["lastTransitionTime"], (
            "admitted only once the first job's Workload was finished"
        )
        assert is_true(second_workload, "Finished")
        reasons = [e["reason"] for e in jobs.events("second")]
        assert reasons.index("Queued") < reasons.index("Admitted") < reasons.index("Created")
        print(
            f"first finished {finished['lastTransitionTime']}, second admitted "
            f"{reserved['lastTransitionTime']}; second seen as {sorted(seen_second)}"
        )


@pytest.mark.usefixtures("kueue_operator")
def test_a_higher_priority_job_preempts_and_the_lower_resumes_from_its_save(
    kueue_objects: KueueObjects, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster,
    control_plane: ControlPlane,
) -> None:  # fmt: skip
    logs = StepLogs(local_cluster.shared_dir, job_namespace, claim="pfs/low")
    with queues(kueue_objects, job_namespace, cpu="2",
                priorities={"low": 100, "high": 1000}) as made:  # fmt: skip
        low_class, high_class = made.priority_classes
        healthy = {"TINYGPT_POISON_SHARDS": None}
        jobs.create(queued("low", made.local_queue, {**healthy, "TINYGPT_STEPS": "120"},
                           low_class))  # fmt: skip
        jobs.wait("low", lambda s: (s.get("step") or 0) > 40, 300, "the low job to train")
        jobs.create(queued("high", made.local_queue, {**healthy, "TINYGPT_STEPS": "30"},
                           high_class))  # fmt: skip
        evicted = jobs.wait("low", lambda s: s.get("phase") == "Suspended", 240,
                            "the low job to save and stop")  # fmt: skip
        assert evicted["queue"]["state"] == "Evicted"
        conditions = {c["type"]: c for c in evicted["conditions"]}
        assert (conditions["Admitted"]["status"], conditions["Admitted"]["reason"]) == (
            "False", "Preempted",
        ), "Kueue's own reason"  # fmt: skip
        assert conditions["Suspended"]["reason"] == "Evicted"
        saved_message = conditions["Suspended"]["message"]
        assert "every pod saved the final checkpoint of step" in saved_message, saved_message
        saved = int(saved_message.split("final checkpoint of step ")[1].split()[0])
        evicted_events = [e["message"] for e in jobs.events("low") if e["reason"] == "Evicted"]
        assert any("Preempted" in m for m in evicted_events), evicted_events
        table = kubectl_get(control_plane, "stj", "-n", job_namespace)
        print(f"\n{table}")
        assert (row(table, "low")["STATE"], row(table, "low")["QUEUE"]) == (
            "Suspended", "Evicted",
        )  # fmt: skip

        high = jobs.wait("high", lambda s: s.get("phase") in ("Succeeded", "Failed"), 300,
                         "the high job to run")  # fmt: skip
        assert high["phase"] == "Succeeded", high.get("conditions")
        low = jobs.wait("low", lambda s: s.get("phase") in ("Succeeded", "Failed"), 400,
                        "the low job to be admitted again and finish")  # fmt: skip
        assert low["phase"] == "Succeeded", low.get("conditions")
        assert low["counters"]["restarts"] == low["counters"]["rollbacks"] == 0

    before = logs.steps(0)
    starts = [[e for e in logs.events(1, rank) if e["event"] == "start"] for rank in (0, 1)]
    assert [len(s) for s in starts] == [1, 1], starts
    (restored,) = {s[0]["restored_step"] for s in starts}
    # The pods train on between the final save and their stop; an interval save reached in
    # that gap is newer and is the one restored (as spec.suspend, tests/e2e/test_suspend.py).
    assert restored == saved or (saved < restored and restored % EVERY == 0), (saved, restored)
    reached = max(r["step"] for r in before)
    assert logs.steps(1)[0]["step"] == restored + 1
    assert reached - restored <= EVERY, "no step before the save is trained twice beyond it"
    assert logs.steps(1)[-1]["step"] == 120
    print(f"low job: trained to step {reached}, saved {saved}, resumed from {restored} "
          f"({reached - restored} steps trained twice)")  # fmt: skip
