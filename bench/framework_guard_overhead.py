"""What the stabletrain callback costs per step inside Lightning and the HF Trainer.

Both loops run inside ONE fit, so they share the process, the model, the allocator, the
caches and the machine's load: the fit's steps are cut into blocks, and blocks alternate
between the bare framework step and the guarded one in the pattern bare, guarded, guarded,
bare (repeated), so each pair of blocks has the other order from the last one and a drift
in load hits both alike. Within a bare block the step is the framework's own: batches from
a plain ``DataLoader``, ``clip_grad_norm_`` and the optimizer's step. Within a guarded
block everything stabletrain adds is on: batches from the skip-aware loader (its sampler,
the cursor consumed per step), the callback's optimizer step (the guard clips, observes,
applies the LR scale, exports), and in the Trainer the forward hook that collects the
loss. The callbacks are built and installed as a user does; the bench only switches, per
block, which loader a batch comes from, which step the optimizer's ``step`` runs, and
(Trainer) whether the loss hook is registered.

A step is the CPU time of the training thread from one step's end to the next (the batch
fetch included): on a machine shared with other work, wall time mostly measures the
neighbours. The first steps of every block are dropped (the frameworks fetch one batch
ahead, so a switch shows in the step before it). Each pair's ratio is the median guarded
step over the median bare step of its two blocks; the median over the pairs is reported
with its interquartile range and a 95% confidence interval of the median (order
statistics), never checked against a threshold.

As a cross-check the optimizer's step is timed from inside: what the guarded step costs
beyond the loss closure (Lightning runs forward and backward in it) and the AdamW update,
against what the bare step costs beyond the same two (the clipping), both per step.

The guarded steps write no checkpoints (bench/checkpoint_io.py measures the manager's
background saves), but the CheckpointManager is built on temporary tiers, as in a pod.

    .venv/bin/python bench/framework_guard_overhead.py [--framework lightning|hf|both]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    get_constant_schedule_with_warmup,
)

from stabletrain_agent.data import Shard
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_agent.integrations import hf, lightning
from stabletrain_contract import env

TINY_GPT = Path(__file__).resolve().parents[1] / "examples" / "tiny-gpt"
SHARD_SAMPLES = 256
VOCAB = 96
SETTLE_STEPS = 2
"""Steps dropped at the start of each block: the switch spills into them."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"tiny_gpt_{name}", TINY_GPT / f"{name}.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {name}.py from {TINY_GPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Windows(torch.utils.data.Dataset[torch.Tensor]):
    """Random token windows (the data's content does not matter)."""

    def __init__(self, block: int, shards: int = 8) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(
            0, VOCAB, (shards * SHARD_SAMPLES, block + 1), generator=generator
        )
        self.shards = [Shard(f"shard-{i}", SHARD_SAMPLES) for i in range(shards)]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]


@dataclass(frozen=True)
class Schedule:
    """Which loop step ``index`` of the fit belongs to: warm-up, then blocks B G G B ..."""

    warmup: int
    block: int
    pairs: int

    @property
    def total_steps(self) -> int:
        return self.warmup + 2 * self.pairs * self.block

    def block_of(self, index: int) -> int | None:
        """The block a step is in (None: warm-up, run bare)."""
        return None if index < self.warmup else (index - self.warmup) // self.block

    def guarded(self, index: int) -> bool:
        block = self.block_of(index)
        return block is not None and block % 4 in (1, 2)

    def counted(self, index: int) -> bool:
        block = self.block_of(index)
        return block is not None and (index - self.warmup) % self.block >= SETTLE_STEPS


