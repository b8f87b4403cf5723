"""One JSON line per step and rank: what the tests read (not needed to train).

`<log_dir>/attempt-<a>-rank-<r>.jsonl` holds the loss the agent saw, the LR the optimizer
applied (read by the optimizer's own step pre-hook, so the directives' scale shows), the
batch the step trained on and whether it came from a poisoned shard, and at the end how
many poisoned samples the dataset was asked for (prefetching included).
"""

import json
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch


class StepLog(pl.Callback):
    def __init__(self, log_dir: str, stabletrain: Any, data: Any) -> None:
        self.log_dir, self.stabletrain, self.data, self.applied_lr = log_dir, stabletrain, data, 0.0
        self.attempt = int(os.environ.get("STABLETRAIN_ATTEMPT", "0"))

    def write(self, trainer: pl.Trainer, **record: object) -> None:
        path = Path(self.log_dir) / f"attempt-{self.attempt}-rank-{trainer.global_rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as log:
            log.write(json.dumps({"attempt": self.attempt, "time": time.time(), **record}) + "\n")

    def read_lr(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.applied_lr = optimizer.param_groups[0]["lr"]

    def on_fit_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        trainer.optimizers[0].register_step_pre_hook(self.read_lr)
        self.write(trainer, event="start")

    def on_train_batch_end(self, trainer: pl.Trainer, *_: object) -> None:
        guard, lineage = self.stabletrain.guard, self.stabletrain.loader.last_lineage
        shards = sorted({r.shard_id for r in lineage.ranges})
        self.write(
            trainer,
            step=trainer.global_step,
            loss=guard.monitor.snapshot().loss,
            lr=self.applied_lr,
            lr_scale=guard.lr.scale,
            batch=lineage.batch_index,
            shards=shards,
            poisoned=bool(set(shards) & self.data.corpus.poisoned),
        )

    def on_fit_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.write(trainer, event="done", step=trainer.global_step, reads=self.data.poisoned_reads)

    def on_exception(self, trainer: pl.Trainer, *_: object) -> None:
        self.write(
            trainer, event="stopped", step=trainer.global_step, reads=self.data.poisoned_reads
        )
