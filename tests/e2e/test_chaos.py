"""The short chaos run inside `make test`: three faults in one run of the tiny GPT, one of
them while a recovery is in progress, on three local nodes with two used by the job.

A killed rank (restart from the latest checkpoint), then a NaN burst (rollback) with the
operator SIGKILLed during that rollback. What must hold, and only that (the timing targets
are `make chaos`'s to report): every fault healed with the action its kind expects, the
second of the pair struck mid-recovery, the job completes with no person involved, every
checkpoint copy left verifies, loads and holds no NaN, and deleting the job leaves no pod,
Service, Secret or ConfigMap of it behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from stabletrain_operator import naming
from support.chaos.checks import check_checkpoints, orphans_after_delete
from support.chaos.inject import Injector
from support.chaos.measure import incidents, measure_faults, unattributed
from support.chaos.report import applied_lines, fault_table, unattributed_lines
from support.chaos.run import RECOVERY_PHASES, chaos_manifest, chaos_run, pfs_dir
from support.chaos.schedule import explicit_schedule
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, checkpoint_key

STEPS = 400
STEP_SLEEP = "0.05"
"""Seconds each step sleeps on top of its compute, so the faults land inside the run."""
PACE_S = 0.16
"""For the steps lost in seconds in the printed table only; nothing here is timed."""


@pytest.fixture
def local_cluster(
    api_client: client.ApiClient, control_plane: ControlPlane
) -> Iterator[LocalCluster]:
    """Three nodes, the job uses two: a relaunch away from a suspect node has one to use."""
    with LocalCluster(api_client, nodes=("node-a", "node-b", "node-c")) as cluster:
        yield cluster
    control_plane.check_alive()


def test_three_faults_one_mid_rollback_all_heal_with_the_actions_their_kinds_expect(
    *,
    control_plane: ControlPlane,
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    # Seconds after the first step: the kill past the first checkpoint (step 25). The NaN
    # burst strikes in whichever attempt runs then: on a busy machine during the restart (at
    # the relaunch's first step, with no checkpoint 100 steps before it, so the rollback
    # starts afresh), on an idle one early in the relaunched attempt. Both must fall inside
    # the run whatever the machine's speed: at 25 s an idle machine has trained about 150 of
    # the STEPS, a machine at load 10 is still restarting.
    plan = explicit_schedule([("kill", 8), ("nan", 25), ("operator-kill", "recovering")])
    # A floor on the step time: an idle machine of today runs the tiny GPT at 20-35 steps/s,
    # which finished all STEPS before the NaN's 25 s (at step 174 or 283 by the kill's 8 s).
    manifest = chaos_manifest("chaos", STEPS, seed=11, env={"TINYGPT_STEP_SECONDS": STEP_SLEEP})
    pfs = pfs_dir(local_cluster, job_namespace, "chaos")
    injector = Injector(plane=control_plane, cluster=local_cluster, operator=operator,
                        api_client=api_client, namespace=job_namespace, job="chaos",
                        pfs_dir=pfs)  # fmt: skip
    ran = chaos_run(injector, jobs, cluster=local_cluster, api_client=api_client,
                    namespace=job_namespace, manifest=manifest, plan=plan, seed=11,
                    timeout=420)  # fmt: skip
    found = incidents(ran.recorder, ran.run.status, ran.run.logs, nodes=2)
    results = measure_faults(ran.applied, ran.run, found, PACE_S)
    clock = ran.run.first_step_at or 0.0
    print("\n" + "\n".join([*applied_lines(ran.applied, clock), *fault_table(results),
                            *unattributed_lines(unattributed(ran.applied, ran.run, found),
                                                clock)]))  # fmt: skip

    status = ran.run.status
    why = {k: status.get(k) for k in ("conditions", "lastFailure", "rollbackHistory")}
    assert status.get("phase") == "Succeeded", why
    assert [a.error for a in ran.applied] == ["", "", ""]
    assert ran.applied[2].phase in RECOVERY_PHASES, "the operator died during the rollback"
    assert [(r.kind, r.action, r.matched) for r in results] == [
        ("kill", "RestartFromLatest", True),
        ("nan", "Rollback", True),
        ("operator-kill", "", True),
    ], [r.note for r in results]
    history = ran.run.status["rollbackHistory"]
    assert [e["action"] for e in history] == ["RestartFromLatest", "Rollback"], history
    assert len({e["attempt"] for e in history}) == 2, "the interrupted rollback ran once"
    last = ran.run.logs.steps(ran.run.status["attempt"])
    assert last[-1]["step"] == STEPS

    node_dir = manifest["spec"]["checkpoints"]["local"]["hostPath"]
    host_path = naming.local_tier_host_path(node_dir, job_namespace, "chaos")
    key = checkpoint_key(client.CoreV1Api(api_client), job_namespace, "chaos")
    checkpoints = check_checkpoints(local_cluster, host_path, pfs, torn=(), key=key)
    assert checkpoints.loaded, "no checkpoint copy was found to check"
    assert not checkpoints.problems, checkpoints.problems
    assert orphans_after_delete(api_client, job_namespace, "chaos") == []
    print(f"checkpoint copies verified, loaded, finite: {len(checkpoints.loaded)}")
