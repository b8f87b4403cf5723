"""The chaos harness's fault injection (support.chaos.inject), each kind seen to take effect
where it happens: in the process table, the pods' logs, the ranks' step logs, the trigger
markers, the mounts, the checkpoint files, the control plane. Healing them all together,
and what it costs, is `make chaos`'s business (bench/chaos.py); this file checks that every
fault it injects is real, on one short job per test, three local nodes with two used.
"""

from __future__ import annotations

import math
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, verify_copy
from stabletrain_operator.naming import ATTEMPT_LABEL
from support.chaos.inject import Injected, Injector, training_processes
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.localnode.remount import mount_state
from support.operator import Jobs, OperatorProcess, checkpoint_key
from support.tinygpt import StepLogs, job_manifest

NODES = ("node-a", "node-b", "node-c")
EVERY = 5
STALL_SECONDS = 5
PFS_SECONDS = 6.0
LOST_NODE_SECONDS = 35.0
"""Past the control plane's 10 s grace and the workers' 15 s toleration: the lost pods are
marked for deletion by then, and the returning node finalizes them."""
PFS_MOUNT = "/stabletrain/pfs"
Json = dict[str, Any]


@pytest.fixture
def local_cluster(
    api_client: client.ApiClient, control_plane: ControlPlane
) -> Iterator[LocalCluster]:
    """Three nodes, the job uses two: a relaunch away from a suspect node has one to go to."""
    with LocalCluster(api_client, nodes=NODES) as cluster:
        yield cluster
    control_plane.check_alive()


def _manifest(name: str) -> Json:
    """A run longer than any test waits for (the operator fixture deletes it), checkpoints
    every 5 steps, stalls decided after 5 s."""
    manifest = job_manifest(
        name,
        {"TINYGPT_POISON_SHARDS": None, "TINYGPT_STEPS": "5000"},
        detection={"stallSeconds": STALL_SECONDS},
    )
    manifest["spec"]["checkpoints"]["intervalSteps"] = EVERY
    return manifest


