"""The operator SIGKILLed in the middle of a real rollback in place, then started again: the
rollback completes exactly once (one history entry, one new attempt started once in each
kept pod, no pod created or deleted)."""

from __future__ import annotations

import os
import signal
import time

from kubernetes import client

from support.kept_pods import attempts_started
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess
from support.timeline import Recorder
from support.tinygpt import StepLogs, job_manifest

ROLLBACK_PHASES = ("Stopping", "Planning", "Relaunching")
"""Killed in whichever of these the watch shows first (Stopping, usually)."""


def test_operator_killed_during_the_rollback_completes_it_exactly_once(
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    with Recorder(api_client, job_namespace, "crash") as recorder:
        jobs.create(job_manifest("crash", {"TINYGPT_STEPS": "200"}))
        stopping = recorder.wait_phase(ROLLBACK_PHASES, 300, "the rollback to begin")
        assert operator.process is not None
        os.kill(operator.process.pid, signal.SIGKILL)
        assert operator.wait_dead(10)
        killed_in = jobs.status("crash")["phase"]
        time.sleep(2)  # the pods' deletion and the job's status go on without an operator
        operator.start()
        done = jobs.wait("crash", lambda s: s.get("phase") in ("Succeeded", "Failed"), 420,
                         "the job to heal after the operator restarted")  # fmt: skip
    assert done["phase"] == "Succeeded", done.get("conditions")
    (entry,) = done["rollbackHistory"]
    assert (entry["onsetStep"], entry["toStep"], entry["lrScale"]) == (129, 25, 0.5)
    assert done["attempt"] == 1
    assert done["counters"]["rollbacks"] == 1
    assert done["counters"]["trips"] == 1
    created = {
        seen.obj["metadata"]["name"]
        for seen in recorder.snapshot()
        if seen.kind == "pod" and seen.event == "ADDED"
    }
    assert created == {"crash-a0-0", "crash-a0-1"}, created
    uids = {
        seen.obj["metadata"]["uid"]
        for seen in recorder.snapshot()
        if seen.kind == "pod" and seen.event == "ADDED"
    }
    assert len(uids) == 2, "no pod was created twice"
    assert entry["restartedInPlace"] == 2
    for pod in sorted(created):
        assert attempts_started(local_cluster, job_namespace, pod) == [0, 1], pod
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    assert logs.attempts() == [0, 1]
    resumed = logs.steps(1)
    assert resumed[0]["step"] == 26
    assert resumed[-1]["step"] == 200
    assert not any(r["poisoned"] for r in resumed)
    print(f"\noperator killed at phase {stopping['phase']} (status then {killed_in}); {entry}")
