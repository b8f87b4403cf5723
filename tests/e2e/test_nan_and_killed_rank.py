"""The tiny GPT's accidents that are not the data's fault: NaN losses and a killed rank.

A NaN that lasts (3 steps, the default nonFinite.consecutiveSteps) is a numerical fault:
the default policy rolls back with the LR halved, and the guard keeps every NaN update out
of the weights meanwhile. A rank killed by SIGKILL is an infrastructure fault: the default
policy restarts from the newest checkpoint with the LR and the data unchanged, and the data
helper resumes at the exact batch the checkpoint recorded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from kubernetes import client

from support.controlplane import ControlPlane
from support.kept_pods import attempts_started, kubectl_pods, pods_of
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess
from support.tinygpt import StepLogs, job_manifest

HEALTHY = {"TINYGPT_POISON_SHARDS": None}


@pytest.fixture
def local_cluster(
    api_client: client.ApiClient, control_plane: ControlPlane
) -> Iterator[LocalCluster]:
    """Three nodes, the job uses two: the killed rank's node becomes a suspect and the restart
    moves that rank to the spare node, as a cluster with a spare would."""
    with LocalCluster(api_client, nodes=("node-a", "node-b", "node-c")) as cluster:
        yield cluster
    control_plane.check_alive()


def finished(status: dict[str, object]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed")


def test_sustained_nan_rolls_back_and_no_update_reaches_the_weights(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    env = {**HEALTHY, "TINYGPT_STEPS": "200", "TINYGPT_NAN_AT": "130", "TINYGPT_NAN_STEPS": "3"}
    jobs.create(job_manifest("nan", env))
    jobs.wait("nan", lambda s: s.get("counters", {}).get("trips"), 90, "the NaN trip recorded")
    done = jobs.wait("nan", finished, 420, "the job to heal")
    assert done["phase"] == "Succeeded", done.get("conditions")
    (entry,) = done["rollbackHistory"]
    assert (entry["signal"], entry["rule"], entry["onsetStep"]) == ("NonFinite", "non-finite", 130)
    assert entry["fromStep"] == 132, "the third NaN step in a row trips"
    assert entry["toStep"] == 25, "default: the newest stable checkpoint >= 100 steps before"
    assert entry["lrScale"] == 0.5
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    first, resumed = logs.steps(0), logs.steps(1)
    nan_steps = [r["step"] for r in first if not math.isfinite(r["loss"])]
    assert nan_steps == [130, 131, 132]
    # The weights stayed finite: the last finite loss before the NaNs and the checkpoint
    # resumed are healthy, and the resumed run (without the fault) never sees a NaN.
    assert all(math.isfinite(r["loss"]) for r in resumed)
    assert resumed[0]["step"] == 26
    assert resumed[-1]["step"] == 200
    lr_before = {r["step"]: r["lr"] for r in first}
    for step in (126, 127, 128):
        after = next(r["lr"] for r in resumed if r["step"] == step)
        assert abs(after / lr_before[step] - 0.5) < 1e-6, (step, after, lr_before[step])
    print(f"\nNaN rollback: {entry}")


def test_one_nan_step_is_skipped_without_a_rollback_and_the_weights_stay_finite(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    """Below nonFinite.consecutiveSteps (3) a NaN is routine (an overflow, one bad batch):
    the guard drops that update and training goes on, with weights that never saw it."""
    env = {**HEALTHY, "TINYGPT_STEPS": "80", "TINYGPT_NAN_AT": "60", "TINYGPT_NAN_STEPS": "1"}
    jobs.create(job_manifest("blip", env))
    done = jobs.wait("blip", finished, 300, "the job to finish")
    assert done["phase"] == "Succeeded", done.get("conditions")
    assert not done.get("rollbackHistory")
    assert done["attempt"] == 0
    steps = StepLogs(local_cluster.shared_dir, job_namespace).steps(0)
    losses = {r["step"]: r["loss"] for r in steps}
    assert math.isnan(losses[60])
    after = [losses[s] for s in range(61, 81)]
    assert all(math.isfinite(loss) for loss in after), "a NaN update would poison every step"
    before = [losses[s] for s in range(40, 60)]
    assert max(after) < 1.2 * max(before), "training went on as before the NaN step"
    print(f"\nNaN at step 60 skipped; loss 59: {losses[59]:.3f}, 61: {losses[61]:.3f}")


def test_a_killed_rank_restarts_in_place_from_the_latest_checkpoint(
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    control_plane: ControlPlane,
) -> None:
    """The default restart is in place: the killed rank's pod (its container, run by the
    supervisor, outlives the worker) and its peer keep running and start the next attempt;
    the spare node stays unused (one incident does not condemn a node)."""
    env = {**HEALTHY, "TINYGPT_STEPS": "120", "TINYGPT_KILL_AT": "70", "TINYGPT_KILL_RANK": "1"}
    jobs.create(job_manifest("killed", env))
    jobs.wait("killed", lambda s: (s.get("step") or 0) >= 20, 300, "attempt 0 to train")
    before = pods_of(jobs, "killed")
    print(f"\nbefore the kill:\n{kubectl_pods(control_plane, job_namespace)}")
    done = jobs.wait("killed", finished, 420, "the job to restart and finish")
    assert done["phase"] == "Succeeded", done.get("conditions")
    (entry,) = done["rollbackHistory"]
    assert (entry["action"], entry["signal"], entry["rule"]) == (
        "RestartFromLatest", "WorkerFailure", "infrastructure",
    )  # fmt: skip
    print(f"\nrestart: {entry}")
    print(f"after:\n{kubectl_pods(control_plane, job_namespace)}")
    after = pods_of(jobs, "killed")
    assert sorted(after) == sorted(before) == ["killed-a0-0", "killed-a0-1"]
    for name, pod in after.items():
        assert (pod.uid, pod.node, pod.restarts) == (before[name].uid, before[name].node, 0)
        assert pod.attempt == 1
        assert attempts_started(local_cluster, job_namespace, name) == [0, 1]
    assert (entry["restartedInPlace"], entry["replacedPods"]) == (2, 0)
    # The newest state: the memory tier's snapshot of step 60 (every 10 steps; 50 is a
    # checkpoint), which both kept pods hold and their supervisors scanned after the kill,
    # 9 steps before it, against the checkpoint 19 steps before.
    assert entry["toStep"] == 60, entry
    assert "memory tier" in entry["checkpointChoice"], entry
    restart = entry["toStep"]
    assert entry["lrScale"] == 1.0
    assert entry["skipped"] == []
    assert done["counters"]["restarts"] == 1
    assert done["counters"]["rollbacks"] == 0
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    first, resumed = logs.steps(0), logs.steps(1)
    assert first[-1]["step"] == 69, "rank 1 died before step 70 finished anywhere"
    for rank in (0, 1):
        start = logs.events(1, rank)[0]
        assert (start["event"], start["restored_step"], start["lr_scale"]) == (
            "start", restart, 1.0
        )  # fmt: skip
        assert start["restored_from"] == "memory", start
    print(f"steps lost to the kill: {first[-1]['step'] - restart} (memory interval 10)")
    assert resumed[0]["step"] == restart + 1
    # The same steps read the same batches and used the same LR: nothing changed but time.
    before = {r["step"]: r for r in first}
    for record in resumed:
        if record["step"] in before:
            assert record["batch"] == before[record["step"]]["batch"]
            assert record["lr"] == before[record["step"]]["lr"]
            assert record["lr_scale"] == 1.0
    assert resumed[-1]["step"] == 120
