"""Hangs, slow ranks and a bad node, on three local nodes with two used by the job.

A hung rank keeps its agent answering (the heartbeat is served off the training thread)
and says where it is stuck; the operator raises Stalled within stallSeconds of the last
completed step, pins it on that rank and its node, stops the processes (a rank that
ignores TERM is KILLed after the grace period) and restarts them in the same pods from the
latest checkpoint. A process that not even KILL ends gets its pod replaced, on the third
node. A rank that hangs in the first step of a relaunched attempt is stalled once the
start-up bound (30 s from its restore here) is over, not left to torch's process-group
timeout. A rank that is only slow is never stalled. A node that kills whatever runs on it
is put on the job's suspect list; its pod restarts in place once, and the next relaunch
leaves the node.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from stabletrain_operator.api.spec import default_rules
from stabletrain_operator.naming import ATTEMPT_LABEL, RANK_LABEL
from stabletrain_operator.observe.stall import WARMUP_STEPS, startup_bound
from support import freezer
from support.chaos.inject import FAULT_SUBDIR, read_marker, write_trigger
from support.controlplane import ControlPlane
from support.kept_pods import attempts_started, kubectl_pods, pods_of
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
def test_a_hung_rank_is_stalled_pinned_on_its_node_and_restarted_in_place(
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    env = {"TINYGPT_STEPS": "30", "TINYGPT_STALL_AT": "15", "TINYGPT_STALL_RANK": "1",
           "TINYGPT_STALL_SECONDS": "86400", "TINYGPT_STALL_IGNORES_TERM": "1"}  # fmt: skip
    with Recorder(jobs.api_client, job_namespace, "hang") as recorder:
        jobs.create(_manifest("hang", env))
        jobs.wait("hang", lambda s: (s.get("step") or 0) >= 5, 240, "attempt 0 to train")
        before = pods_of(jobs, "hang")
        # The watch, not a status poll: Stopping can last less than the poll's second.
        stopping = recorder.wait_phase(("Stopping",), 240, "the stall to be decided")
        done = jobs.wait("hang", finished, 300, "the job to restart and finish")
    assert done["phase"] == "Succeeded", done.get("conditions")
    plan = stopping["plan"]
    assert (plan["signal"], plan["action"], plan["inPlace"]) == (
        "Stalled", "RestartFromLatest", True
    )  # fmt: skip
    (suspect,) = plan["suspects"]
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    first, relaunched = placed(recorder, 0), placed(recorder, 1)
    hung_node = first[1]
    assert (suspect["rank"], suspect["node"], suspect["avoid"]) == (1, hung_node, True), suspect
    assert "faults.py" in suspect["reason"], suspect["reason"]

    last_step_at = max(r["time"] for rank in (0, 1) for r in logs.steps(0, rank))
    assert max(r["step"] for r in logs.steps(0, 1)) == 14, "rank 1 hangs before step 15"
    phases = recorder.phases()
    stopped_at = next(at for at, phase, _ in phases if phase == "Stopping")
    latency = stopped_at - last_step_at
    print(f"\nhang: last completed step 14 -> Stopping in {latency:.1f} s "
          f"(stallSeconds {STALL_SECONDS}); torch's default process-group timeouts: "
          "NCCL 600 s, gloo 1800 s")  # fmt: skip
    assert latency <= STALL_SECONDS + 5, latency
    # The hung rank ignores TERM: KILLed once the grace period (5 s) is over, well inside
    # the bound after which its pod would be replaced (grace + 10 s).
    planned_at = next(at for at, phase, _ in phases if phase == "Planning")
    print(f"stop in place: Stopping -> Planning {planned_at - stopped_at:.1f} s")
    assert planned_at - stopped_at < 5 + 10, phases
    hung_log = local_cluster.logs(job_namespace, "hang-a0-1")
    assert "outlived the 5 s grace period: KILL" in hung_log, hung_log[-2000:]

    (entry,) = done["rollbackHistory"]
    assert (entry["signal"], entry["action"]) == ("Stalled", "RestartFromLatest")
    assert (entry["restartedInPlace"], entry["replacedPods"]) == (2, 0)
    # The newest checkpoint the operator knew of: 10 once a scrape listed its PFS copy as
    # complete; 5 when that copy completed after rank 1 hung (the agent exports its
    # inventory at steps, and no step follows).
    assert entry["toStep"] in (5, 10), entry
    assert logs.steps(1)[0]["step"] == entry["toStep"] + 1
    assert [(s["rank"], s["node"]) for s in entry["suspects"]] == [(1, hung_node)]
    assert relaunched == first, "the same pods, on the same nodes, run attempt 1"
    after = pods_of(jobs, "hang")
    print(
        f"placement: attempt 0 {first}, attempt 1 {relaunched}\n"
        f"{kubectl_pods(control_plane, job_namespace)}"
    )
    assert {n: (p.uid, p.restarts, p.attempt) for n, p in after.items()} == {
        n: (p.uid, 0, 1) for n, p in before.items()
    }
    assert [(n["node"], n["incidents"]) for n in done["suspectNodes"]] == [(hung_node, 1)]
    reasons = [e["reason"] for e in jobs.events("hang")]
    assert "SuspectNode" in reasons
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


@pytest.mark.usefixtures("operator")
def test_a_rank_that_cannot_be_killed_gets_its_pod_replaced(
    jobs: Jobs, job_namespace: str, local_cluster: LocalCluster, control_plane: ControlPlane
) -> None:
    """A hung rank frozen (cgroup freezer: a KILL stays pending, as in uninterruptible sleep)
    survives the stop; its pod is replaced, on another node, while its peer restarts in
    place."""
    unavailable = freezer.available()
    if unavailable:
        pytest.skip(unavailable)
    env = {"TINYGPT_STEPS": "30", "TINYGPT_STALL_AT": "15", "TINYGPT_STALL_RANK": "1",
           "TINYGPT_STALL_SECONDS": "86400"}  # fmt: skip
    jobs.create(_manifest("stuck", env))
    jobs.wait("stuck", lambda s: (s.get("step") or 0) >= 5, 240, "attempt 0 to train")
    before = pods_of(jobs, "stuck")
    deadline = time.monotonic() + 120
    while "rank 1 stalls" not in local_cluster.logs(job_namespace, "stuck-a0-1"):
        assert time.monotonic() < deadline, (
            jobs.status("stuck"),
            local_cluster.logs(job_namespace, "stuck-a0-1")[-3000:],
        )
        time.sleep(0.2)
    workers = [
        pid for pid in local_cluster.pod_processes(job_namespace, "stuck-a0-1") if _is_worker(pid)
    ]
    assert workers, "rank 1's worker process was not found"
    with freezer.frozen(workers):
        done = jobs.wait("stuck", finished, 300, "the job to replace the stuck pod and finish")
        after = pods_of(jobs, "stuck")
        table = kubectl_pods(control_plane, job_namespace)
    assert done["phase"] == "Succeeded", done.get("conditions")
    print(f"\nstuck rank frozen (pids {workers}):\n{table}")
    (entry,) = done["rollbackHistory"]
    assert (entry["signal"], entry["action"]) == ("Stalled", "RestartFromLatest")
    assert (entry["restartedInPlace"], entry["replacedPods"], entry["replacedRanks"]) == (
        1, 1, [1]
    )  # fmt: skip
    replaced = [e["message"] for e in jobs.events("stuck") if e["reason"] == "PodReplaced"]
    assert any(
        "survived KILL" in m or "did not stop within the grace period" in m for m in replaced
    ), replaced
    assert "stuck-a0-1" not in after
    assert (after["stuck-a0-0"].uid, after["stuck-a0-0"].attempt) == (
        before["stuck-a0-0"].uid, 1
    )  # fmt: skip
    assert after["stuck-a1-1"].node not in (before["stuck-a0-1"].node, ""), after
    supervisor_log = local_cluster.logs(job_namespace, "stuck-a0-1")
    assert "left processes a KILL did not end" in supervisor_log, supervisor_log[-2000:]


@pytest.mark.usefixtures("operator")
def test_a_lost_node_replaces_only_its_pod(
    jobs: Jobs, job_namespace: str, local_cluster: LocalCluster, control_plane: ControlPlane
) -> None:
    """The node of rank 1 is lost: its pod, whose supervisor never answers the stop, is
    replaced on another node; rank 0's pod restarts in place with its UID unchanged."""
    env = {"TINYGPT_STEPS": "40", "TINYGPT_STEP_SECONDS": "0.1"}
    jobs.create(_manifest("lost", env))
    jobs.wait("lost", lambda s: (s.get("step") or 0) >= 12, 240, "attempt 0 to train")
    before = pods_of(jobs, "lost")
    lost_node = before["lost-a0-1"].node
    local_cluster.lose_node(lost_node)
    try:
        relaunched = jobs.wait(
            "lost", lambda s: (s.get("attempt") or 0) >= 1, 180, "the relaunch without the node"
        )
        done = jobs.wait("lost", finished, 300, "the job to finish")
        after = pods_of(jobs, "lost")
        table = kubectl_pods(control_plane, job_namespace)
    finally:
        left = local_cluster.restore_node(lost_node)
    print(f"\nlost {lost_node}:\n{table}")
    assert left == [], "the operator force-deleted the lost pod when it replaced it"
    assert done["phase"] == "Succeeded", done.get("conditions")
    print(json.dumps(done["rollbackHistory"], indent=1))
    print([(e["reason"], e["message"]) for e in jobs.events("lost")])
    (entry,) = done["rollbackHistory"]
    assert entry["action"] == "RestartFromLatest", entry
    assert (entry["restartedInPlace"], entry["replacedPods"], entry["replacedRanks"]) == (
        1, 1, [1]
    ), relaunched.get("rollbackHistory")  # fmt: skip
    # The lost node is the suspect, not the survivor whose collective broke on it (before,
    # after a 5 s wait for the lost pod to end, the survivor's node was blamed).
    assert [(s["node"], s["avoid"]) for s in entry["suspects"]] == [(lost_node, True)], entry
    assert (after["lost-a0-0"].uid, after["lost-a0-0"].attempt) == (before["lost-a0-0"].uid, 1)
    new = after["lost-a1-1"]
    assert new.node not in ("", lost_node), after
    assert attempts_started(local_cluster, job_namespace, "lost-a0-0") == [0, 1]


