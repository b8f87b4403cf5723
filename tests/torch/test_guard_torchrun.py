"""The guard under a real ``torchrun --nproc-per-node=2`` (gloo on 127.0.0.1).

Each test starts torchrun as a managed process (killed with its workers on any failure),
lets the workers log every step, and judges the logs, the termination message and the
lineage files the run left behind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletrain_contract import env
from stabletrain_contract.checkpoint.inventory import CopyFlags
from stabletrain_contract.detection import DetectionConfig, NonFiniteConfig
from stabletrain_contract.directives import Directives, SkipRange, SkipUnit
from stabletrain_contract.names import Signal
from stabletrain_contract.trip_report import parse_termination_message
from support.agent_client import AgentUnreachableError, fetch_status, put_directives
from support.processes import ManagedProcess, free_port

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "workers" / "guarded_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
RUN_TIMEOUT = 120.0
TOKEN = "test-token-0123456789"
LIVE_DIRECTIVE_BOUND_SECONDS = 2.0
"""A PUT must change the LR of both ranks at the same step within this long."""


class Job:
    """One torchrun job: its own logs and termination message, storage shared by attempts."""

    def __init__(
        self, root: Path, directives: Directives, storage: Path | None = None, **extra_env: str
    ) -> None:
        self.tmp_path = root
        self.log_dir = root / "logs"
        self.log_dir.mkdir(parents=True)
        storage = storage or root
        self.termination = root / "termination-log"
        self.lineage = storage / "pfs" / "lineage"
        self.agent_port = free_port()
        # The PFS tier is a mount in a pod: the manager refuses to create it.
        (storage / "pfs" / "checkpoints").mkdir(parents=True, exist_ok=True)
        directives_file = root / "directives.json"
        directives_file.write_text(directives.to_json())
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [
                    str(REPO / "trainer-agent"),
                    str(REPO / "contract"),
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "ST_TEST_LOG_DIR": str(self.log_dir),
            env.ATTEMPT: str(directives.attempt),
            env.NODE_NAME: "node-a",
            env.DIRECTIVES_PATH: str(directives_file),
            env.DIRECTIVES_TOKEN: TOKEN,
            env.AGENT_PORT: str(self.agent_port),
            env.AGENT_BIND_ADDRESS: "127.0.0.1",
            env.TERMINATION_MESSAGE_PATH: str(self.termination),
            env.LINEAGE_DIR: str(self.lineage),
            env.LOCAL_CHECKPOINT_DIR: str(storage / "local"),
            env.PFS_CHECKPOINT_DIR: str(storage / "pfs" / "checkpoints"),
            **extra_env,
        }

    def argv(self) -> list[str]:
        return [
            str(TORCHRUN),
            "--nproc-per-node=2",
            "--nnodes=1",
            "--max-restarts=0",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            str(WORKER),
        ]

    def records(self, rank: int) -> list[dict[str, Any]]:
        path = self.log_dir / f"rank-{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture
def torchrun(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    started: list[ManagedProcess] = []
    yield started
    for process in started:
        process.stop()


def start(started: list[ManagedProcess], job: Job) -> ManagedProcess:
    process = ManagedProcess("torchrun", job.argv(), job.tmp_path / "torchrun.log", env=job.env)
    started.append(process)
    return process


def wait_exit(process: ManagedProcess, timeout: float = RUN_TIMEOUT) -> int:
    deadline = time.monotonic() + timeout
    while process.alive():
        if time.monotonic() > deadline:
            raise AssertionError(f"torchrun still running after {timeout}s:\n{process.log_tail()}")
        time.sleep(0.1)
    code = process.popen.returncode
    assert code is not None
    return code


def test_nan_on_one_rank_stops_both_at_that_step_with_the_report(
    tmp_path: Path, torchrun: list[ManagedProcess]
) -> None:
    directives = Directives(
        generation=1,
        attempt=0,
        detection=DetectionConfig(non_finite=NonFiniteConfig(consecutive_steps=1)),
    )
    job = Job(
        tmp_path,
        directives,
        ST_TEST_STEPS="40",
        ST_TEST_NAN_STEP="7",
        ST_TEST_NAN_RANK="1",
        ST_TEST_CHECKPOINT_EVERY="2",
    )
    process = start(torchrun, job)
    code = wait_exit(process)
    assert code != 0, process.log_tail()

    for rank in (0, 1):
        records = job.records(rank)
        assert [r["step"] for r in records[:-1]] == list(range(1, 7)), records
        assert records[-1] == {"tripped": 7, "finite": True}
        assert all(r["finite"] for r in records[:-1])
        assert all(r["syncs"] == 1 for r in records[:-1]), records
    report = parse_termination_message(job.termination.read_text())
    print("trip report:", job.termination.read_text())
    assert report.step == 7
    assert report.onset_step == 7
    assert report.signal == Signal.NON_FINITE
    assert report.node == "node-a"
    assert report.attempt == 0
    assert "NonFinite" in report.firing
    assert len(job.termination.read_bytes()) <= 4096
    # The real checkpoint manager was flushed before the report: the newest pre-onset
    # checkpoint (step 6) is complete on the local tier and on the PFS.
    inventory = {step: CopyFlags(flags) for step, attempt, flags in report.inventory}
    assert CopyFlags.PFS_COMPLETE in inventory[6], report.inventory
    assert CopyFlags.LOCAL_COMPLETE in inventory[6], report.inventory
    # Step 7 read global batch 6 (samples 48-55 of 4-sample shards: rank 0 shard-12, rank 1
    # shard-13); steps 6 and 5 read batches 5 and 4, two steps before the onset at most.
    assert report.suspect_shards == (
        "shard-12",
        "shard-13",
        "shard-10",
        "shard-11",
        "shard-8",
        "shard-9",
    )
    lineage_dir = Path(report.lineage_path)
    windows = {rank: json.loads((lineage_dir / f"rank-{rank}.json").read_text()) for rank in (0, 1)}
    assert [s["step"] for s in windows[0]["steps"]] == list(range(1, 8))
    ranks_batches = [
        (w["steps"][-1]["batchIndex"], w["steps"][-1]["ranges"]) for w in windows.values()
    ]
    assert ranks_batches[0][0] == ranks_batches[1][0] == 6
    assert ranks_batches[0][1] == [{"shardId": "shard-12", "start": 0, "stop": 4}]
    assert ranks_batches[1][1] == [{"shardId": "shard-13", "start": 0, "stop": 4}]


def test_live_reduce_lr_takes_effect_on_both_ranks_at_the_same_step(
    tmp_path: Path, torchrun: list[ManagedProcess]
) -> None:
    job = Job(
        tmp_path,
        Directives(generation=1, attempt=0),
        ST_TEST_STEPS="3000",
        ST_TEST_STEP_SLEEP="0.02",
        ST_TEST_STOP_AFTER_GENERATION="2",
    )
    process = start(torchrun, job)
    base_url = f"http://127.0.0.1:{job.agent_port}"
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        assert process.alive(), process.log_tail()
        assert time.monotonic() < deadline, "the job never reached step 10"
        try:
            status = fetch_status(base_url, timeout=1.0)
        except AgentUnreachableError:
            status = None
        if status is not None and (status.step or 0) >= 10:
            break
        time.sleep(0.1)

    put_at = time.time()
    result = put_directives(
        base_url, Directives(generation=2, attempt=0, lr_scale=0.5), TOKEN, timeout=5.0
    )
    assert result.status == 200
    assert result.ack.applied_generation == 2
    assert wait_exit(process) == 0, process.log_tail()

    first_scaled: dict[int, dict[str, Any]] = {}
    for rank in (0, 1):
        records = job.records(rank)
        for record in records:
            ratio = record["used_lr"] / record["scheduled_lr"]
            if record["generation"] < 2 or record is records[0]:
                assert ratio == pytest.approx(1.0, rel=1e-3), record
        scaled = [r for r in records if r["used_lr"] / r["scheduled_lr"] < 0.75]
        assert scaled, records[-3:]
        assert all(r["used_lr"] / r["scheduled_lr"] == pytest.approx(0.5, rel=1e-3) for r in scaled)
        first_scaled[rank] = scaled[0]
        adoption = [
            r
            for r, before in zip(records[1:], records, strict=False)
            if r["generation"] != before["generation"]
        ]
        assert [r["step"] for r in adoption] == [scaled[0]["step"] - 1]
        steady = [r["syncs"] for r in records if r not in adoption]
        assert set(steady) == {1}, steady
        print(f"rank {rank}: syncs at the adoption step {adoption[0]['syncs']}, else 1 per step")
    assert first_scaled[0]["step"] == first_scaled[1]["step"]
    latency = max(r["time"] for r in first_scaled.values()) - put_at
    print(f"live ReduceLR: PUT to first scaled step {first_scaled[0]['step']}: {latency:.3f} s")
    assert latency < LIVE_DIRECTIVE_BOUND_SECONDS


def test_a_rollback_attempt_resumes_with_scaled_ramped_lr_and_skips_the_data(
    tmp_path: Path, torchrun: list[ManagedProcess]
) -> None:
    storage = tmp_path / "storage"
    first = Job(
        tmp_path / "attempt-0",
        Directives(generation=1, attempt=0),
        storage,
        ST_TEST_STEPS="6",
        ST_TEST_CHECKPOINT_EVERY="2",
    )
    assert wait_exit(start(torchrun, first)) == 0, torchrun[-1].log_tail()
    rollback = Directives(
        generation=2,
        attempt=1,
        resume_step=4,
        lr_scale=0.5,
        rewarmup_steps=2,
        skip=(SkipRange(first=5, last=6, unit=SkipUnit.STEP),),
    )
    second = Job(
        tmp_path / "attempt-1", rollback, storage, ST_TEST_STEPS="4", ST_TEST_CHECKPOINT_EVERY="2"
    )
    assert wait_exit(start(torchrun, second)) == 0, torchrun[-1].log_tail()

    for rank in (0, 1):
        before, after = first.records(rank), second.records(rank)
        assert [r["step"] for r in after] == [5, 6, 7, 8]
        # The scheduler resumed where step 4 left it; the guard scales and ramps on top.
        assert [r["scheduled_lr"] for r in after] == pytest.approx(
            [0.05 / (1 + 0.01 * (step - 1)) for step in (5, 6, 7, 8)], rel=1e-6
        )
        ratios = [r["used_lr"] / r["scheduled_lr"] for r in after]
        assert ratios == pytest.approx([0.25, 0.5, 0.5, 0.5], rel=1e-3)
        # Steps 5 and 6 of the tripped attempt read batches 4 and 5: never again.
        skipped = {r["batch"]: r["ranges"] for r in before if r["step"] in (5, 6)}
        assert sorted(skipped) == [4, 5]
        assert [r["batch"] for r in after] == [6, 7, 8, 9]
        assert not any(r["ranges"] in skipped.values() for r in after)
