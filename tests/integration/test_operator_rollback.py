"""Rollbacks on the real control plane: pods of the local node run the contract worker
under torchrun, the operator runs as a separate process and decides from trip reports."""

from __future__ import annotations

import json

from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, job_manifest, metric, worker_log

ROLLBACK = {"minStepsBeforeOnset": 5, "skipStepsBeforeOnset": 2, "skipStepsAfterOnset": 5,
            "rewarmupSteps": 3}  # fmt: skip
RULES = [
    {"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback", "rollback": ROLLBACK},
    {"name": "spike", "onSignals": ["LossSpike"], "action": "Rollback", "rollback": ROLLBACK},
    {"name": "infra", "onSignals": ["WorkerFailure"], "action": "RestartFromLatest"},
]
STEP = {"ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5"}


def test_nan_trip_rolls_back_to_the_newest_checkpoint_complete_on_pfs(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    env = {**STEP, "ST_STEPS": "40", "ST_NAN_AT": "22", "ST_NO_PFS_STEPS": "15"}
    jobs.create(job_manifest("nan", env, recovery={"rules": RULES}))

    done = jobs.wait("nan", lambda s: s.get("phase") == "Succeeded", 150, "the job to heal")
    (entry,) = done["rollbackHistory"]
    assert entry["signal"] == "NonFinite"
    assert entry["onsetStep"] == 22
    assert entry["toStep"] == 10, "step 15 is the newest before 22 - 5 but has no PFS copy"
    assert entry["lrScale"] == 0.5
    assert entry["skipped"] == [{"first": 20, "last": 27, "unit": "Step", "shardIds": []}]
    assert done["attempt"] == 1
    assert done["counters"]["rollbacks"] == 1
    assert done["counters"]["trips"] == 1
    assert done["lastTrip"]["signal"] == "NonFinite"
    directives = json.loads(jobs.config_map("nan-a1-directives")["data"]["directives.json"])
    assert directives["attempt"] == 1
    assert directives["generation"] == 2
    assert directives["resumeStep"] == 10
    assert directives["lrScale"] == 0.5
    assert directives["rewarmupSteps"] == 3
    # The directives leave fields at their default out (an older agent reads them).
    assert directives["skip"] == [{"first": 20, "last": 27}]
    for rank in (0, 1):
        resumed = worker_log(local_cluster, job_namespace, attempt=1, rank=rank)
        assert resumed[0]["step"] == 11
        assert {r["lrScale"] for r in resumed} == {0.5}
        assert {r["generation"] for r in resumed} == {2}
        assert resumed[0]["lr"] < resumed[3]["lr"] == 0.05, "re-warm-up, then 0.1 x 0.5"
    reasons = [e["reason"] for e in jobs.events("nan")]
    assert reasons.index("RollbackStarted") < reasons.index("Planned")
    assert reasons.index("Planned") < reasons.index("Relaunched")
    assert reasons.index("Relaunched") < reasons.index("RollbackConfirmed")
    planned = next(e["message"] for e in jobs.events("nan") if e["reason"] == "Planned")
    assert "step 10" in planned
    assert "passed over step 15" in planned
    assert metric(operator, "stabletrain_operator_rollbacks_total", signal="NonFinite") == 1
    assert metric(operator, "stabletrain_operator_recovery_duration_seconds_count") == 1
    print(f"NaN rollback: history {entry}; events {reasons}")


def test_sustained_spike_rolls_back_and_a_transient_one_does_not(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    env = {
        **STEP, "ST_STEPS": "45", "ST_SPIKE_AT": "25", "ST_SPIKE_LEN": "6",
        "ST_TRANSIENT_AT": "12",
    }  # fmt: skip
    manifest = job_manifest("spike", env, recovery={"rules": RULES})
    jobs.create(manifest)
    done = jobs.wait("spike", lambda s: s.get("phase") == "Succeeded", 150, "the job to heal")
    (entry,) = done["rollbackHistory"]
    assert entry["signal"] == "LossSpike"
    assert entry["onsetStep"] == 25, "the 2-step blip at step 12 did not count"
    assert entry["toStep"] == 20
    assert entry["skipped"][0]["first"] == 23
    first = worker_log(local_cluster, job_namespace, attempt=0, rank=0)
    blip = [r for r in first if r["step"] in (12, 13)]
    assert all(r["loss"] > 2 * first[10]["loss"] for r in blip), "the transient blip happened"
    resumed = worker_log(local_cluster, job_namespace, attempt=1, rank=0)
    baseline = first[20]["loss"]
    assert max(r["loss"] for r in resumed) < 1.6 * baseline, "the skipped data never spikes again"


def test_spent_rollback_budget_fails_the_job_with_the_reason(
    operator: OperatorProcess, jobs: Jobs
) -> None:
    recovery = {"rules": RULES, "budgets": {"maxRollbacks": 0}}
    jobs.create(job_manifest("broke", {**STEP, "ST_STEPS": "40", "ST_NAN_AT": "12"},
                             recovery=recovery))  # fmt: skip
    failed = jobs.wait("broke", lambda s: s.get("phase") == "Failed", 120, "the job to fail")
    conditions = {c["type"]: c for c in failed["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    assert conditions["Failed"]["reason"] == "RollbackBudgetExhausted"
    assert "maxRollbacks" in conditions["Failed"]["message"]
    assert jobs.pods("broke") == [], "a failed job keeps no pods"
    print(f"budget spent: Failed condition {conditions['Failed']}")


def test_lost_node_restarts_from_the_latest_checkpoint_without_lr_change(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    jobs.create(job_manifest("lost", {**STEP, "ST_STEPS": "250"}, recovery={"rules": RULES}))
    jobs.wait("lost", lambda s: (s.get("step") or 0) >= 20, 90, "step 20")
    victim = next(p for p in jobs.pods("lost") if p["metadata"]["name"] == "lost-a0-1")
    lost = victim["spec"]["nodeName"]
    local_cluster.lose_node(lost)

    done = jobs.wait("lost", lambda s: s.get("phase") == "Succeeded", 240, "the restarted run")
    history = done["rollbackHistory"]
    logs = local_cluster.logs(job_namespace, "lost-a1-1")[-3000:]
    assert len(history) == 1, (history, logs)
    (entry,) = history
    assert (entry["action"], entry["signal"], entry["rule"]) == (
        "RestartFromLatest", "WorkerFailure", "infra",
    )  # fmt: skip
    assert entry["lrScale"] == 1.0
    assert entry["skipped"] == []
    assert entry["toStep"] >= 20
    assert done["counters"]["restarts"] == 1
    assert done["lrScale"] == 1
    nodes = {p["spec"]["nodeName"] for p in jobs.pods("lost")}
    assert lost not in nodes, "the relaunched ranks avoid the lost node"
    resumed = worker_log(local_cluster, job_namespace, attempt=1, rank=1)
    assert resumed[0]["step"] == entry["toStep"] + 1
    print(f"lost {lost}: {entry}")