def _is_worker(pid: int) -> bool:
    """torchrun's worker process (`python -u examples/tiny-gpt/train.py ...`)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"-u" in argv and any(arg.endswith(b"train.py") for arg in argv)


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


@pytest.mark.chaos
def test_a_node_that_kills_its_rank_twice_is_left_by_the_relaunch(
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    """The first kill restarts both pods in place (a process killed on a node that still
    runs is not yet the node's fault); the same kill there again is the node's second
    incident, not a crash loop: its pod is replaced, away from the node. About 45 s: marked
    `chaos` (-m chaos) for the cold CI budget; the rule is unit-tested in
    tests/unit/operator/test_machine_incidents.py (a second incident on the node counts)."""
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
    assert [h["signal"] for h in history] == ["WorkerFailure", "WorkerFailure"], history
    for entry in history:
        assert [(s["node"], s["avoid"]) for s in entry["suspects"]] == [("node-b", True)]
        assert "killed by signal 9" in entry["suspects"][0]["reason"]
    # The newest checkpoint, on both tiers: rank 1 flushed its copies before it died, rank 0
    # (its collective broken) finished its own and answered until a scrape listed them, and
    # the operator scraped until none was in flight. Planned from the scrape before the kill,
    # this restart once failed with NoUsableCheckpoint (step 5 still in flight, 10 unseen).
    assert history[0]["toStep"] == 10, history[0]
    assert (history[0]["restartedInPlace"], history[0]["replacedPods"]) == (2, 0)
    bad_rank = next(r for r, node in placed(recorder, 0).items() if node == "node-b")
    assert placed(recorder, 1) == placed(recorder, 0), "attempt 1 ran in the same pods"
    assert (history[1]["restartedInPlace"], history[1]["replacedRanks"]) == (1, [bad_rank])
    for attempt in range(2, done["attempt"] + 1):
        assert "node-b" not in placed(recorder, attempt).values(), attempt
    (bad,) = done["suspectNodes"]
    assert (bad["node"], bad["incidents"]) == ("node-b", len(history))
    print(f"\nbad node: {len(history)} incident(s), suspect list {done['suspectNodes']}")
