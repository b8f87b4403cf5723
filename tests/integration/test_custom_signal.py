"""A custom signal end to end: a real PyTorch run on the local node reports its validation
loss through `guard.observe`, the loss really rises after its held-out targets drift, and
the operator takes the configured action from the agent's report (status, Event, metric).
The run's own recorded history (the CSV its rank 0 wrote) replayed by `stabletrain replay`
with the same policy gives the same decision."""

from __future__ import annotations

import csv as csvlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from support.localnode import LocalCluster
from support.operator import REPO, Jobs, OperatorProcess, job_manifest

WORKER = REPO / "tests" / "support" / "workloads" / "guarded_worker.py"
DETECTION = {
    "baseline": {"warmupSteps": 3, "minSamples": 3, "emaFactor": 0.3},
    "custom": [
        {"name": "val_loss_jump", "metric": "val_loss", "kind": "RelativeJump",
         "threshold": 1.15, "consecutiveSteps": 2},
    ],
}  # fmt: skip
RUN = {"ST_STEP_SECONDS": "0.2", "ST_VAL_EVERY": "2", "ST_VAL_SHIFT_AT": "30"}
STABLETRAIN = Path(sys.executable).with_name("stabletrain")


def guarded_job(name: str, env: dict[str, str], rule: dict[str, Any]) -> dict[str, Any]:
    manifest = job_manifest(
        name, {**RUN, **env, "ST_METRICS_CSV": f"{name}.csv"},
        recovery={"rules": [rule]}, detection=DETECTION,
    )  # fmt: skip
    container = manifest["spec"]["workers"]["template"]["spec"]["containers"][0]
    container["command"] = ["torchrun", str(WORKER)]
    return manifest


