"""A character-level GPT on Shakespeare's plays, guarded by stabletrain, under torchrun.

Run it the way the operator's pods do (`torchrun train.py`: torchrun's settings arrive as
PET_* variables, the agent's as STABLETRAIN_* variables), or standalone::

    torchrun --nproc-per-node 2 examples/tiny-gpt/train.py --checkpoint-dir /tmp/tg \\
        --poison-shards shard-0008

The loop is a plain PyTorch loop; stabletrain adds three lines (marked 1, 2, 3): the Guard
(signals, NaN protection, directives, trips), its step in place of clip/optimizer/scheduler
steps, and the checkpoint save. The CheckpointManager restores the step the operator's
directives name, and the data helper (ShardedBatches) resumes at the exact cursor and never
reads what the skip-list names.

Every option has an environment variable (TINYGPT_<OPTION>, e.g. TINYGPT_POISON_SHARDS), so
a StableTrainingJob sets them in the container's env. Each rank appends one JSON line per
step to `<log dir>/attempt-<a>-rank-<r>.jsonl` (by default under the PFS tier, which every
node sees): the agent's view of the step (loss, baseline, LR with the directives' scale),
the batch read (its index, shards and sample ranges) and whether it was poisoned, so tests
and the demo see what really happened.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from corpus import VOCAB_SIZE, Corpus
from faults import Faults, Triggered
from model import GPTConfig, TinyGPT
from torch.nn.parallel import DistributedDataParallel
from triggers import TriggerBox, shard_read_next

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.planned import RestoreFailed, restore_planned
from stabletrain_agent.checkpoint.states import ModelOptimizerState, RngState
from stabletrain_agent.data import ShardedBatches
from stabletrain_agent.guard import Guard
from stabletrain_agent.run_end.trip_exit import TrainingTripped
from stabletrain_contract import env
from stabletrain_contract.signals.monitor import Verdict

LOG_SUBDIR = "tiny-gpt-log"
FAULT_SUBDIR = "tiny-gpt-faults"


def _option(
    parser: argparse.ArgumentParser, name: str, kind: Callable[[str], Any], default: Any, doc: str
) -> None:
    variable = "TINYGPT_" + name.upper().replace("-", "_")
    raw = os.environ.get(variable)
    parser.add_argument(
        f"--{name}",
        type=kind,
        default=kind(raw) if raw is not None else default,
        help=f"{doc} (env {variable}; default {default})",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, kind, default, doc in (
        ("steps", int, 300, "optimizer steps in all (the run ends at this global step)"),
        ("layers", int, 2, "transformer blocks"),
        ("width", int, 128, "embedding width"),
        ("heads", int, 4, "attention heads"),
        ("block", int, 64, "characters of context"),
        ("batch", int, 8, "sequences per rank per step"),
        ("shard-samples", int, 256, "sequences per shard"),
        ("lr", float, 3e-3, "peak learning rate of the schedule"),
        ("warmup", int, 20, "steps of the schedule's linear warm-up"),
        ("seed", int, 1234, "seed of the weights and of the sample order"),
        ("checkpoint-dir", str, "", "standalone: tiers under DIR/local and DIR/pfs"),
        ("log-dir", str, "", f"per-step JSON lines (default: <PFS tier>/{LOG_SUBDIR})"),
        (
            "fault-dir",
            str,
            "",
            f"trigger files asking for NaN, hang, spike now (default: <PFS tier>/{FAULT_SUBDIR})",
        ),
        ("step-seconds", float, 0.0, "sleep after each step (slows the run to watch it)"),
        ("poison-shards", str, "", "comma-separated shard ids filled with random characters"),
        ("fault-attempt", int, 0, "the attempt in which NaN, kill and stall strike"),
        ("nan-at", int, -1, "first step whose loss is NaN"),
        ("nan-steps", int, 3, "NaN steps in a row"),
        ("nan-rank", int, 0, "rank whose loss is NaN"),
        ("kill-at", int, -1, "step at which a rank SIGKILLs itself"),
        ("kill-rank", int, 1, "the rank that is killed"),
        ("kill-node", str, "", "a bad node: the rank on it dies at --kill-at in every attempt"),
        ("stall-at", int, -1, "step at which a rank stalls"),
        ("stall-rank", int, 1, "the rank that stalls"),
        ("stall-seconds", float, 0.0, "how long it stalls"),
        ("stall-ignores-term", int, 0, "1: the stalled rank ignores SIGTERM (only KILL ends it)"),
        ("slow-rank", int, -1, "a slow rank: it sleeps --slow-seconds before every step"),
        ("slow-seconds", float, 0.0, "how long the slow rank sleeps per step"),
    ):
        _option(parser, name, kind, default, doc)
    return parser.parse_args(argv)


def schedule(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to a tenth: the shape LLM runs use."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def checkpoint_config(args: argparse.Namespace) -> CheckpointConfig:
    """The job's tiers and checkpoint settings from the pod's env (the operator sets them
    from spec.checkpoints); standalone, the tiers are DIR/local and DIR/pfs and the same
    STABLETRAIN_* variables, if set, give the interval and the retention."""
    environ = dict(os.environ)
    if args.checkpoint_dir and not environ.get(env.LOCAL_CHECKPOINT_DIR):
        root = Path(args.checkpoint_dir)
        environ[env.LOCAL_CHECKPOINT_DIR] = str(root / "local")
        environ[env.PFS_CHECKPOINT_DIR] = str(root / "pfs")
        environ.setdefault(env.ATTEMPT, "0")
        environ.setdefault(env.NODE_NAME, "standalone")
    return CheckpointConfig.from_env(environ)


def faults_from(args: argparse.Namespace) -> Faults:
    return Faults(
        fault_attempt=args.fault_attempt,
        nan_at=args.nan_at,
        nan_steps=args.nan_steps,
        nan_rank=args.nan_rank,
        kill_at=args.kill_at,
        kill_rank=args.kill_rank,
        kill_node=args.kill_node,
        node=os.environ.get(env.NODE_NAME, ""),
        stall_at=args.stall_at,
        stall_rank=args.stall_rank,
        stall_seconds=args.stall_seconds,
        stall_ignores_term=bool(args.stall_ignores_term),
        slow_rank=args.slow_rank,
        slow_seconds=args.slow_seconds,
    )


class StepLog:
    """One JSON line per step of this rank: what the agent saw and what was read."""

    def __init__(self, directory: Path, attempt: int, rank: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._file = (directory / f"attempt-{attempt}-rank-{rank}.jsonl").open("a")
        self.attempt = attempt

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({"attempt": self.attempt, "time": time.time(), **record}))
        self._file.write("\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def main() -> None:
    entered = time.time()  # after torchrun's rendezvous and this interpreter's imports
    args = parse_args()
    dist.init_process_group("gloo")
    joined = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get(env.ATTEMPT, "0"))
    faults = faults_from(args)

    torch.manual_seed(args.seed)
    config = GPTConfig(
        vocab_size=VOCAB_SIZE,
        block_size=args.block,
        n_layer=args.layers,
        n_head=args.heads,
        n_embd=args.width,
    )
    model = DistributedDataParallel(TinyGPT(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(args.warmup, args.steps))
    poisoned = [s for s in args.poison_shards.split(",") if s]
    corpus = Corpus(args.block, args.shard_samples, poisoned=poisoned, seed=args.seed)
    batches = ShardedBatches(
        corpus.shards, corpus.read, torch.cat, batch_size=args.batch, rank=rank, world_size=world
    )

    guard = Guard.from_env(model, optimizer, scheduler=scheduler, data=batches)  # 1
    checkpoints = checkpoint_config(args)
    manager = CheckpointManager(
        checkpoints,
        {"train": ModelOptimizerState(model, optimizer), "guard": guard},
        {"scheduler": scheduler, "rng": RngState()},
    )
    guard.checkpoints = manager
    log_dir = Path(args.log_dir) if args.log_dir else checkpoints.pfs_root / LOG_SUBDIR
    log = StepLog(log_dir, attempt, rank)
    fault_dir = Path(args.fault_dir) if args.fault_dir else checkpoints.pfs_root / FAULT_SUBDIR
    triggered = Triggered(
        TriggerBox(fault_dir, rank, attempt),
        lambda: next_shard(batches, corpus),
        corpus.poison,
    )
    built = time.time()
    try:  # exactly the step the operator planned (0: nothing), or stop and say why
        restored = restore_planned(
            manager, guard.applied, termination_path=guard.env.termination_path
        )
    except RestoreFailed as failed:
        log.write({"event": "restore_failed", "message": failed.message})
        log.close()
        guard.close()
        raise
    log.write(
        {
            "event": "start",
            "restored_step": restored.step if restored else None,
            "restored_from": restored.source if restored else None,
            "generation": guard.applied_generation,
            "lr_scale": guard.lr.scale,
            "poisoned": sorted(corpus.poisoned),
            "entered": entered,
            "joined": joined,
            "built": built,
        }
    )
    try:
        while guard.global_step < args.steps:
            step = guard.global_step + 1
            if faults.kills(step, rank, attempt):
                # Dead once its copies are on the PFS, so every run restarts from the same
                # checkpoint; dying with a copy still in flight is the selection's unit tests.
                manager.flush(60.0)
            faults.before_step(step, rank, attempt)
            for strike in triggered.before_step(step):
                log.write({"event": "fault", **vars(strike)})
            batch = next(batches)
            loss = model(batch[:, :-1], batch[:, 1:])
            loss = triggered.loss(faults.loss(loss, step, rank, attempt))
            triggered.inside_step(step)
            torch.autograd.backward(loss)
            verdict = guard.step(loss, tokens=batch[:, :-1].numel())  # 2
            optimizer.zero_grad(set_to_none=True)
            if guard.is_save_step():  # every checkpoints.intervalSteps
                save(manager, guard, verdict)  # 3
            record_step(log, guard, batches, corpus)
            time.sleep(args.step_seconds)
        manager.wait()
        manager.flush(60.0)
        log.write({"event": "done", "step": guard.global_step})
    except TrainingTripped as tripped:
        record_step(log, guard, batches, corpus)
        report = tripped.report
        log.write({"event": "tripped", "step": report.step, "signal": str(report.signal)})
        raise
    finally:
        log.close()
        guard.close()
    manager.close()
    dist.destroy_process_group()


def save(manager: CheckpointManager, guard: Guard, verdict: Verdict) -> None:
    """A checkpoint taken inside an anomaly is kept as evidence, never resumed from."""
    snapshot = guard.monitor.snapshot()
    baseline = {"loss": snapshot.loss_baseline} if snapshot.loss_baseline is not None else {}
    manager.save(
        guard.global_step,
        stable=not verdict.findings,
        spike_marker=bool(verdict.findings),
        anomalies=[str(f.signal) for f in verdict.findings],
        baseline=baseline,
    )


def next_shard(batches: ShardedBatches[torch.Tensor, torch.Tensor], corpus: Corpus) -> str:
    """The shard a triggered spike poisons: the next one the data starts, past what the
    skip-list passes over and what is poisoned already."""
    passed_over = batches.skip.every_shard_named() | corpus.poisoned
    position = int(batches.state_dict()["position"])
    shard_ids = [s.shard_id for s in corpus.shards]
    return shard_read_next(position, shard_ids, corpus.shard_samples, passed_over)


def record_step(
    log: StepLog, guard: Guard, batches: ShardedBatches[torch.Tensor, torch.Tensor], corpus: Corpus
) -> None:
    snapshot = guard.monitor.snapshot()
    lineage = batches.last_lineage
    assert lineage is not None
    log.write(
        {
            "step": guard.global_step,
            "loss": snapshot.loss,
            "baseline": snapshot.loss_baseline,
            "grad_norm": snapshot.grad_norm,
            "lr": snapshot.lr,
            "lr_scale": guard.lr.scale,
            "generation": guard.applied_generation,
            "spike": snapshot.spike_active,
            "batch": lineage.batch_index,
            "shards": sorted({r.shard_id for r in lineage.ranges}),
            "samples": [[r.shard_id, r.start, r.stop] for r in lineage.ranges],
            "poisoned": any(r.shard_id in corpus.poisoned for r in lineage.ranges),
        }
    )


if __name__ == "__main__":
    main()
