"""Hangs, slow ranks and a bad node, on three local nodes with two used by the job.

A hung rank keeps its agent answering (the heartbeat is served off the training thread)
and says where it is stuck; the operator raises Stalled within stallSeconds of the last
completed step, pins it on that rank and its node, and relaunches from the latest
checkpoint onto the third node. A rank that hangs in the first step of a relaunched attempt
is stalled once the start-up bound (30 s from its restore here) is over, not left to
torch's process-group timeout. A rank that is only slow is never stalled. A node that kills
whatever runs on it is put on the job's suspect list, and the relaunch avoids it.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from stabletrain_operator.api.spec import default_rules
from stabletrain_operator.naming import ATTEMPT_LABEL, RANK_LABEL
from stabletrain_operator.observe.stall import WARMUP_STEPS, startup_bound
from support.chaos.inject import FAULT_SUBDIR, read_marker, write_trigger
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess
from support.timeline import Recorder
from support.tinygpt import StepLogs, expected_decisions, job_manifest, write_replay_csv

STALL_SECONDS = 5
SLOW_STALL_SECONDS = 10
"""The slow rank's steps took up to 4.6 s at load 15 (1.5 s of it the rank's sleep), too
close to 5 s; the bound it must stay inside is stallSeconds whatever its value."""
EVERY = "5"
NODES = ("node-a", "node-b", "node-c")


@pytest.fixture
def local_cluster(
    api_client: client.ApiClient, control_plane: ControlPlane
) -> Iterator[LocalCluster]:
    """Three nodes instead of the usual two (this module's override of the fixture that
    the operator fixtures take): the job uses two, so a relaunch has one to move to."""
    with LocalCluster(api_client, nodes=NODES) as cluster:
        yield cluster
    control_plane.check_alive()


def finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed")


def _manifest(
    name: str, env: Mapping[str, str | None], stall_seconds: int = STALL_SECONDS
) -> dict[str, Any]:
    manifest = job_manifest(
        name,
        {"TINYGPT_POISON_SHARDS": None, "TINYGPT_CHECKPOINT_EVERY": EVERY, **env},
        detection={"stallSeconds": stall_seconds},
    )
    manifest["spec"]["checkpoints"]["intervalSteps"] = int(EVERY)
    return manifest


def placed(recorder: Recorder, attempt: int) -> dict[int, str]:
    """Node of each rank of `attempt`, as the pod watch saw them bound."""
    nodes: dict[int, str] = {}
    for seen in recorder.snapshot():
        labels = seen.obj["metadata"].get("labels") or {}
        node = (seen.obj.get("spec") or {}).get("nodeName")
        if seen.kind == "pod" and labels.get(ATTEMPT_LABEL) == str(attempt) and node:
            nodes[int(labels[RANK_LABEL])] = node
    return nodes


@pytest.mark.usefixtures("operator")
def test_a_hung_rank_is_stalled_pinned_on_its_node_and_relaunched_elsewhere(
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
    tmp_path: Path,
) -> None:
    env = {"TINYGPT_STEPS": "30", "TINYGPT_STALL_AT": "15", "TINYGPT_STALL_RANK": "1",
           "TINYGPT_STALL_SECONDS": "86400"}  # fmt: skip
    with Recorder(api_client, job_namespace, "hang") as recorder:
        jobs.create(_manifest("hang", env))
        # The watch, not a status poll: Stopping can last less than the poll's second.
        stopping = recorder.wait_phase(("Stopping",), 240, "the stall to be decided")
        done = jobs.wait("hang", finished, 300, "the job to relaunch and finish")
    assert done["phase"] == "Succeeded", done.get("conditions")
    plan = stopping["plan"]
    assert (plan["signal"], plan["action"]) == ("Stalled", "RestartFromLatest")
    (suspect,) = plan["suspects"]
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    first, relaunched = placed(recorder, 0), placed(recorder, 1)
    hung_node = first[1]
    assert (suspect["rank"], suspect["node"], suspect["avoid"]) == (1, hung_node, True), suspect
    assert "faults.py" in suspect["reason"], suspect["reason"]

    last_step_at = max(r["time"] for rank in (0, 1) for r in logs.steps(0, rank))
    assert max(r["step"] for r in logs.steps(0, 1)) == 14, "rank 1 hangs before step 15"
    stopped_at = next(at for at, phase, _ in recorder.phases() if phase == "Stopping")
    latency = stopped_at - last_step_at
    print(f"\nhang: last completed step 14 -> Stopping in {latency:.1f} s "
          f"(stallSeconds {STALL_SECONDS}); torch's default process-group timeouts: "
          "NCCL 600 s, gloo 1800 s")  # fmt: skip
    assert latency <= STALL_SECONDS + 5, latency

    (entry,) = done["rollbackHistory"]
    assert (entry["signal"], entry["action"]) == ("Stalled", "RestartFromLatest")
    # The newest checkpoint the operator knew of: 10 once a scrape listed its PFS copy as
    # complete; 5 when that copy completed after rank 1 hung (the agent exports its
    # inventory at steps, and no step follows).
    assert entry["toStep"] in (5, 10), entry
    assert logs.steps(1)[0]["step"] == entry["toStep"] + 1
    assert [(s["rank"], s["node"]) for s in entry["suspects"]] == [(1, hung_node)]
    assert hung_node not in relaunched.values(), (first, relaunched)
    assert len(first) == len(relaunched) == 2
    print(f"placement: attempt 0 {first}, attempt 1 {relaunched}")
    assert [(n["node"], n["incidents"]) for n in done["suspectNodes"]] == [(hung_node, 1)]
    reasons = [e["reason"] for e in jobs.events("hang")]
    assert "SuspectNode" in reasons
    left = [p for p in jobs.pods("hang") if p["metadata"]["labels"].get(ATTEMPT_LABEL) == "0"]
    assert not left, "a pod of the hung attempt is left"
    assert logs.steps(1)[-1]["step"] == 30

    # `stabletrain replay` reaches the same Stalled decision from the recorded step times.
    csv, policy = tmp_path / "metrics.csv", tmp_path / "policy.yaml"
    write_replay_csv(logs, csv)
    policy.write_text(f"detection: {{stallSeconds: {STALL_SECONDS}}}\n")
    replayed = subprocess.run(
        [str(Path(sys.executable).parent / "stabletrain"), "replay", "--json", str(csv),
         "--policy", str(policy)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    decisions = [json.loads(line) for line in replayed.stdout.splitlines() if line.strip()]
    rules = [r.model_dump(mode="json", by_alias=True) for r in default_rules()]
    (expected,) = expected_decisions(done, rules)
    assert [{key: d[key] for key in expected} for d in decisions] == [expected], decisions


@pytest.mark.chaos
@pytest.mark.usefixtures("operator")
def test_a_rank_hung_in_the_first_step_of_a_relaunch_is_stalled_after_the_start_up_bound(
    jobs: Jobs, job_namespace: str, local_cluster: LocalCluster, api_client: client.ApiClient
) -> None:
    """Rank 1 dies at step 8 (attempt 0); the hang trigger is dropped while that attempt
    stops, so only the relaunched rank 1 can claim it, before its first or second step.
    Before the start-up bound such a rank was never judged: the job sat in gloo's
    30-minute timeout. Three launches and the 30 s bound take 2.5 to 3 minutes (146 and
    169 s measured), over what `make test` can spend: marked `chaos` (-m chaos); the rule
    itself is unit-tested in tests/unit/operator/test_stall_rule.py."""
    env = {"TINYGPT_STEPS": "20", "TINYGPT_KILL_AT": "8", "TINYGPT_KILL_RANK": "1"}
    fault_dir = local_cluster.shared_dir / job_namespace / "pfs" / FAULT_SUBDIR
    with Recorder(api_client, job_namespace, "starthang") as recorder:
        jobs.create(_manifest("starthang", env))
        recorder.wait_phase(("Stopping",), 180, "the killed rank to stop attempt 0")
        write_trigger(fault_dir, "start-hang", {"kind": "hang", "rank": 1})
        done = jobs.wait("starthang", finished, 300, "the hang to be stalled and the job to end")
    assert done["phase"] == "Succeeded", done.get("conditions")
    killed, stall = done["rollbackHistory"]
    assert (killed["signal"], stall["signal"], stall["action"]) == (
        "WorkerFailure",
        "Stalled",
        "RestartFromLatest",
    ), done["rollbackHistory"]
    marker = read_marker(fault_dir, "start-hang")
    assert marker is not None
    assert (marker["attempt"], marker["rank"]) == (1, 1), marker
    resumed = killed["toStep"]
    assert resumed < marker["step"] <= resumed + WARMUP_STEPS, (resumed, marker)
    hung_node = placed(recorder, 1)[1]
    assert [(s["rank"], s["node"], s["avoid"]) for s in stall["suspects"]] == [
        (1, hung_node, True)
    ], stall["suspects"]
    assert "faults.py" in stall["suspects"][0]["reason"]
    assert hung_node in [n["node"] for n in done["suspectNodes"]]
    stops = [at for at, phase, _ in recorder.phases() if phase == "Stopping"]
    latency = stops[1] - float(marker["time"])
    bound = startup_bound(STALL_SECONDS)
    print(f"\nstart-up hang at step {marker['step']} of attempt 1 -> Stopping in "
          f"{latency:.1f} s (start-up bound {bound} s from the restore; torch's gloo "
          "timeout 1800 s)")  # fmt: skip
    assert latency <= bound + 5, latency
    assert StepLogs(local_cluster.shared_dir, job_namespace).steps(2)[-1]["step"] == 20


def test_a_slow_rank_that_keeps_stepping_is_never_stalled(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    """Bound: a stall needs no step by any rank for stallSeconds (SLOW_STALL_SECONDS here),
    or one rank idle that long and more than 5 steps behind; a rank 1.5 s slower per step
    (and every other rank waiting for it in lockstep) stays inside both."""
    env = {"TINYGPT_STEPS": "16", "TINYGPT_SLOW_RANK": "1", "TINYGPT_SLOW_SECONDS": "1.5"}
    jobs.create(_manifest("slow", env, SLOW_STALL_SECONDS))
    done = jobs.wait("slow", finished, 240, "the slow job to finish")
    assert done["phase"] == "Succeeded", done.get("conditions")
    assert done["attempt"] == 0
    assert not done.get("rollbackHistory")
    assert not done.get("suspectNodes")
    steps = StepLogs(local_cluster.shared_dir, job_namespace).steps(0)
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
    print(f"\nslow rank: slowest step gap {max(gaps):.2f} s, bound {SLOW_STALL_SECONDS} s")
    assert min(gaps[3:]) >= 1.4, "every step really waited for the slow rank"


def test_a_node_that_kills_its_rank_is_avoided_by_the_relaunch(
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    # A 0.05 s step floor: idle, the tiny GPT runs 20-35 steps/s, and 2 of 15 local runs
    # (beside unit tests) planned from step 5: the stop came before rank 0 had served a scan
    # listing step 10, saved 0.1 s earlier.
    env = {"TINYGPT_STEPS": "24", "TINYGPT_KILL_AT": "12", "TINYGPT_KILL_NODE": "node-b",
           "TINYGPT_STEP_SECONDS": "0.05"}  # fmt: skip
    with Recorder(api_client, job_namespace, "badnode") as recorder:
        jobs.create(_manifest("badnode", env))
        done = jobs.wait("badnode", finished, 300, "the job to leave the bad node and finish")
    if done["phase"] != "Succeeded":
        print(json.dumps({k: done.get(k) for k in ("conditions", "lastFailure",
                          "rollbackHistory", "suspectNodes", "plan")}, indent=1))  # fmt: skip
        print({a: placed(recorder, a) for a in range(done["attempt"] + 1)})
    assert done["phase"] == "Succeeded", done.get("conditions")
    assert "node-b" in placed(recorder, 0).values(), "the scheduler put a rank on node-b"
    history = done["rollbackHistory"]
    assert history[0]["signal"] == "WorkerFailure"
    assert [(s["node"], s["avoid"]) for s in history[0]["suspects"]] == [("node-b", True)]
    assert "killed by signal 9" in history[0]["suspects"][0]["reason"]
    # The newest checkpoint, on both tiers: rank 1 flushed its copies before it died, rank 0
    # (its collective broken) finished its own and answered until a scrape listed them, and
    # the operator scraped until none was in flight. Planned from the scrape before the kill,
    # this restart once failed with NoUsableCheckpoint (step 5 still in flight, 10 unseen).
    assert history[0]["toStep"] == 10, history[0]
    for attempt in range(1, done["attempt"] + 1):
        assert "node-b" not in placed(recorder, attempt).values(), attempt
    (bad,) = done["suspectNodes"]
    assert (bad["node"], bad["incidents"]) == ("node-b", len(history))
    print(f"\nbad node: {len(history)} incident(s), suspect list {done['suspectNodes']}")
