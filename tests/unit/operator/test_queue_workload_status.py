"""The Workload writes a job owes Kueue (what Kueue's jobframework does for its own jobs)."""

from __future__ import annotations

from datetime import timedelta

from operator_builders import T0

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.queue.facts import Eviction, WorkloadFacts
from stabletrain_operator.queue.workload_status import pods_ready, workload_writes

RESERVED = ({"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
             "message": "Quota reserved in ClusterQueue cq",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok",
             "lastTransitionTime": "2026-01-01T00:00:00Z"})  # fmt: skip


def facts(**changes: object) -> WorkloadFacts:
    base: dict[str, object] = {
        "name": "wl", "job": "job", "resource_version": "41", "queue": "lq",
        "quota_reserved": True, "admitted": True, "finished": False, "eviction": None,
        "cluster_queue": "cq", "flavors": ("default",), "waiting": "", "pods_ready": None,
        "conditions": RESERVED, "finalizers": ("kueue.x-k8s.io/resource-in-use",),
        "deleting": False,
    }  # fmt: skip
    base.update(changes)
    return WorkloadFacts(**base)  # type: ignore[arg-type]


def by_type(patch: dict[str, object]) -> dict[str, dict[str, str]]:
    status = patch["status"]
    assert isinstance(status, dict)
    return {c["type"]: c for c in status["conditions"]}


def test_pods_ready_follows_kueues_reasons_through_a_recovery() -> None:
    assert pods_ready(None, admitted=False, ready=False) == (False, "WaitForStart")
    assert pods_ready(None, admitted=True, ready=False) == (False, "WaitForStart")
    assert pods_ready(None, admitted=True, ready=True) == (True, "Started")
    assert pods_ready(("True", "Started"), admitted=True, ready=False) == (False, "WaitForRecovery")
    assert pods_ready(("False", "WaitForRecovery"), admitted=True, ready=False) == (
        False, "WaitForRecovery",
    )  # fmt: skip
    assert pods_ready(("False", "WaitForRecovery"), admitted=True, ready=True) == (
        True, "Recovered",
    )  # fmt: skip


