"""A rollback whose pods cannot restore its target, on the real control plane: the operator
plans the same rollback again without that step (issue 14, point 10 b).

The contract worker lists step 15 in its trip report and then loses it from both tiers
(what retention or a tier does while the operator plans). The rollback's bound is 17.
Before: attempt 1's pods failed, the operator counted a WorkerFailure and restarted from the
newest checkpoint, step 20: newer than the bound, three steps before the NaN. After: the
pods stop with a RestoreFailed message and the same rollback resumes from step 10.
"""

from __future__ import annotations

from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, job_manifest, worker_log

ROLLBACK = {"minStepsBeforeOnset": 5, "skipStepsBeforeOnset": 2, "skipStepsAfterOnset": 5,
            "rewarmupSteps": 3}  # fmt: skip
RULES = [
    {"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback", "rollback": ROLLBACK},
    {"name": "infra", "onSignals": ["WorkerFailure"], "action": "RestartFromLatest"},
]


def test_a_target_the_pods_cannot_restore_is_replanned_inside_the_bound(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    env = {"ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5", "ST_STEPS": "40", "ST_NAN_AT": "22",
           "ST_LOST_AFTER_TRIP": "15"}  # fmt: skip
    jobs.create(job_manifest("lost15", env, recovery={"rules": RULES}))
    done = jobs.wait("lost15", lambda s: s.get("phase") in ("Succeeded", "Failed"), 180,
                     "the job to heal")  # fmt: skip
    assert done["phase"] == "Succeeded", done.get("conditions")
    events = jobs.events("lost15")
    reasons = [e["reason"] for e in events]
    failed = [e["message"] for e in events if e["reason"] == "RestoreFailed"]
    assert failed, reasons
    assert "could not restore step 15" in failed[0]
    assert "RestartStarted" not in reasons
    (entry,) = done["rollbackHistory"]
    assert (entry["action"], entry["onsetStep"], entry["toStep"]) == ("Rollback", 22, 10)
    assert entry["attempt"] == 2
    assert "the pods could not restore step 15" in entry["checkpointChoice"]
    assert done["counters"]["rollbacks"] == 1
    assert done["counters"]["restarts"] == 0
    assert done["attempt"] == 2
    for rank in (0, 1):
        assert worker_log(local_cluster, job_namespace, attempt=2, rank=rank)[0]["step"] == 11
    print(f"\nre-planned: {entry}\nRestoreFailed: {failed[0]}")
