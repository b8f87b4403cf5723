"""What two-tier checkpointing costs, measured against plain baselines side by side.

1. Blocking time of the manager's asynchronous save (the part the training loop waits for:
   staging a snapshot of the state) against a synchronous ``torch.save`` of the same state,
   both fsynced, alternating.  The manager stages once when the attempt starts, so even the
   first save reuses the staging buffers; it is reported separately all the same.
2. Training-step slowdown while the background write, commit and PFS replication run,
   against steps with nothing in the background, alternating round by round.
3. PFS replication throughput (kernel copy, fsync, read-back CRC-32 verification against
   the manifest, rename) against plain ``cp`` of the same files between the same
   directories, once without and once followed by an fsync of the copied files
   (``sync FILE...``).

Ratios, not absolute thresholds: both sides run in the same process, interleaved.

    .venv/bin/python bench/checkpoint_io.py [--mb 256] [--rounds 3] [--dir /some/disk]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from stabletrain_agent.checkpoint.layout import local_copy_dir
from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.replicate import replicate_copy
from stabletrain_agent.checkpoint.signing import CheckpointKey

TENSOR_MB = 16


class BigState:
    """Model-and-optimizer-sized state: float32 tensors totalling the requested size."""

    def __init__(self, megabytes: int) -> None:
        count = max(1, megabytes // TENSOR_MB)
        numel = TENSOR_MB * (1 << 20) // 4
        self.tensors = {f"layer{i}.weight": torch.randn(numel) for i in range(count)}

    def state_dict(self) -> dict[str, Any]:
        return self.tensors

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tensors = state_dict

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class TrainStep:
    """A small MLP training step on CPU, the work the background write competes with."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batch = torch.randn(256, 512)

    def __call__(self) -> float:
        began = time.perf_counter()
        loss = self.model(self.batch).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return time.perf_counter() - began


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def synchronous_save(state: BigState, path: Path) -> float:
    began = time.perf_counter()
    with path.open("wb") as handle:
        torch.save(state.state_dict(), handle)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(path.parent)
    elapsed = time.perf_counter() - began
    path.unlink()
    return elapsed


def settle(manager: CheckpointManager) -> None:
    manager.wait()
    result = manager.flush(600)
    if result.timed_out:
        raise SystemExit(f"replication did not finish: {result}")


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="state size in MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where the two tiers live")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    local, pfs, scratch = work / "local", work / "pfs", work / "scratch"
    for directory in (pfs, scratch):
        directory.mkdir(parents=True)
    state = BigState(args.mb)
    mib = state.nbytes / (1 << 20)
    # Signed, as every job under the operator signs (the key of its Secret).
    key = CheckpointKey(os.urandom(32))
    config = CheckpointConfig(
        local, pfs, attempt=1, node="bench", keep_local=2, keep_pfs=2, key=key
    )
    manager = CheckpointManager(config, {"model": state})
    manager.restore()
    step = TrainStep()
    for _ in range(5):
        step()
    print(f"state {mib:.0f} MiB in {len(state.tensors)} tensors; tiers under {work}")

    sync_times, block_times = [], []
    first_block = 0.0
    checkpoint_step = 0
    for index in range(args.rounds + 1):
        sync_times.append(synchronous_save(state, scratch / "sync.pt"))
        checkpoint_step += 1
        manager.save(checkpoint_step, stable=True)
        if index == 0:
            first_block = manager.last_blocking_s
        else:
            block_times.append(manager.last_blocking_s)
        settle(manager)
    sync_median = statistics.median(sync_times)
    block_median = statistics.median(block_times)
    print("\n[1] blocking time of a save (s)")
    print(f"  torch.save + fsync (synchronous): {spread(sync_times)}")
    print(f"  manager.save, first of the attempt: {first_block:.3f}")
    print(f"  manager.save, later saves:        {spread(block_times)}")
    print(
        f"  ratio async/sync: {block_median / sync_median:.1%} later saves, "
        f"{first_block / sync_median:.1%} first  (target <= 10%)"
    )

    quiet, busy, slowdowns, overlap = [], [], [], []
    for _ in range(args.rounds):
        quiet_round = [step() for _ in range(20)]
        checkpoint_step += 1
        manager.save(checkpoint_step, stable=True)
        busy_round = []
        while manager.background_busy:
            busy_round.append(step())
        settle(manager)
        quiet_round += [step() for _ in range(20)]
        if busy_round:
            quiet.append(statistics.median(quiet_round))
            busy.append(statistics.median(busy_round))
            slowdowns.append(busy[-1] / quiet[-1] - 1)
            overlap.append(len(busy_round))
    print("\n[2] training step while the save is written and replicated (s per step)")
    print(f"  nothing in the background (before and after): {spread(quiet)}")
    print(f"  background write + replication: {spread(busy)}  ({sum(overlap)} steps overlapped)")
    print(
        f"  slowdown per step while the background work runs, per round: "
        f"median {statistics.median(slowdowns):+.1%} "
        f"(min {min(slowdowns):+.1%}, max {max(slowdowns):+.1%})"
    )

    source = local_copy_dir(local, checkpoint_step, 1)
    files = sorted(p for p in source.iterdir())
    total = sum(p.stat().st_size for p in files) / (1 << 20)
    cp_plain, cp_synced, replication = [], [], []
    kinds = ("cp", "repl", "cp+sync")
    for index in range(args.rounds):
        for kind in kinds[index % 3 :] + kinds[: index % 3]:  # rotate who goes first
            target = pfs / f"round-{index}-{kind.replace('+', '-')}"
            target.mkdir()
            began = time.perf_counter()
            if kind == "repl":
                replicate_copy(local, target, checkpoint_step, 1, "bench", key=key)
                replication.append(total / (time.perf_counter() - began))
            else:
                subprocess.run(["cp", *map(str, files), str(target)], check=True)
                if kind == "cp+sync":
                    subprocess.run(["sync", *(str(target / p.name) for p in files)], check=True)
                    cp_synced.append(total / (time.perf_counter() - began))
                else:
                    cp_plain.append(total / (time.perf_counter() - began))
            shutil.rmtree(target)
    ratios_synced = [r / c for r, c in zip(replication, cp_synced, strict=True)]
    ratios_plain = [r / c for r, c in zip(replication, cp_plain, strict=True)]
    print(f"\n[3] replication of one node's copy ({total:.0f} MiB) to the PFS tier (MiB/s)")
    print(f"  cp:                      {spread(cp_plain)}")
    print(f"  cp + fsync of the files: {spread(cp_synced)}")
    print(f"  replication (fsync + verify + rename): {spread(replication)}")
    print(
        f"  ratio replication/cp per round: median {statistics.median(ratios_synced):.0%} "
        f"(min {min(ratios_synced):.0%}, max {max(ratios_synced):.0%}) vs cp + fsync, "
        f"median {statistics.median(ratios_plain):.0%} vs plain cp  (target >= 80%)"
    )
    manager.close()


if __name__ == "__main__":
    main()