def _until(what: str, timeout: float, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _running(jobs: Jobs, name: str, attempt: int, past: int = 0) -> Json:
    """The job Running in `attempt` with its step past `past`."""
    return jobs.wait(
        name,
        lambda s: s.get("attempt") == attempt and s.get("phase") == "Running"
        and (s.get("step") or 0) > past,
        180, f"attempt {attempt} to run past step {past}",
    )  # fmt: skip


def _write_in(pid: int, path: str) -> str:
    """Creates `path` inside the container of `pid`; "" when it worked, else the error."""
    done = subprocess.run(
        ["nsenter", "-t", str(pid), "--mount", "--root", "--", "sh", "-c", f": > {path}"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    return "" if done.returncode == 0 else done.stderr.strip()


def _node_ready(api_client: client.ApiClient, node: str) -> str:
    found = client.CoreV1Api(api_client).read_node(node)
    return next(c.status for c in found.status.conditions if c.type == "Ready")


def _copy_of(path: Path) -> tuple[Path, int, int]:
    """The checkpoint copy a data file belongs to, with its step and attempt (a local copy
    is step-N/attempt-A/, a PFS part step-N/attempt-A/node-R/)."""
    copy = path.parent
    attempt_dir = copy.parent if copy.name.startswith("node-") else copy
    step = int(attempt_dir.parent.name.split("-")[1])
    return copy, step, int(attempt_dir.name.split("-")[1])


def _fired(injector: Injector, injected: Injected) -> Json:
    found: Json = _until(f"{injected.kind} to fire", 60, lambda: injector.fired(injected))
    return found


def _injector(
    *,
    control_plane: ControlPlane,
    operator: OperatorProcess,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
    job_namespace: str,
    job: str,
    **settings: float,
) -> Injector:
    pfs = local_cluster.shared_dir / job_namespace / "pfs"
    return Injector(
        plane=control_plane, cluster=local_cluster, operator=operator, api_client=api_client,
        namespace=job_namespace, job=job, pfs_dir=pfs, **settings,
    )  # fmt: skip


@pytest.mark.chaos
def test_spike_corruption_pfs_outage_operator_kill_nan_and_kill_take_effect(
    *,
    control_plane: ControlPlane,
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    """The short one, in `make test`: one relaunch (the NaN's rollback)."""
    name = "faults"
    jobs.create(_manifest(name))
    injector = _injector(
        control_plane=control_plane, operator=operator, local_cluster=local_cluster,
        api_client=api_client, job_namespace=job_namespace, job=name, pfs_seconds=PFS_SECONDS,
    )  # fmt: skip
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    pfs = local_cluster.shared_dir / job_namespace / "pfs"
    rng = random.Random(18)
    try:
        _running(jobs, name, 0, past=2 * EVERY)

        # spike: the next shard turns bad (read a few steps on, checked below).
        spike = injector.inject("spike", rng)
        shard = _fired(injector, spike)["shard"]

        # corrupt-checkpoint: the newest copy on one tier no longer verifies, same size.
        corrupt = injector.inject("corrupt-checkpoint", rng)
        copy, step, attempt = _copy_of(Path(corrupt.target))
        key = checkpoint_key(jobs.core, job_namespace, name)
        with pytest.raises(CheckpointCorruptError, match="crc32"):
            verify_copy(copy, step=step, attempt=attempt, key=key, deep=True)
        verify_copy(copy, step=step, attempt=attempt, key=key, deep=False)
        print(f"\ncorrupt-checkpoint: {corrupt.detail}")

        # pfs-readonly: writes in the pods fail with EROFS; after the outage they work again
        # and the PFS copies catch up.
        pids = {
            pod: pid
            for pod in (p["metadata"]["name"] for p in jobs.pods(name))
            for pid in training_processes(local_cluster, job_namespace, pod).values()
        }
        outage = injector.inject("pfs-readonly", rng)
        for pod, pid in pids.items():
            assert mount_state(pid, PFS_MOUNT) == "ro", pod
            refused = _write_in(pid, f"{PFS_MOUNT}/probe-{pod}")
            assert "Read-only file system" in refused, refused
        assert injector.tick() == [], "not over yet"
        newest = max(int(d.name.split("-")[1]) for d in pfs.glob("step-*"))
        _until("the outage to end", PFS_SECONDS + 10, injector.tick)
        for pod, pid in pids.items():
            assert mount_state(pid, PFS_MOUNT) == "rw", pod
            assert _write_in(pid, f"{PFS_MOUNT}/probe-{pod}") == "", pod
        _until("a PFS copy saved after the outage", 60, lambda: any(
            int(d.name.split("-")[1]) > newest for d in pfs.glob("step-*")
            if any(d.glob("attempt-*/node-*/MANIFEST.json"))
        ))  # fmt: skip
        print(f"pfs-readonly: {outage.detail}")

        # operator-kill: a new operator process takes over and keeps writing status.
        killed = injector.inject("operator-kill", rng)
        assert operator.alive()
        _running(jobs, name, 0, past=(jobs.status(name).get("step") or 0) + 2)
        print(f"operator-kill: {killed.detail}")

        poisoned = _until("the poisoned shard to be read", 90, lambda: [
            r for r in logs.steps(0) if shard in r["shards"] and r["poisoned"]
        ])  # fmt: skip
        before = [r["loss"] for r in logs.steps(0) if r["step"] < poisoned[0]["step"]][-5:]
        print(f"spike: {spike.detail}; {shard}: loss {sum(before) / len(before):.2f} "
              f"-> {poisoned[0]['loss']:.2f} at step {poisoned[0]['step']}")  # fmt: skip
        assert poisoned[0]["loss"] > 1.15 * sum(before) / len(before), (before, poisoned[0])

        # nan: a burst of NaN steps on one rank, the rollback replays those steps clean, and
        # the spike's shard is still bad in the next attempt.
        nan = injector.inject("nan", rng)
        struck = _fired(injector, nan)
        first = struck["step"]
        _running(jobs, name, 1, past=first + 3)
        steps = logs.steps(0, struck["rank"])
        nan_steps = [r["step"] for r in steps if not math.isfinite(r["loss"])]
        assert nan_steps == [first, first + 1, first + 2], nan_steps
        replayed = [r for r in logs.steps(1) if first <= r["step"] <= first + 2]
        assert len(replayed) == 3, "the rollback replays the NaN steps"
        assert all(math.isfinite(r["loss"]) for r in replayed), "it does not strike again"
        (start,) = [e for e in logs.events(1) if e["event"] == "start"]
        assert shard in start["poisoned"], "bad data stays bad"
        print(f"nan: {nan.detail}; NaN at steps {nan_steps} of attempt 0, replayed clean")

        # kill: the rank's training process is gone and torchrun saw it die of SIGKILL.
        kill = injector.inject("kill", rng)
        pod = f"{name}-a1-{kill.target.split()[1]}"
        _until("torchrun to report the SIGKILL", 30,
               lambda: "Signal 9 (SIGKILL)" in local_cluster.logs(job_namespace, pod))  # fmt: skip
        print(f"kill: {kill.detail}")
    finally:
        injector.close()


@pytest.mark.chaos
def test_hang_apiserver_restart_and_lost_node_take_effect(
    *,
    control_plane: ControlPlane,
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    """The long one (two relaunches, a node lost for 35 s), in `make chaos` only."""
    name = "outside"
    jobs.create(_manifest(name))
    injector = _injector(
        control_plane=control_plane, operator=operator, local_cluster=local_cluster,
        api_client=api_client, job_namespace=job_namespace, job=name,
        lost_node_seconds=LOST_NODE_SECONDS,
    )  # fmt: skip
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    rng = random.Random(18)
    try:
        _running(jobs, name, 0, past=2)

        # apiserver-restart: the operator, the pods' status and kubectl come back (and the
        # local cluster binds and runs the relaunched pods below).
        restarted = injector.inject("apiserver-restart", rng)
        _running(jobs, name, 0, past=(jobs.status(name).get("step") or 0) + 2)
        print(f"\napiserver-restart: {restarted.detail}")

        # hang: the rank stops inside a step, its agent still answers, the operator stalls
        # it, and the relaunch passes that step.
        hang = injector.inject("hang", rng)
        struck = _fired(injector, hang)
        hung = f"{name}-a0-{struck['rank']}"
        _until("the hang's own words in the pod's log", 30,
               lambda: "hangs inside step" in local_cluster.logs(job_namespace, hung))  # fmt: skip
        stalled = _running(jobs, name, 1, past=struck["step"] + 1)
        last = max(r["step"] for r in logs.steps(0, struck["rank"]))
        assert last == struck["step"] - 1, "no step of the hung rank completed after it"
        entry = stalled["rollbackHistory"][-1]
        assert entry["signal"] == "Stalled", entry
        print(f"hang: {hang.detail}; rank {struck['rank']} stuck in step {struck['step']}, "
              f"{entry['action']} to step {entry['toStep']}, passed in attempt 1")  # fmt: skip

        # lost-node: the node goes NotReady, its pod's processes die, the job moves; the
        # node comes back Ready and the pods it lost are finalized.
        lost = injector.inject("lost-node", rng)
        node = lost.target.split()[1]
        on_it = [p["metadata"]["name"] for p in jobs.pods(name) if p["spec"]["nodeName"] == node]
        assert on_it, node
        assert all(not local_cluster.pod_processes(job_namespace, pod) for pod in on_it)
        _until(f"{node} NotReady", 30, lambda: _node_ready(api_client, node) != "True")
        relaunched = _running(jobs, name, 2)
        assert relaunched["rollbackHistory"][-1]["signal"] == "WorkerFailure"
        placed = {
            p["spec"]["nodeName"]
            for p in jobs.pods(name)
            if p["metadata"]["labels"][ATTEMPT_LABEL] == "2"
        }
        assert node not in placed, placed
        (ended,) = _until("the node's time to be up", LOST_NODE_SECONDS + 10, injector.tick)
        assert ended == lost
        _until(f"{node} Ready again", 30, lambda: _node_ready(api_client, node) == "True")
        _until(f"the pods lost on {node} finalized", 30, lambda: not [
            p for p in jobs.pods(name) if p["metadata"]["name"] in on_it
        ])  # fmt: skip
        print(f"lost-node: {lost.detail}; attempt 2 on {sorted(placed)}; {node} Ready again")
    finally:
        injector.close()
