"""The chaos harness's fault injection (support.chaos.inject), each kind seen to take effect
where it happens: in the process table, the pods' logs, the ranks' step logs, the trigger
markers, the mounts, the checkpoint files, the control plane. Healing them all together,
and what it costs, is `make chaos`'s business (bench/chaos.py); this file checks that every
fault it injects is real, on one short job per test, three local nodes with two used.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from support.chaos.inject import Injected, Injector
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess
from support.tinygpt import StepLogs, job_manifest

NODES = ("node-a", "node-b", "node-c")
EVERY = 5
STALL_SECONDS = 5
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


def test_kill_nan_hang_and_spike_each_take_effect_once(
    *,
    control_plane: ControlPlane,
    operator: OperatorProcess,
    jobs: Jobs,
    job_namespace: str,
    local_cluster: LocalCluster,
    api_client: client.ApiClient,
) -> None:
    name = "faults"
    jobs.create(_manifest(name))
    injector = _injector(
        control_plane=control_plane, operator=operator, local_cluster=local_cluster,
        api_client=api_client, job_namespace=job_namespace, job=name,
    )  # fmt: skip
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    rng = random.Random(18)
    try:
        _running(jobs, name, 0, past=2)

        # spike: the next shard turns bad, for this attempt and every later one.
        spike = injector.inject("spike", rng)
        struck = _fired(injector, spike)
        shard = struck["shard"]
        poisoned = _until("the poisoned shard to be read", 90, lambda: [
            r for r in logs.steps(0) if shard in r["shards"] and r["poisoned"]
        ])  # fmt: skip
        before = [r["loss"] for r in logs.steps(0) if r["step"] < poisoned[0]["step"]][-5:]
        print(f"\nspike: {spike.detail}; fired {struck}; loss {sum(before) / len(before):.2f} "
              f"-> {poisoned[0]['loss']:.2f} at step {poisoned[0]['step']}")  # fmt: skip
        assert poisoned[0]["loss"] > 1.15 * sum(before) / len(before), (before, poisoned[0])

        # kill: the rank's training process is gone and torchrun saw it die of SIGKILL.
        kill = injector.inject("kill", rng)
        rank = int(kill.target.split()[1])
        pod = f"{name}-a0-{rank}"
        _until("torchrun to report the SIGKILL", 30,
               lambda: "Signal 9 (SIGKILL)" in local_cluster.logs(job_namespace, pod))  # fmt: skip
        print(f"kill: {kill.detail}")
        _running(jobs, name, 1)
        (start,) = [e for e in logs.events(1) if e["event"] == "start"]
        assert shard in start["poisoned"], "the spike's shard is still bad in the next attempt"

        # nan: a burst of NaN steps on one rank, and the replay after the rollback is clean.
        nan = injector.inject("nan", rng)
        struck = _fired(injector, nan)
        assert struck["attempt"] == 1
        first = struck["step"]
        _running(jobs, name, 2, past=first + 3)
        steps = logs.steps(1, struck["rank"])
        nan_steps = [r["step"] for r in steps if not math.isfinite(r["loss"])]
        assert nan_steps == [first, first + 1, first + 2], nan_steps
        replayed = [r for r in logs.steps(2) if first <= r["step"] <= first + 2]
        assert len(replayed) == 3, "the rollback replays the NaN steps"
        assert all(math.isfinite(r["loss"]) for r in replayed), "it does not strike again"
        print(f"nan: {nan.detail}; NaN at steps {nan_steps} of attempt 1, replayed clean")

        # hang: the rank stops inside a step, its agent still answers, the operator stalls it.
        hang = injector.inject("hang", rng)
        struck = _fired(injector, hang)
        hung = f"{name}-a{struck['attempt']}-{struck['rank']}"
        _until("the hang's own words in the pod's log", 30,
               lambda: "hangs inside step" in local_cluster.logs(job_namespace, hung))  # fmt: skip
        stalled = _running(jobs, name, struck["attempt"] + 1, past=struck["step"] + 1)
        last = max(r["step"] for r in logs.steps(struck["attempt"], struck["rank"]))
        assert last == struck["step"] - 1, "no step of the hung rank completed after it"
        entry = stalled["rollbackHistory"][-1]
        assert entry["signal"] == "Stalled", entry
        print(
            f"hang: {hang.detail}; rank {struck['rank']} stuck in step {struck['step']}, "
            f"{entry['action']} to step {entry['toStep']}, passed it in the next attempt"
        )
    finally:
        injector.close()