def replay(tmp_path: Path, csv: Path, rule: dict[str, Any]) -> list[dict[str, Any]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"detection": DETECTION, "recovery": {"rules": [rule]}}))
    done = subprocess.run(
        [str(STABLETRAIN), "replay", "--json", "--policy", str(policy), str(csv)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    print(f"replay stderr: {done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines()]


def alerts_metric(operator: OperatorProcess, signal: str) -> float:
    pattern = r'stabletrain_operator_alerts_total\{signal="' + re.escape(signal) + r'"\} (\S+)'
    found = re.search(pattern, operator.metrics())
    return float(found.group(1)) if found else 0.0


def test_validation_loss_jump_alerts_and_replay_alerts_the_same(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster,
    tmp_path: Path,
) -> None:  # fmt: skip
    rule = {"name": "validation-loss", "onSignals": ["custom:val_loss_jump"], "action": "Alert"}
    jobs.create(guarded_job("val", {"ST_STEPS": "60"}, rule))

    done = jobs.wait("val", lambda s: s.get("phase") == "Succeeded", 150, "the run to finish")
    healthy = {c["type"]: c for c in done["conditions"]}["Healthy"]
    assert done["counters"]["alerts"] == 1, "one Alert for the one episode"
    assert healthy["reason"] == "Alerted"
    assert healthy["message"].startswith("custom:val_loss_jump: rule validation-loss alerts")
    alerted = [e for e in jobs.events("val") if e["reason"] == "Alerted"]
    assert len(alerted) == 1
    assert alerted[0]["type"] == "Warning"
    live = re.search(r"alerts on (\S+) \((\w+)\) at step (\d+)", alerted[0]["message"])
    assert live is not None, alerted[0]["message"]
    assert alerts_metric(operator, "custom:val_loss_jump") == 1
    (recorded,) = done["rollbackHistory"]  # the decision is on the record, nothing else ran
    assert (recorded["action"], recorded["rule"], recorded["reason"]) == (
        "Alert", "validation-loss", "Alerted",
    )  # fmt: skip
    assert recorded["attempt"] == done["attempt"] == 0, "an Alert changes nothing in the run"

    csv = local_cluster.shared_dir / job_namespace / "pfs" / "val.csv"
    (decision,) = replay(tmp_path, csv, rule)
    assert (decision["action"], decision["rule"]) == ("Alert", "validation-loss")
    assert (decision["signal"], decision["class"]) == (live.group(1), live.group(2))
    assert decision["onset"] == 30, "the step the held-out targets drifted"
    assert decision["step"] <= int(live.group(3)) <= 60, (
        "the operator alerts on the first scrape after the agent's finding is sustained"
    )
    print(f"live: {alerted[0]['message']!r}; replay: {decision}")


def test_custom_signal_trip_fails_the_job_at_the_step_replay_decides(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster,
    tmp_path: Path,
) -> None:  # fmt: skip
    rule = {"name": "validation-loss", "onSignals": ["custom:val_loss_jump"], "action": "Fail"}
    jobs.create(guarded_job("valfail", {"ST_STEPS": "60"}, rule))

    failed = jobs.wait("valfail", lambda s: s.get("phase") == "Failed", 150, "the job to fail")
    conditions = {c["type"]: c for c in failed["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    trip = failed["lastTrip"]
    assert trip["signal"] == "custom:val_loss_jump"
    assert failed["counters"]["trips"] == 1
    assert jobs.pods("valfail") == [], "a failed job keeps no pods"
    reasons = [e["reason"] for e in jobs.events("valfail")]
    assert conditions["Failed"]["reason"] in reasons
    (recorded,) = failed["rollbackHistory"]
    assert (recorded["action"], recorded["rule"], recorded["onsetStep"]) == (
        "Fail", "validation-loss", trip["onsetStep"],
    )  # fmt: skip

    csv = local_cluster.shared_dir / job_namespace / "pfs" / "valfail.csv"
    (decision,) = replay(tmp_path, csv, rule)
    assert (decision["action"], decision["rule"], decision["signal"]) == (
        "Fail", "validation-loss", "custom:val_loss_jump",
    )  # fmt: skip
    assert (decision["step"], decision["onset"]) == (trip["step"], trip["onsetStep"])
    assert decision["class"] == trip["anomalyClass"]
    assert decision["reason"] == conditions["Failed"]["reason"]
    print(f"live trip: step {trip['step']} onset {trip['onsetStep']}; replay: {decision}")


RL_DETECTION = {
    "baseline": {"warmupSteps": 3, "minSamples": 3, "emaFactor": 0.3},
    "custom": [
        {"name": "entropy_low", "metric": "entropy", "kind": "Below", "threshold": 1.0,
         "consecutiveSteps": 2},
        {"name": "reward_jump", "metric": "reward", "kind": "RelativeJump", "threshold": 1.5},
    ],
}  # fmt: skip
RL_RULES = [
    {"name": "reward-hacking", "onSignals": ["custom:entropy_low"],
     "whileFiring": ["custom:reward_jump"], "action": "Rollback",
     "rollback": {"lrFactor": 0.5, "minStepsBeforeOnset": 5, "skipStepsBeforeOnset": 2,
                  "skipStepsAfterOnset": 4, "rewarmupSteps": 3}},
    {"name": "entropy-low", "onSignals": ["custom:entropy_low"], "action": "Alert"},
]  # fmt: skip


def test_entropy_low_while_reward_rises_rolls_back_with_a_lower_lr_as_replay_does(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The documented compound example: a poisoned shard collapses the batches' entropy and
    raises their reward; the agent trips, the operator rolls back past the poisoned data
    with half the LR, the relaunched run never sees it again, and replay agrees."""
    env = {"ST_STEPS": "40", "ST_STEP_SECONDS": "0.1", "ST_POISON_SHARDS": "14,15",
           "ST_BATCH_STATS": "1", "ST_CKPT_EVERY": "5", "ST_METRICS_CSV": "rl.csv"}  # fmt: skip
    manifest = job_manifest("rl", env, recovery={"rules": RL_RULES}, detection=RL_DETECTION)
    container = manifest["spec"]["workers"]["template"]["spec"]["containers"][0]
    container["command"] = ["torchrun", str(WORKER)]
    jobs.create(manifest)

    done = jobs.wait("rl", lambda s: s.get("phase") == "Succeeded", 170, "the run to heal")
    # A worker failure of the relaunched attempt would be restarted by the infrastructure
    # rule; the decision under test is the one Rollback.
    (entry,) = [e for e in done["rollbackHistory"] if e["action"] == "Rollback"]
    assert (entry["rule"], entry["signal"], entry["action"]) == (
        "reward-hacking", "custom:entropy_low", "Rollback",
    )  # fmt: skip
    firing = set(done["lastTrip"]["firing"])
    assert {"custom:entropy_low", "custom:reward_jump"} <= firing, "the compound condition"
    assert entry["lrScale"] == 0.5
    # Each further attempt must be explained: the infrastructure rule's restart of a failed
    # worker, or a relaunch that could not restore its checkpoint planned again (RestoreFailed),
    # never a second rollback. One CI run under load ended at attempt 2; both are printed.
    restarts = [e for e in done["rollbackHistory"] if e["action"] not in ("Rollback", "Alert")]
    assert all(e["rule"] == "infrastructure" for e in restarts), restarts
    reasons = [e["reason"] for e in jobs.events("rl")]
    print(f"rollbackHistory: {done['rollbackHistory']}\nEvents: {reasons}")
    assert done["attempt"] == 1 + len(restarts) + reasons.count("RestoreFailed")
    assert "RollbackStarted" in reasons
    assert "RollbackConfirmed" in reasons

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"detection": RL_DETECTION, "recovery": {"rules": RL_RULES}}))
    csv = local_cluster.shared_dir / job_namespace / "pfs" / "rl.csv"
    replayed = subprocess.run(
        [str(STABLETRAIN), "replay", "--json", "--policy", str(policy), str(csv)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    print(f"replay stderr: {replayed.stderr.strip()}")
    (decision,) = [json.loads(line) for line in replayed.stdout.splitlines()]
    assert (decision["action"], decision["rule"], decision["signal"]) == (
        entry["action"], entry["rule"], entry["signal"],
    )  # fmt: skip
    assert (decision["step"], decision["onset"]) == (entry["fromStep"], entry["onsetStep"])
    assert decision["lr_scale"] == entry["lrScale"]
    assert decision["skip"] == [[s["first"], s["last"]] for s in entry["skipped"]]
    assert entry["toStep"] <= decision["target_step_at_most"]
    rows = list(csvlib.DictReader(csv.open()))
    steps = [int(r["step"]) for r in rows]
    relaunch = next(i for i in range(1, len(rows)) if steps[i] <= steps[i - 1])
    assert int(rows[relaunch]["step"]) == entry["toStep"] + 1
    healed = rows[relaunch:]
    assert min(float(r["entropy"]) for r in healed) > 1.0, "the poisoned data was skipped"
    assert int(healed[-1]["step"]) == 40
    print(f"live: {entry}; replay: {decision}")
