"""A killed rank restarted in place, without a cluster: what the memory tier saves.

The tiny-GPT example runs as 2 pods of 1 rank, each pod a `torchrun --nnodes 2` process on
loopback with its own local tier and its own memory tier (the emptyDir a pod keeps across a
restart of its processes), one PFS for both, and the checkpoint settings the operator's pod
builder derives from a spec (`pods.checkpoint_env`). Rank 1 SIGKILLs itself before step
`kill_at` (the example's fault). Then, as the operator and the pods' supervisors would: each
pod's tiers are scanned with the torch-free scan, the scans are merged, a RestartFromLatest
chooses its step (`choose_checkpoint` with the kept pods' memory, or with none: the pods
recreated), and both pods start attempt 1 with directives naming that step. What each pod
restored, and from which tier, is read from the example's own step log.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stabletrain_agent.checkpoint.inventory_scan import (
    TierDirs,
    VerifyCache,
    scan_tiers,
)
from stabletrain_agent.checkpoint.signing import UNSIGNED
from stabletrain_contract import env
from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.checkpoint.inventory_merge import merge_records
from stabletrain_contract.directives import Directives
from stabletrain_contract.names import Action
from stabletrain_operator import pods
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import Plan
from stabletrain_operator.plan.checkpoint import choose_checkpoint, surviving_memory
from support.processes import ManagedProcess, free_port

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "tiny-gpt" / "train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
PODS = ("tiny-gpt-a0-0", "tiny-gpt-a0-1")
"""The pods keep their names across a restart in place (an attempt-0 name, as today)."""
NODES = ("node-0", "node-1")
CHECKPOINT_INTERVAL = 25
"""The example's spec.checkpoints.intervalSteps."""
RUN_TIMEOUT = 300.0


@dataclass(frozen=True)
class Resumed:
    """What a restart planned and what the pods did."""

    done_steps: int
    """Steps the run finished before the kill."""
    planned: int
    reason: str
    restored: tuple[tuple[int | None, str | None], ...]
    """Per pod: (step, tier) the example's log says it restored."""

    @property
    def lost(self) -> int:
        return self.done_steps - self.planned


def job_spec(memory_interval: int) -> StableTrainingJobSpec:
    return StableTrainingJobSpec.model_validate(
        {
            "workers": {
                "nodes": 2,
                "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
            },
            "checkpoints": {
                "local": {"hostPath": "/nvme", "retention": 8},
                "pfs": {"claimName": "pfs", "retention": 8},
                "intervalSteps": CHECKPOINT_INTERVAL,
                "memory": {"intervalSteps": memory_interval},
            },
        }
    )


