"""A worker for torchrun tests: tiny GPT under DDP (gloo), guarded, logging what it sees.

Every rank appends one JSON line per step to ``$ST_TEST_LOG_DIR/rank-<r>.jsonl``: the
step, the LR the optimizer really used (read back from the SGD update, outside the guard),
the directive generation in force, the host syncs inside ``guard.step`` (counted by
wrapping Tensor's sync points), whether every parameter is finite, and the wall time.
Faults come from the environment: ``ST_TEST_NAN_STEP``/``ST_TEST_NAN_RANK`` poison the loss.
With ``ST_TEST_CHECKPOINT_EVERY`` the real CheckpointManager saves model, optimizer,
scheduler and guard, and restores the directives' resume step at start.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.planned import restore_planned
from stabletrain_agent.checkpoint.states import ModelOptimizerState
from stabletrain_agent.data import Shard, ShardedBatches
from stabletrain_agent.guard import Guard
from stabletrain_agent.run_end.trip_exit import TrainingTripped

BLOCK = 16
VOCAB = 32
SHARD_SAMPLES = 4
"""Small shards, so each rank's slice of a batch comes from a shard of its own."""
SYNC_POINTS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy")


def load_model_module() -> Any:
    path = Path(__file__).resolve().parents[3] / "examples" / "tiny-gpt" / "model.py"
    spec = importlib.util.spec_from_file_location("tiny_gpt_model", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Syncs:
    """Counts sync-point calls of the training thread while ``counting`` is set.

    Only the training thread: the checkpoint manager's background threads read tensors too,
    and their reads do not stall the step.
    """

    def __init__(self) -> None:
        self.count = 0
        self.counting = False
        self._thread = threading.get_ident()
        for name in SYNC_POINTS:
            setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name)))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any, **kwargs: Any) -> Any:
            if self.counting and threading.get_ident() == self._thread:
                self.count += 1
            return original(*args, **kwargs)

        return counting


def read(shard_id: str, start: int, stop: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(int(shard_id.split("-")[1]))
    return torch.randint(0, VOCAB, (SHARD_SAMPLES, BLOCK + 1), generator=generator)[start:stop]


def main() -> None:
    # A hung worker is killed by the test's timeout (120 s); leave its stacks in the log first.
    faulthandler.dump_traceback_later(100)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    log = Path(os.environ["ST_TEST_LOG_DIR"]) / f"rank-{rank}.jsonl"
    steps = int(os.environ.get("ST_TEST_STEPS", "20"))
    nan_step = int(os.environ.get("ST_TEST_NAN_STEP", "-1"))
    nan_rank = int(os.environ.get("ST_TEST_NAN_RANK", "-1"))
    stop_after_generation = int(os.environ.get("ST_TEST_STOP_AFTER_GENERATION", "0"))
    step_sleep = float(os.environ.get("ST_TEST_STEP_SLEEP", "0"))

    module = load_model_module()
    torch.manual_seed(0)
    config = module.GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=1, n_head=2, n_embd=32)
    model = DistributedDataParallel(module.TinyGPT(config))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.01 * s))
    batches = ShardedBatches(
        [Shard(f"shard-{i}", SHARD_SAMPLES) for i in range(16)],
        read,
        torch.cat,
        batch_size=4,
        rank=rank,
        world_size=world,
    )
    guard = Guard.from_env(model, optimizer, scheduler=scheduler, data=batches, max_grad_norm=None)
    manager = None
    checkpoint_every = int(os.environ.get("ST_TEST_CHECKPOINT_EVERY", "0"))
    if checkpoint_every:
        manager = CheckpointManager(
            CheckpointConfig.from_env(),
            {"train": ModelOptimizerState(model, optimizer), "guard": guard},
            {"scheduler": scheduler},
        )
        guard.checkpoints = manager
        resume_step = guard.applied.resume_step if guard.applied else None
        restored = restore_planned(manager, guard.applied)
        assert (restored.step if restored else 0) == (resume_step or 0), restored
    syncs = Syncs()
    generation_seen_at: int | None = None
    try:
        with log.open("a", encoding="utf-8") as out:
            for step in range(1, steps + 1):
                batch = next(batches)
                loss = model(batch[:, :-1], batch[:, 1:])
                if step == nan_step and rank == nan_rank:
                    loss = loss * float("nan")
                loss.backward()
                scheduled_lr = optimizer.param_groups[0]["lr"]
                before = [p.detach().clone() for p in model.parameters()]
                grads = torch.cat([p.grad.flatten() for p in model.parameters()])
                syncs.count, syncs.counting = 0, True
                try:
                    guard.step(loss, tokens=batch[:, :-1].numel())
                finally:
                    syncs.counting = False
                optimizer.zero_grad()
                if manager is not None and guard.global_step % checkpoint_every == 0:
                    manager.save(guard.global_step, stable=True)
                delta = torch.cat(
                    [
                        (p.detach() - b).flatten()
                        for p, b in zip(model.parameters(), before, strict=True)
                    ]
                )
                used_lr = float(-(delta @ grads) / (grads @ grads))
                assert batches.last_lineage is not None
                record = {
                    "step": guard.global_step,
                    "batch": batches.last_lineage.batch_index,
                    "ranges": [[r.shard_id, r.start, r.stop] for r in batches.last_lineage.ranges],
                    "time": time.time(),
                    "scheduled_lr": scheduled_lr,
                    "used_lr": used_lr,
                    "generation": guard.applied_generation,
                    "syncs": syncs.count,
                    "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
                }
                out.write(json.dumps(record) + "\n")
                out.flush()
                if stop_after_generation and guard.applied_generation >= stop_after_generation:
                    generation_seen_at = generation_seen_at or step
                    if step - generation_seen_at >= 5:
                        break
                time.sleep(step_sleep)
        if manager is not None:
            manager.wait()
            manager.flush(30.0)
    except TrainingTripped as tripped:
        with log.open("a", encoding="utf-8") as out:
            finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
            out.write(json.dumps({"tripped": tripped.report.step, "finite": finite}) + "\n")
        raise
    finally:
        guard.close()
    dist.destroy_process_group()
    # What the test reads is written by now. Leave before main's locals (the DDP model, the
    # optimizer, the manager) are torn down: in 2 of 3 CI runs of the live-ReduceLR test one
    # rank hung there for over 100 s, after the guard had closed and the process group was
    # destroyed (faulthandler: no Python frame below `main()`, one thread without any).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
