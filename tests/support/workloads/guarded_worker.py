"""A real PyTorch loop under the real Guard, for operator tests of preflight and custom signals.

Run under torchrun in the operator's pods (gloo, DDP). A small MLP learns a noisy linear
map with AdamW, a linear LR warm-up and gradient clipping, from ShardedBatches; every
ST_VAL_EVERY steps it measures a real validation loss on held-out data and reports it with
``guard.observe("val_loss", ...)``. Knobs (environment):

- ST_STEPS, ST_STEP_SECONDS: length and pace of the run
- ST_CLIP: the Guard's max_grad_norm, or "none" for no clipping (a preflight finding)
- ST_VAL_EVERY: steps between validation measurements
- ST_VAL_SHIFT_AT: from this step the held-out targets drift (a real distribution shift:
  the model, trained on the old map, really does worse on them), so the validation loss
  rises for real
- ST_POISON_SHARDS: shard indices whose targets are scaled and shifted far from the rest
  (a poisoned stretch of data, consumed at the same steps every epoch unless skipped)
- ST_BATCH_STATS=1: report the "entropy" (of a softmax over the batch's targets) and the
  "reward" (their mean, offset to stay positive) of every batch, as an RL loop reports its
  rollouts' policy entropy and reward; the poisoned data collapses one and raises the other
- ST_CKPT_EVERY: save model, optimizer, scheduler and guard with the real CheckpointManager
  every N steps, and restore the directives' resume step at start (rollbacks)
- ST_METRICS_CSV: file under the PFS tier where global rank 0 appends one row per step
  (step, loss, grad_norm, lr, val_loss, entropy, reward), the values the Guard's monitor
  saw: the recorded history that `stabletrain replay` reads (the tripping step's row too:
  it is written before the trip is raised again; a relaunched attempt appends, so the
  step goes back where it resumed)
"""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.planned import restore_planned
from stabletrain_agent.checkpoint.states import ModelOptimizerState
from stabletrain_agent.data import Shard, ShardedBatches
from stabletrain_agent.guard import Guard
from stabletrain_agent.run_end.trip_exit import TrainingTripped
from stabletrain_contract import env

FEATURES = 8
SHARD_SAMPLES = 32
SHARDS = 64
WARMUP_STEPS = 5


def _truth() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)


POISON_SCALE = 30.0
POISON_SHIFT = 20.0
REWARD_OFFSET = 5.0


def _poisoned() -> set[int]:
    return {int(i) for i in os.environ.get("ST_POISON_SHARDS", "").split(",") if i}


def read(shard_id: str, start: int, stop: int) -> torch.Tensor:
    """Samples [x | y] of one shard, deterministic per shard."""
    index = int(shard_id.split("-")[1])
    generator = torch.Generator().manual_seed(index)
    x = torch.randn(SHARD_SAMPLES, FEATURES, generator=generator)
    y = x @ _truth() + 0.05 * torch.randn(SHARD_SAMPLES, 1, generator=generator)
    if index in _poisoned():
        y = POISON_SCALE * y + POISON_SHIFT
    return torch.cat([x, y], dim=1)[start:stop]


def batch_stats(targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Entropy of a softmax over the batch's targets, and their mean as a reward."""
    logits = targets.flatten()
    entropy = -(logits.softmax(0) * logits.log_softmax(0)).sum()
    return {"entropy": entropy, "reward": logits.mean() + REWARD_OFFSET}


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = int(os.environ.get("ST_STEPS", "60"))
    pause = float(os.environ.get("ST_STEP_SECONDS", "0.1"))
    clip_setting = os.environ.get("ST_CLIP", "1.0")
    val_every = int(os.environ.get("ST_VAL_EVERY", "2"))
    shift_at = int(os.environ.get("ST_VAL_SHIFT_AT", "-1"))
    csv_name = os.environ.get("ST_METRICS_CSV", "")
    stats = os.environ.get("ST_BATCH_STATS") == "1"
    checkpoint_every = int(os.environ.get("ST_CKPT_EVERY", "0"))

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(),
                                                  nn.Linear(32, 1)))  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / WARMUP_STEPS)
    )
    batches = ShardedBatches(
        [Shard(f"shard-{i}", SHARD_SAMPLES) for i in range(SHARDS)], read, torch.cat,
        batch_size=8 * world, rank=rank, world_size=world,
    )  # fmt: skip
    guard = Guard.from_env(
        model, optimizer, scheduler=scheduler, data=batches,
        max_grad_norm=None if clip_setting == "none" else float(clip_setting),
    )  # fmt: skip
    manager = None
    if checkpoint_every:
        manager = CheckpointManager(
            CheckpointConfig.from_env(),
            # The schedule is the same on every rank, so it is app state: per-rank state is
            # keyed by the global rank, which torchrun's c10d rendezvous may hand to another
            # pod in the relaunched attempt (its node's copy then lacks that key).
            {"train": ModelOptimizerState(model, optimizer), "guard": guard, "sched": scheduler},
        )
        guard.checkpoints = manager
        restore_planned(manager, guard.applied, termination_path=guard.env.termination_path)
    generator = torch.Generator().manual_seed(1000 + rank)
    val_x = torch.randn(64, FEATURES, generator=generator)
    val_y = val_x @ _truth()
    out = None
    if rank == 0 and csv_name:
        path = Path(os.environ[env.PFS_CHECKPOINT_DIR]) / csv_name
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not path.exists()
        out = path.open("a", newline="", encoding="utf-8")
    writer = csv.writer(out) if out is not None else None
    if writer is not None and fresh:
        writer.writerow(["step", "loss", "grad_norm", "lr", "val_loss", "entropy", "reward"])
    try:
        while guard.global_step < steps:
            batch = next(batches)
            loss = nn.functional.mse_loss(model(batch[:, :FEATURES]), batch[:, FEATURES:])
            torch.autograd.backward(loss)
            step = guard.global_step + 1
            if step % val_every == 0:
                drift = 1.0 if 0 <= shift_at <= step else 0.0
                with torch.no_grad():
                    predicted = model(val_x)
                val = nn.functional.mse_loss(predicted, val_y + drift * val_x.sum(1, True))
                guard.observe("val_loss", val)
            if stats:
                for name, value in batch_stats(batch[:, FEATURES:]).items():
                    guard.observe(name, value)
            tripped = None
            try:
                guard.step(loss, tokens=batch.shape[0])
            except TrainingTripped as error:
                tripped = error
            optimizer.zero_grad()
            if writer is not None and out is not None:
                seen = guard.monitor.snapshot()
                custom = [seen.custom.get(name) for name in ("val_loss", "entropy", "reward")]
                writer.writerow([
                    seen.step, _cell(seen.loss), _cell(seen.grad_norm), _cell(seen.lr),
                    *("" if value is None else repr(value) for value in custom),
                ])  # fmt: skip
                out.flush()
            if tripped is not None:
                raise tripped
            if manager is not None and guard.global_step % checkpoint_every == 0:
                manager.save(guard.global_step, stable=True)
            time.sleep(pause)
        if manager is not None:
            manager.wait()
            manager.flush(30.0)
    finally:
        if out is not None:
            out.close()
        guard.close()
    dist.destroy_process_group()


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return "nan" if math.isnan(value) else repr(value)


if __name__ == "__main__":
    main()