class TwoPods:
    """The job's 2 pods on this machine; `memory` names the directory of each pod's memory
    tier (a new name is a recreated pod: its memory starts empty)."""

    def __init__(self, base: Path, memory_interval: int) -> None:
        self.base = base
        self.spec = job_spec(memory_interval)
        (base / "pfs").mkdir(parents=True, exist_ok=True)
        self.memory = {rank: f"memory-{PODS[rank]}" for rank in range(2)}

    def recreate_pods(self) -> None:
        self.memory = {rank: f"memory-{PODS[rank]}-new" for rank in range(2)}

    def tiers(self, rank: int) -> TierDirs:
        """The pod's tiers as its supervisor finds them: from the pod's env alone."""
        return TierDirs.from_env(self.pod_env(rank, 0))

    def pod_env(self, rank: int, attempt: int, directives: Path | None = None) -> dict[str, str]:
        settings = {e["name"]: e["value"] for e in pods.checkpoint_env(self.spec)}
        if env.MEMORY_CHECKPOINT_DIR in settings:
            settings[env.MEMORY_CHECKPOINT_DIR] = str(self.base / self.memory[rank])
        return {
            **os.environ,
            **settings,
            "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("trainer-agent", "contract")),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONWARNINGS": "ignore",
            env.ATTEMPT: str(attempt),
            env.NODE_RANK: str(rank),
            env.NODE_NAME: NODES[rank],
            env.POD_NAME: PODS[rank],
            env.LOCAL_CHECKPOINT_DIR: str(self.base / f"local-{NODES[rank]}"),
            env.PFS_CHECKPOINT_DIR: str(self.base / "pfs"),
            env.AGENT_PORT: "0",
            env.AGENT_BIND_ADDRESS: "127.0.0.1",
            **({env.DIRECTIVES_PATH: str(directives)} if directives else {}),
        }

    def run(self, attempt: int, directives: Directives, *args: str) -> None:
        """One attempt: both pods' torchrun, until both ended (whatever their exit)."""
        path = self.base / f"directives-{attempt}.json"
        path.write_text(directives.to_json())
        port = free_port()
        processes: list[ManagedProcess] = []
        try:
            for rank in range(2):
                processes.append(
                    ManagedProcess(
                        f"pod-{rank}-attempt-{attempt}",
                        [
                            str(TORCHRUN),
                            "--nnodes=2",
                            "--nproc-per-node=1",
                            f"--node-rank={rank}",
                            "--master-addr=127.0.0.1",
                            f"--master-port={port}",
                            str(TRAIN),
                            *args,
                        ],
                        self.base / f"pod-{rank}-attempt-{attempt}.log",
                        env=self.pod_env(rank, attempt, path),
                        cwd=REPO,
                    )
                )
            deadline = time.monotonic() + RUN_TIMEOUT
            while any(p.alive() for p in processes) and time.monotonic() < deadline:
                time.sleep(0.2)
            stuck = [p.name for p in processes if p.alive()]
            assert not stuck, f"{stuck} still running after {RUN_TIMEOUT:.0f} s:\n" + "\n".join(
                p.log_tail() for p in processes
            )
        finally:
            for process in processes:
                process.stop()

    def inventory(self) -> list[CheckpointRecord]:
        """What the pods' supervisors would report: each pod's tiers, scanned torch-free."""
        key = UNSIGNED  # the bench runs unsigned, as a job made before signing
        return merge_records([scan_tiers(self.tiers(rank), VerifyCache(key)) for rank in range(2)])

    def log_events(self, attempt: int, rank: int) -> list[dict[str, Any]]:
        path = self.base / "pfs" / "tiny-gpt-log" / f"attempt-{attempt}-rank-{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if '"event"' in line]


def restart_plan(done_steps: int) -> Plan:
    return Plan(
        action=Action.RESTART_FROM_LATEST,
        rule="infrastructure",
        signal="WorkerFailure",
        from_step=done_steps,
        started_at=datetime.now(UTC),
        from_attempt=0,
        next_attempt=1,
    )


def kill(base: Path, *, memory_interval: int, kill_at: int) -> TwoPods:
    """Attempt 0 of the job under `base`, until rank 1 dies before step `kill_at`."""
    job = TwoPods(base, memory_interval)
    steps = f"--steps={kill_at + 5}"
    job.run(0, Directives(generation=1, attempt=0), steps, f"--kill-at={kill_at}")
    return job


def restart(job: TwoPods, done_steps: int, *, pods_kept: bool) -> Resumed:
    """Attempt 1: a RestartFromLatest in the same pods (`pods_kept`: their memory tiers
    survive) or in recreated ones, planned from the pods' scans; what they restored."""
    if not pods_kept:
        job.recreate_pods()
    kept = PODS if pods_kept else (None, None)
    choice = choose_checkpoint(
        job.inventory(),
        None,
        NODES,
        stable_only=False,
        memory_pods=surviving_memory(restart_plan(done_steps), kept),
    )
    directives = Directives(generation=2, attempt=1, resume_step=choice.step)
    job.run(1, directives, f"--steps={choice.step + 1}")
    restored = []
    for rank in range(2):
        start = next((e for e in job.log_events(1, rank) if e["event"] == "start"), {})
        restored.append((start.get("restored_step"), start.get("restored_from")))
    return Resumed(done_steps, choice.step, choice.reason, tuple(restored))


def kill_then_restart_both_ways(
    base: Path, *, memory_interval: int, kill_at: int
) -> tuple[Resumed, Resumed]:
    """One killed run, restarted twice from copies of its storage as it was left: in the
    same pods (memory kept) and in recreated pods (memory gone, today's recovery)."""
    job = kill(base / "kept", memory_interval=memory_interval, kill_at=kill_at)
    shutil.copytree(base / "kept", base / "recreated", symlinks=True)
    recreated = TwoPods(base / "recreated", memory_interval)
    done = kill_at - 1
    return (
        restart(job, done, pods_kept=True),
        restart(recreated, done, pods_kept=False),
    )