def test_admitted_running_job_reports_pods_ready_once_fenced_by_version() -> None:
    writes = workload_writes(Phase.RUNNING, facts(), pods_left=True, pods_ready=True,
                             end_message="", now=T0)  # fmt: skip
    assert writes.status_patch is not None
    assert writes.status_patch["metadata"] == {"resourceVersion": "41"}
    ready = by_type(writes.status_patch)["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("True", "Started")
    assert set(by_type(writes.status_patch)) == {"QuotaReserved", "Admitted", "PodsReady"}
    again = workload_writes(Phase.RUNNING, facts(pods_ready=("True", "Started")), pods_left=True,
                            pods_ready=True, end_message="", now=T0)  # fmt: skip
    assert again.status_patch is None, "written only when it changes"


def test_a_rollback_keeps_the_admission_and_says_it_waits_for_recovery() -> None:
    """Stopping, Planning, Relaunching: the Workload is neither finished nor given back."""
    running = facts(pods_ready=("True", "Started"))
    for phase in (Phase.STOPPING, Phase.PLANNING, Phase.RELAUNCHING):
        writes = workload_writes(phase, running, pods_left=phase is Phase.STOPPING,
                                 pods_ready=False, end_message="", now=T0)  # fmt: skip
        assert writes.status_patch is not None
        conditions = by_type(writes.status_patch)
        assert (conditions["PodsReady"]["status"], conditions["PodsReady"]["reason"]) == (
            "False", "WaitForRecovery",
        )  # fmt: skip
        assert conditions["QuotaReserved"]["status"] == "True"
        assert "Finished" not in conditions
        assert "admission" not in writes.status_patch["status"]


def test_after_an_eviction_the_quota_goes_back_only_once_no_pod_is_left() -> None:
    evicted = facts(eviction=Eviction("Preempted", "preempted by a higher priority"))
    saving = workload_writes(Phase.RUNNING, evicted, pods_left=True, pods_ready=True,
                             end_message="", now=T0)  # fmt: skip
    assert saving.status_patch is None, "the pods still save"
    stopping = workload_writes(Phase.STOPPING, evicted, pods_left=False, pods_ready=False,
                               end_message="", now=T0)  # fmt: skip
    assert stopping.status_patch is None, "pods may still be on their way out"
    later = T0 + timedelta(seconds=30)
    stopped = workload_writes(Phase.SUSPENDED, evicted, pods_left=False, pods_ready=False,
                              end_message="", now=later)  # fmt: skip
    patch = stopped.status_patch
    assert patch is not None
    assert patch["status"]["admission"] is None
    conditions = by_type(patch)
    assert (conditions["QuotaReserved"]["status"], conditions["QuotaReserved"]["reason"]) == (
        "False", "Pending",
    )  # fmt: skip
    assert conditions["QuotaReserved"]["lastTransitionTime"] == "2026-01-01T00:00:30Z"
    assert (conditions["Admitted"]["status"], conditions["Admitted"]["reason"]) == (
        "False", "NoReservation",
    )  # fmt: skip
    assert (conditions["Requeued"]["status"], conditions["Requeued"]["reason"]) == (
        "True", "Preempted",
    )  # fmt: skip
    # No WaitForRecovery left for Kueue's recoveryTimeout to time from before the eviction.
    assert (conditions["PodsReady"]["status"], conditions["PodsReady"]["reason"]) == (
        "False", "WaitForStart",
    )  # fmt: skip
    timeout = facts(eviction=Eviction("PodsReadyTimeout", "pods not ready in time"))
    released = workload_writes(Phase.RELAUNCHING, timeout, pods_left=False, pods_ready=False,
                               end_message="", now=T0).status_patch  # fmt: skip
    assert released is not None
    assert by_type(released)["Requeued"]["status"] == "False", "jobframework: only preemption"


def test_an_ended_job_finishes_its_workload_then_drops_the_finalizer() -> None:
    done = workload_writes(Phase.SUCCEEDED, facts(), pods_left=True, pods_ready=True,
                           end_message="every worker of attempt 1 succeeded", now=T0)  # fmt: skip
    assert done.finishes
    assert done.status_patch is not None
    finished = by_type(done.status_patch)["Finished"]
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    failed = workload_writes(Phase.FAILED, facts(), pods_left=False, pods_ready=False,
                             end_message="budget", now=T0).status_patch  # fmt: skip
    assert failed is not None
    assert by_type(failed)["Finished"]["reason"] == "Failed"
    after = workload_writes(Phase.SUCCEEDED, facts(finished=True), pods_left=False,
                            pods_ready=False, end_message="", now=T0)  # fmt: skip
    assert after.drop_finalizer
    assert after.status_patch is None


def test_a_workload_not_admitted_says_its_pods_wait_for_start_once() -> None:
    waiting = facts(quota_reserved=False, admitted=False, conditions=())
    writes = workload_writes(Phase.PENDING, waiting, pods_left=False, pods_ready=False,
                             end_message="", now=T0)  # fmt: skip
    assert writes.status_patch is not None
    ready = by_type(writes.status_patch)["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("False", "WaitForStart")
    said = facts(quota_reserved=False, admitted=False, pods_ready=("False", "WaitForStart"))
    assert workload_writes(Phase.PENDING, said, pods_left=False, pods_ready=False,
                           end_message="", now=T0).status_patch is None  # fmt: skip


def test_a_new_job_creates_its_workload_and_an_ended_one_does_not() -> None:
    assert workload_writes(Phase.PENDING, None, pods_left=False, pods_ready=False,
                           end_message="", now=T0).create  # fmt: skip
    assert not workload_writes(Phase.SUCCEEDED, None, pods_left=False, pods_ready=False,
                               end_message="", now=T0).create  # fmt: skip