@dataclass
class Timings:
    """Per-step CPU times of the training thread, by block, and the step's inside view."""

    schedule: Schedule
    steps: dict[int, list[float]] = field(default_factory=dict)
    own: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    """CPU inside the optimizer's step beyond the loss closure and the AdamW update."""
    fetch: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    """CPU of taking the step's batch from its loader."""
    hook: list[float] = field(default_factory=list)
    """CPU of the Trainer's loss hook per forward pass (guarded steps only)."""
    _last: float | None = None
    _ended: int = 0

    def step_ended(self) -> None:
        now = time.thread_time()
        index, self._ended = self._ended, self._ended + 1
        if self._last is not None and self.schedule.counted(index):
            block = self.schedule.block_of(index)
            assert block is not None
            self.steps.setdefault(block, []).append(now - self._last)
        self._last = now

    def record_own(self, index: int, seconds: float) -> None:
        if self.schedule.counted(index):
            self.own[self.schedule.guarded(index)].append(seconds)

    def record_fetch(self, index: int, seconds: float) -> None:
        if self.schedule.counted(index):
            self.fetch[self.schedule.guarded(index)].append(seconds)

    def direct(self) -> float:
        """Per step: the guarded step's and fetch's extra CPU over the bare ones, plus the
        loss hook (seconds)."""
        extra = statistics.median(self.own[True]) - statistics.median(self.own[False])
        extra += statistics.median(self.fetch[True]) - statistics.median(self.fetch[False])
        return extra + (statistics.median(self.hook) if self.hook else 0.0)


class TimedAdamW(torch.optim.AdamW):
    """AdamW that adds the CPU time of its own update to ``spent`` (the inside view)."""

    spent = 0.0

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        start = time.thread_time()
        try:
            return super().step(closure)
        finally:
            self.spent += time.thread_time() - start


class Interleaved:
    """Batch ``i`` of the fit from the skip-aware loader in guarded blocks, else a plain one.

    Both iterators stay open across blocks; the skip-aware one advances only on the
    batches the guarded steps consume, so its cursor stays exact.
    """

    def __init__(self, timings: Timings, guarded: SkipAwareLoader[Any], bare: Any) -> None:
        self.timings = timings
        self.guarded = guarded
        self.bare = bare

    def __iter__(self) -> Iterator[Any]:
        guarded, bare = iter(self.guarded), iter(self.bare)
        for index in range(self.timings.schedule.total_steps):
            start = time.thread_time()
            if self.timings.schedule.guarded(index):
                batch = next(guarded)
            else:
                try:
                    batch = next(bare)
                except StopIteration:  # a plain loader's epoch ends; the skip-aware one repeats
                    bare = iter(self.bare)
                    batch = next(bare)
            self.timings.record_fetch(index, time.thread_time() - start)
            yield batch


class StepSwitch:
    """The optimizer's ``step`` as the schedule says: the callback's, or the bare one.

    ``capture`` takes the optimizer's own step before the callback wraps it; ``install``
    (after the callback's start hook) puts the switch in front of the callback's step.
    """

    def __init__(self, timings: Timings, parameters: Callable[[], Any]) -> None:
        self.timings = timings
        self.parameters = parameters
        self.index = 0
        self._bare: Callable[..., Any] | None = None
        self._inside = False

    def capture(self, optimizer: torch.optim.Optimizer) -> None:
        self._bare = optimizer.step

    def install(self, optimizer: TimedAdamW) -> None:
        guarded, bare = optimizer.step, self._bare
        if bare is None or guarded is bare:
            raise RuntimeError("the stabletrain callback did not wrap the optimizer's step")

        def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
            if self._inside:  # the guard's own call of optimizer.step(): the real update
                return guarded(closure, **kwargs)
            index, self.index = self.index, self.index + 1
            start, inner_before, closure_time = time.thread_time(), optimizer.spent, 0.0

            def timed_closure() -> Any:
                nonlocal closure_time
                began = time.thread_time()
                try:
                    return closure() if closure is not None else None
                finally:
                    closure_time += time.thread_time() - began

            wrapped = timed_closure if closure is not None else None
            if self.timings.schedule.guarded(index):
                self._inside = True
                try:
                    result = guarded(wrapped, **kwargs)
                finally:
                    self._inside = False
            else:
                result = wrapped() if wrapped is not None else None
                torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
                bare(**kwargs)
            spent = time.thread_time() - start - closure_time - (optimizer.spent - inner_before)
            self.timings.record_own(index, spent)
            return result

        functools.update_wrapper(step, guarded)
        optimizer.step = step  # type: ignore[method-assign]


# ------------------------------------------------------------------------------- Lightning


