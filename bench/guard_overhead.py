"""What the guard costs per training step, measured against the bare loop side by side.

The loops train the same tiny character-level GPT on CPU from the same weights with the
same data helper. The bare loop clips, steps the optimizer and the scheduler itself (what
``guard.step`` replaces); the guarded loop calls ``guard.step``; the third loop is the
guarded one with a CheckpointManager attached whose memory tier (on /dev/shm where it
exists) snapshots every ``--memory-interval`` steps, as in a pod with the default
spec.checkpoints.memory. The loops take turns step by step in one process (which goes
first rotates too), so drift in machine load hits all alike. Each step is timed in CPU time
of the training thread: on a machine shared with other work, wall time mostly measures the
neighbours (the snapshot's write and commit run in their own thread, so what the step pays
is the staging and the hand-over). Each round's ratio is the median step over the median
bare step; the median ratio over the rounds is reported with its spread, never an absolute
threshold. The memory tier's cost is also given as the ratio of mean steps (the snapshot
steps included) to the guarded loop's. Host syncs per step are counted by wrapping Tensor's
sync points from the outside, not by a counter the guard keeps.

    .venv/bin/python bench/guard_overhead.py [--rounds 20] [--steps 30] [--layers 2] ...
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.states import ModelOptimizerState
from stabletrain_agent.data import Shard, ShardedBatches
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_contract.directives import Directives

MODEL_PATH = Path(__file__).resolve().parents[1] / "examples" / "tiny-gpt" / "model.py"
SYNC_POINTS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy")
SHARD_SAMPLES = 256
NEVER_SAVES = 10**9
"""The memory loop's save interval: it measures the snapshots alone (checkpoint_io.py
measures the local saves)."""


def load_model_module() -> Any:
    spec = importlib.util.spec_from_file_location("tiny_gpt_model", MODEL_PATH)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the tiny GPT from {MODEL_PATH}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Loop:
    """One model, optimizer, scheduler and data stream; ``guard`` is None for the bare loop."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batches: ShardedBatches[torch.Tensor, torch.Tensor]
    guard: Guard | None
    manager: CheckpointManager | None = None

    def step(self) -> float:
        """One training step; its CPU time in seconds (this thread only)."""
        start = time.thread_time()
        batch = next(self.batches)
        loss = self.model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        if self.guard is not None:
            self.guard.step(loss, tokens=batch[:, :-1].numel())
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad()
        return time.thread_time() - start

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def make_loop(
    module: Any,
    config: Any,
    block: int,
    batch_size: int,
    guarded: bool,
    *,
    memory: tuple[Path, int] | None = None,
) -> Loop:
    """One loop; `memory` (a scratch directory and the snapshot interval) attaches a
    CheckpointManager with the memory tier to the guard."""
    torch.manual_seed(0)
    model = module.TinyGPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 100))

    def read(shard_id: str, start: int, stop: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(int(shard_id.split("-")[1]))
        tokens = torch.randint(
            0, config.vocab_size, (SHARD_SAMPLES, block + 1), generator=generator
        )
        return tokens[start:stop]

    batches = ShardedBatches(
        [Shard(f"shard-{i}", SHARD_SAMPLES) for i in range(8)],
        read,
        torch.cat,
        batch_size=batch_size,
    )
    guard = None
    if guarded:
        guard = Guard(
            model,
            optimizer,
            scheduler=scheduler,
            max_grad_norm=1.0,
            data=batches,
            directives=DirectiveSource(0, Directives(generation=1, attempt=0)),
            guard_env=GuardEnv(),
        )
    manager = None
    if guard is not None and memory is not None:
        scratch, interval = memory
        (scratch / "pfs").mkdir()
        settings = CheckpointConfig(
            scratch / "local",
            scratch / "pfs",
            0,
            "bench",
            interval_steps=NEVER_SAVES,
            memory_root=scratch / "memory",
            memory_interval_steps=interval,
        )
        manager = CheckpointManager(
            settings,
            {"train": ModelOptimizerState(model, optimizer), "guard": guard},
            {"scheduler": scheduler},
        )
        manager.restore()
        guard.checkpoints = manager
    return Loop(model, optimizer, scheduler, batches, guard, manager)


def snapshot_blocking(loop: Loop) -> list[float]:
    """How long the snapshot of the step just taken held the training thread (if any)."""
    manager, guard = loop.manager, loop.guard
    if manager is None or manager.memory is None or guard is None:
        return []
    if not manager.is_snapshot_step(guard.global_step):
        return []
    return [manager.memory.last_blocking_s]


def count_syncs(loop: Loop, steps: int) -> float:
    """Sync-point calls per step, counted by wrapping Tensor's methods from the outside."""
    calls = 0
    originals: dict[str, Callable[..., Any]] = {}

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return original(*args, **kwargs)

        return counted

    for name in SYNC_POINTS:
        originals[name] = getattr(torch.Tensor, name)
        setattr(torch.Tensor, name, wrap(originals[name]))
    try:
        loop.train(steps)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return calls / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30, help="steps per loop per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=64, help="embedding width")
    parser.add_argument("--block", type=int, default=64, help="context length in characters")
    parser.add_argument(
        "--memory-interval", type=int, default=10, help="snapshot interval of the memory loop"
    )
    args = parser.parse_args()
    if args.rounds < 2 or args.steps < 1 or args.memory_interval < 1:
        raise SystemExit("need --rounds >= 2, --steps >= 1, --memory-interval >= 1")
    torch.set_num_threads(args.threads)
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as scratch:
        measure(args, Path(scratch))


def measure(args: argparse.Namespace, scratch: Path) -> None:

    module = load_model_module()
    config = module.GPTConfig(n_layer=args.layers, n_embd=args.embd, block_size=args.block)
    block, batch = config.block_size, args.batch_size
    bare = make_loop(module, config, block, batch, guarded=False)
    guarded = make_loop(module, config, block, batch, guarded=True)
    memory = make_loop(module, config, block, batch, guarded=True,
                       memory=(scratch, args.memory_interval))  # fmt: skip
    loops = (bare, guarded, memory)
    for loop in loops:
        loop.train(args.steps)

    medians: list[list[float]] = [[], [], []]
    ratios: list[list[float]] = [[], []]
    mean_ratios: list[float] = []
    blocking: list[float] = []
    for _ in range(args.rounds):
        times: list[list[float]] = [[], [], []]
        for index in range(args.steps):
            for turn in range(3):
                which = (index + turn) % 3
                times[which].append(loops[which].step())
            blocking.extend(snapshot_blocking(memory))
        for which in range(3):
            medians[which].append(statistics.median(times[which]))
        ratios[0].append(medians[1][-1] / medians[0][-1])
        ratios[1].append(medians[2][-1] / medians[0][-1])
        mean_ratios.append(statistics.mean(times[2]) / statistics.mean(times[1]))
    if memory.manager is not None:
        memory.manager.close()

    bare_times, guarded_times, memory_times = medians
    quartiles = statistics.quantiles(ratios[0], n=4)
    median = statistics.median(ratios[0])
    params = sum(p.numel() for p in bare.model.parameters())
    print(
        f"tiny GPT: {config.n_layer} layers, {config.n_embd} dim, block {config.block_size}, "
        f"batch {args.batch_size}, {params} parameters; AdamW; CPU, {args.threads} thread(s)"
    )
    print(f"{args.rounds} rounds x {args.steps} steps per loop, alternating step by step")
    print(f"bare step    median {statistics.median(bare_times) * 1e3:8.3f} ms CPU")
    print(f"guarded step median {statistics.median(guarded_times) * 1e3:8.3f} ms CPU")
    print(
        f"ratio guarded/bare: median {median:.4f}  IQR {quartiles[0]:.4f}-{quartiles[2]:.4f}  "
        f"min {min(ratios[0]):.4f}  max {max(ratios[0]):.4f}  -> overhead "
        f"{100 * (median - 1):+.2f}% (target <= +1%)"
    )
    with_memory = statistics.median(ratios[1])
    memory_quartiles = statistics.quantiles(ratios[1], n=4)
    print(f"guarded + memory tier (snapshot every {args.memory_interval} steps) step median "
          f"{statistics.median(memory_times) * 1e3:8.3f} ms CPU")  # fmt: skip
    print(
        f"ratio guarded+memory/bare: median {with_memory:.4f}  IQR {memory_quartiles[0]:.4f}-"
        f"{memory_quartiles[2]:.4f}  -> overhead {100 * (with_memory - 1):+.2f}% "
        f"(guarded alone {100 * (median - 1):+.2f}%)"
    )
    mean_ratio = statistics.median(mean_ratios)
    mean_quartiles = statistics.quantiles(mean_ratios, n=4)
    print(
        f"mean step guarded+memory/guarded (snapshot steps included): median {mean_ratio:.4f}  "
        f"IQR {mean_quartiles[0]:.4f}-{mean_quartiles[2]:.4f}; a snapshot holds the step "
        f"{statistics.median(blocking) * 1e3:.3f} ms (median of {len(blocking)}, wall)"
    )
    print(
        f"host syncs per step (Tensor sync points): bare {count_syncs(bare, args.steps):.2f}, "
        f"guarded {count_syncs(guarded, args.steps):.2f} "
        "(AdamW reads its CPU step counters with .item() in both loops)"
    )


if __name__ == "__main__":
    main()
