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
- ST_METRICS_CSV: file under the PFS tier where global rank 0 appends one row per step
  (step, loss, grad_norm, lr, val_loss), the values the Guard's monitor saw: the recorded
  history that `stabletrain replay` reads (the tripping step's row too: it is written
  before the trip is raised again)
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

from stabletrain_agent.contract import env
from stabletrain_agent.data import Shard, ShardedBatches
from stabletrain_agent.guard import Guard
from stabletrain_agent.trip import TrainingTripped

FEATURES = 8
SHARD_SAMPLES = 32
SHARDS = 16
WARMUP_STEPS = 5


def _truth() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)


def read(shard_id: str, start: int, stop: int) -> torch.Tensor:
    """Samples [x | y] of one shard, deterministic per shard."""
    generator = torch.Generator().manual_seed(int(shard_id.split("-")[1]))
    x = torch.randn(SHARD_SAMPLES, FEATURES, generator=generator)
    y = x @ _truth() + 0.05 * torch.randn(SHARD_SAMPLES, 1, generator=generator)
    return torch.cat([x, y], dim=1)[start:stop]


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = int(os.environ.get("ST_STEPS", "60"))
    pause = float(os.environ.get("ST_STEP_SECONDS", "0.1"))
    clip_setting = os.environ.get("ST_CLIP", "1.0")
    val_every = int(os.environ.get("ST_VAL_EVERY", "2"))
    shift_at = int(os.environ.get("ST_VAL_SHIFT_AT", "-1"))
    csv_name = os.environ.get("ST_METRICS_CSV", "")

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
    generator = torch.Generator().manual_seed(1000 + rank)
    val_x = torch.randn(64, FEATURES, generator=generator)
    val_y = val_x @ _truth()
    out = None
    if rank == 0 and csv_name:
        path = Path(os.environ[env.PFS_CHECKPOINT_DIR]) / csv_name
        path.parent.mkdir(parents=True, exist_ok=True)
        out = path.open("w", newline="", encoding="utf-8")
    writer = csv.writer(out) if out is not None else None
    if writer is not None:
        writer.writerow(["step", "loss", "grad_norm", "lr", "val_loss"])
    try:
        for _ in range(steps):
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
            tripped = None
            try:
                guard.step(loss, tokens=batch.shape[0])
            except TrainingTripped as error:
                tripped = error
            optimizer.zero_grad()
            if writer is not None and out is not None:
                seen = guard.monitor.snapshot()
                val_seen = seen.custom.get("val_loss")
                writer.writerow([
                    seen.step, _cell(seen.loss), _cell(seen.grad_norm), _cell(seen.lr),
                    "" if val_seen is None else repr(val_seen),
                ])  # fmt: skip
                out.flush()
            if tripped is not None:
                raise tripped
            time.sleep(pause)
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