def lightning_fit(schedule: Schedule, block: int, batch: int, layers: int, embd: int) -> Timings:
    model_module = load("model")
    config = model_module.GPTConfig(vocab_size=VOCAB, block_size=block, n_layer=layers, n_embd=embd)
    timings = Timings(schedule)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = model_module.TinyGPT(config)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.model(batch[:, :-1], batch[:, 1:])
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = TimedAdamW(self.parameters(), lr=3e-4)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: min(1.0, (s + 1) / 100)
            )
            return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    module = Module()
    switch = StepSwitch(timings, module.parameters)

    class Capture(pl.Callback):  # before the stabletrain callback: the optimizer's own step
        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            switch.capture(trainer.optimizers[0])

    class Switch(pl.Callback):  # after it: the switch in front of the callback's step
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            switch.install(trainer.optimizers[0])  # type: ignore[arg-type]

        def on_train_batch_end(self, *_: Any) -> None:
            timings.step_ended()

    data = Windows(block)
    guarded_loader = SkipAwareLoader(data, data.shards, batch_size=batch)
    stabletrain = lightning.StableTrainCallback(guarded_loader)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=schedule.total_steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Capture(), stabletrain, Switch()], plugins=[stabletrain.checkpoint_io],
    )  # fmt: skip
    loader = Interleaved(timings, guarded_loader, DataLoader(data, batch_size=batch))
    trainer.fit(module, train_dataloaders=loader)  # type: ignore[arg-type]
    return timings


# -------------------------------------------------------------------------------------- HF


def hf_fit(schedule: Schedule, block: int, batch: int, layers: int, embd: int) -> Timings:
    timings = Timings(schedule)

    class Ids(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self, windows: Windows) -> None:
            self.windows = windows

        def __len__(self) -> int:
            return len(self.windows)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            window = self.windows[index]
            return {"input_ids": window, "labels": window}

    windows = Windows(block)
    data = Ids(windows)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=block + 1, n_embd=embd, n_layer=layers, n_head=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    optimizer = TimedAdamW(model.parameters(), lr=3e-4)
    lr_schedule = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=100)
    switch = StepSwitch(timings, model.parameters)
    guarded_loader: SkipAwareLoader[Any] = SkipAwareLoader(data, windows.shards, batch_size=batch)
    stabletrain = hf.StableTrainCallback(guarded_loader)
    loader = Interleaved(timings, guarded_loader, DataLoader(data, batch_size=batch))

    def timed_hook(*args: Any, **kwargs: Any) -> None:
        start = time.thread_time()
        stabletrain._record_loss(*args, **kwargs)
        timings.hook.append(time.thread_time() - start)

    class Capture(TrainerCallback):  # before the stabletrain callback
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            switch.capture(optimizer)

    class Switch(TrainerCallback):  # after it
        hooked = True

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            switch.install(optimizer)

        def on_step_begin(self, args: Any, state: Any, control: Any, **__: Any) -> None:
            # The loss hook is part of what the callback adds; it runs in guarded blocks only.
            # (The bench reaches into the callback here: no user ever switches it off.)
            wanted = schedule.guarded(state.global_step)
            if wanted != self.hooked:
                if wanted:
                    stabletrain._hook = model.register_forward_hook(timed_hook, with_kwargs=True)
                elif stabletrain._hook is not None:
                    stabletrain._hook.remove()
                self.hooked = wanted

        def on_step_end(self, *_: Any, **__: Any) -> None:
            timings.step_ended()

    class Bench(Trainer):
        def get_train_dataloader(self) -> Any:
            return loader

    with tempfile.TemporaryDirectory(prefix="hf-bench-") as scratch:
        args = TrainingArguments(
            output_dir=scratch, max_steps=schedule.total_steps, per_device_train_batch_size=batch,
            save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
            disable_tqdm=True, dataloader_num_workers=0, max_grad_norm=0, ignore_data_skip=True,
        )  # fmt: skip
        trainer = Bench(
            model=model, args=args, train_dataset=data,
            callbacks=[Capture(), stabletrain, Switch()], optimizers=(optimizer, lr_schedule),
        )  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return timings


# ------------------------------------------------------------------------------------ main


def median_interval(values: list[float]) -> tuple[float, float]:
    """95% confidence interval of the median from order statistics (no distribution)."""
    ordered, n = sorted(values), len(values)
    half = 1.96 * math.sqrt(n) / 2
    low, high = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[low], ordered[high]


