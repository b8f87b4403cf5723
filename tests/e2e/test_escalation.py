"""A poisoned range longer than the first rollback skipped: the spike recurs, and the
operator escalates (a wider skip, a lower LR) instead of repeating what did not work.

The policy here skips only a few steps around the onset, whole (`skipData: StepRange`: the
default would pass over the whole suspect shard), so that the rest of the poisoned shard
(read by steps 129-144 of an unskipped run) is still ahead of the first relaunch.
"""

from __future__ import annotations

from kubernetes import client

from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess
from support.timeline import Recorder
from support.tinygpt import StepLogs, job_manifest, shard_batches

ROLLBACK = {"minStepsBeforeOnset": 5, "skipStepsBeforeOnset": 2, "skipStepsAfterOnset": 10,
            "rewarmupSteps": 10, "skipData": "StepRange"}  # fmt: skip
RULES = [
    {"name": "loss-spike", "onSignals": ["LossSpike"], "action": "Rollback", "rollback": ROLLBACK},
    {"name": "infrastructure", "onSignals": ["WorkerFailure"], "action": "RestartFromLatest"},
]
EVERY = 5


def test_a_recurring_spike_is_rolled_back_harder(
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    # A step floor: at 20-35 steps/s an idle run tripped before the PFS copy of step 120 was
    # flushed, and the plan rightly took 115 (the newest verified on both tiers).
    env = {"TINYGPT_STEPS": "180", "TINYGPT_STEP_SECONDS": "0.05"}
    manifest = job_manifest("recur", env, recovery={"rules": RULES})
    manifest["spec"]["checkpoints"]["intervalSteps"] = EVERY
    with Recorder(api_client, job_namespace, "recur") as recorder:
        jobs.create(manifest)
        done = jobs.wait("recur", lambda s: s.get("phase") in ("Succeeded", "Failed"), 480,
                         "the job to heal twice")  # fmt: skip
    assert done["phase"] == "Succeeded", done.get("conditions")
    first, second = done["rollbackHistory"]
    assert (first["onsetStep"], first["fromStep"], first["toStep"]) == (129, 132, 120)
    assert first["lrScale"] == 0.5
    (narrow,) = first["skipped"]
    assert (narrow["first"], narrow["last"], narrow["shardIds"]) == (127, 139, [])

    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    relaunched = logs.steps(1)
    assert any(r["poisoned"] for r in relaunched), "the first skip left poisoned data ahead"
    assert second["signal"] == "LossSpike"
    assert second["attempt"] == 2
    # Escalated: the checkpoint further back, the skip twice as wide, the LR lower.
    assert second["toStep"] < first["toStep"]
    assert second["onsetStep"] - second["toStep"] >= 2 * ROLLBACK["minStepsBeforeOnset"]
    wide = second["skipped"][-1]
    assert wide["last"] - wide["first"] == 2 * (narrow["last"] - narrow["first"])
    assert second["lrScale"] < first["lrScale"]
    reasons = {e["reason"] for e in jobs.events("recur")}
    assert "Escalated" in reasons, reasons

    final = logs.steps(2)
    assert not any(r["poisoned"] for r in final)
    read = {r["batch"] for r in final}
    assert not read & set(shard_batches(8))
    assert final[-1]["step"] == 180
    lr_first = {r["step"]: r["lr"] for r in logs.steps(0)}
    ramp_end = second["toStep"] + ROLLBACK["rewarmupSteps"]
    for record in final:
        if ramp_end < record["step"] < 129:
            ratio = record["lr"] / lr_first[record["step"]]
            assert abs(ratio - second["lrScale"]) < 1e-6, (record["step"], ratio)
    phases = [p for _, p, _ in recorder.phases()]
    assert phases.count("Stopping") == 2
    print(f"\nfirst: {first}\nsecond (escalated): {second}")
