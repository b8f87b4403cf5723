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

import torch
from transformers import TrainerCallback


class StepLog(TrainerCallback):
    def __init__(self, log_dir: str, stabletrain: Any, data: Any) -> None:
        self.log_dir, self.stabletrain, self.data, self.applied_lr = log_dir, stabletrain, data, 0.0
        self.attempt, self.rank = (
            int(os.environ.get(n, "0")) for n in ("STABLETRAIN_ATTEMPT", "RANK")
        )

    def write(self, **record: object) -> None:
        path = Path(self.log_dir) / f"attempt-{self.attempt}-rank-{self.rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as log:
            log.write(json.dumps({"attempt": self.attempt, "time": time.time(), **record}) + "\n")

    def read_lr(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.applied_lr = optimizer.param_groups[0]["lr"]

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        getattr(kwargs["optimizer"], "optimizer", kwargs["optimizer"]).register_step_pre_hook(
            self.read_lr
        )
        self.write(event="start")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        guard, lineage = self.stabletrain.guard, self.stabletrain.loader.last_lineage
        shards = sorted({r.shard_id for r in lineage.ranges})
        self.write(
            step=state.global_step,
            loss=guard.monitor.snapshot().loss,
            lr=self.applied_lr,
            lr_scale=guard.lr.scale,
            batch=lineage.batch_index,
            shards=shards,
            poisoned=bool(set(shards) & self.data.corpus.poisoned),
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.write(event="done", step=state.global_step, reads=self.data.poisoned_reads)