def report(name: str, timings: Timings) -> None:
    schedule = timings.schedule
    bare_steps: list[float] = []
    guarded_steps: list[float] = []
    ratios: list[float] = []
    for pair in range(schedule.pairs):
        first, second = timings.steps[2 * pair], timings.steps[2 * pair + 1]
        bare, guarded = (first, second) if pair % 2 == 0 else (second, first)
        bare_steps += bare
        guarded_steps += guarded
        ratios.append(statistics.median(guarded) / statistics.median(bare))
    quartiles = statistics.quantiles(ratios, n=4)
    median = statistics.median(ratios)
    low, high = median_interval(ratios)
    bare_median = statistics.median(bare_steps)
    own_guarded, own_bare = (statistics.median(timings.own[g]) for g in (True, False))
    counted = schedule.block - SETTLE_STEPS
    print(
        f"{name}: one fit, {schedule.pairs} pairs of {schedule.block}-step blocks (B G G B ..., "
        f"{counted} steps counted per block) after {schedule.warmup} warm-up steps"
    )
    print(f"  bare step    median {bare_median * 1e3:8.3f} ms CPU")
    print(f"  guarded step median {statistics.median(guarded_steps) * 1e3:8.3f} ms CPU")
    print(
        f"  ratio guarded/bare: median {median:.4f}  95% CI {low:.4f}-{high:.4f}  "
        f"IQR {quartiles[0]:.4f}-{quartiles[2]:.4f}  min {min(ratios):.4f}  max {max(ratios):.4f}"
        f"  -> overhead {100 * (median - 1):+.2f}% (target <= +1%)"
    )
    fetch_guarded, fetch_bare = (statistics.median(timings.fetch[g]) for g in (True, False))
    hook = f", loss hook {statistics.median(timings.hook) * 1e3:.3f} ms" if timings.hook else ""
    print(
        f"  timed directly, per step: optimizer step beyond closure and AdamW: guarded "
        f"{own_guarded * 1e3:.3f} ms, bare (clipping) {own_bare * 1e3:.3f} ms; batch fetch: "
        f"skip-aware {fetch_guarded * 1e3:.3f} ms, plain {fetch_bare * 1e3:.3f} ms{hook}"
    )
    print(
        f"  direct sum of what the guarded step adds: {timings.direct() * 1e3:+.3f} ms -> "
        f"{100 * timings.direct() / bare_median:+.2f}% of the bare step (target <= +1%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("lightning", "hf", "both"), default="both")
    parser.add_argument("--pairs", type=int, default=40, help="pairs of blocks (bare, guarded)")
    parser.add_argument("--block-steps", type=int, default=20, help="steps per block")
    parser.add_argument("--warmup", type=int, default=30, help="bare steps before the blocks")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--block", type=int, default=64)
    args = parser.parse_args()
    if args.pairs < 4 or args.block_steps < SETTLE_STEPS + 3:
        raise SystemExit(f"need --pairs >= 4 and --block-steps >= {SETTLE_STEPS + 3}")
    schedule = Schedule(args.warmup, args.block_steps, args.pairs)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for noisy in ("pytorch_lightning", "lightning_fabric", "transformers", "stabletrain_agent"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="stabletrain-bench-") as root:
        os.environ[env.LOCAL_CHECKPOINT_DIR] = str(Path(root) / "local")
        os.environ[env.PFS_CHECKPOINT_DIR] = str(Path(root) / "pfs")
        os.environ[env.ATTEMPT] = "0"
        os.environ[env.AGENT_BIND_ADDRESS] = "127.0.0.1"  # the pod's exporter, on loopback
        os.environ[env.AGENT_PORT] = str(free_port())
        (Path(root) / "pfs").mkdir()
        load_avg = os.getloadavg()
        print(
            f"model: {args.layers} layers, {args.embd} dim, block {args.block}, batch "
            f"{args.batch_size}; AdamW; CPU, 1 thread; load average "
            f"{load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}"
        )
        shape = (args.block, args.batch_size, args.layers, args.embd)
        if args.framework in ("lightning", "both"):
            report("Lightning", lightning_fit(schedule, *shape))
        if args.framework in ("hf", "both"):
            report("HF Trainer", hf_fit(schedule, *shape))


if __name__ == "__main__":
    main()
