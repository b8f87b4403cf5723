"""What the stabletrain callback costs per step inside Lightning and the HF Trainer.

For each framework, a bare run (the framework's own loop, loader, clipping and optimizer
step) and a guarded run (the same model, with stabletrain's callback and skip-aware loader)
take turns: rounds alternate between the two and which goes first alternates too, so drift
in machine load hits both alike. A fit cannot be paused step by step, so each round is one
short fit of each, continuing from that run's weights; only steps inside the fit are timed
(the fit's set-up is not a training step). A step is the CPU time of the training thread
from one step's end to the next (fetching the batch included): on a machine shared with
other work, wall time mostly measures the neighbours. Each round's ratio is the median
guarded step over the median bare step; the median over the rounds is reported with its
spread, never checked against a threshold.

The guarded runs write no checkpoints (the manager's background saves are measured by
bench/checkpoint_io.py), but build the CheckpointManager on temporary tiers, as in a pod.

    .venv/bin/python bench/framework_guard_overhead.py [--framework lightning|hf|both]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
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
)

from stabletrain_agent.contract import env
from stabletrain_agent.data import Shard
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_agent.integrations import hf, lightning

TINY_GPT = Path(__file__).resolve().parents[1] / "examples" / "tiny-gpt"
SHARD_SAMPLES = 256
VOCAB = 96


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"tiny_gpt_{name}", TINY_GPT / f"{name}.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {name}.py from {TINY_GPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Windows(torch.utils.data.Dataset[torch.Tensor]):
    """Random token windows, the same for both runs (the data's content does not matter)."""

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


class StepClock:
    """CPU time of the training thread between consecutive step ends."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: float | None = None

    def start(self) -> None:
        self._last = None

    def tick(self) -> None:
        now = time.thread_time()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now

    def take(self) -> list[float]:
        taken, self.times = self.times, []
        return taken


def tiers(root: Path) -> None:
    """The environment a pod has: two tier directories and an attempt."""
    os.environ[env.LOCAL_CHECKPOINT_DIR] = str(root / "local")
    os.environ[env.PFS_CHECKPOINT_DIR] = str(root / "pfs")
    os.environ[env.ATTEMPT] = "0"
    (root / "pfs").mkdir(parents=True, exist_ok=True)


# ------------------------------------------------------------------------------- Lightning


def lightning_runs(
    block: int, batch: int, layers: int, embd: int
) -> tuple[Callable[[int], list[float]], Callable[[int], list[float]]]:
    model_module = load("model")
    config = model_module.GPTConfig(vocab_size=VOCAB, block_size=block, n_layer=layers, n_embd=embd)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = model_module.TinyGPT(config)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.model(batch[:, :-1], batch[:, 1:])
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-4)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: min(1.0, (s + 1) / 100)
            )
            return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    class Clocked(pl.Callback):
        def __init__(self, clock: StepClock) -> None:
            self.clock = clock

        def on_train_batch_end(self, *_: Any) -> None:
            self.clock.tick()

    data = Windows(block)

    def runner(guarded: bool) -> Callable[[int], list[float]]:
        module, clock = Module(), StepClock()

        def run(steps: int) -> list[float]:
            callbacks: list[pl.Callback] = [Clocked(clock)]
            plugins: list[Any] = []
            loader: Any = DataLoader(data, batch_size=batch)
            clip: float | None = 1.0
            if guarded:
                loader = SkipAwareLoader(data, data.shards, batch_size=batch)
                stabletrain = lightning.StableTrainCallback(loader)
                callbacks.insert(0, stabletrain)
                plugins.append(stabletrain.checkpoint_io)
                clip = None
            trainer = pl.Trainer(
                accelerator="cpu", devices=1, max_steps=steps, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                callbacks=callbacks, plugins=plugins, gradient_clip_val=clip,
            )  # fmt: skip
            clock.start()
            trainer.fit(module, train_dataloaders=loader)
            return clock.take()

        return run

    return runner(False), runner(True)


# -------------------------------------------------------------------------------------- HF


def hf_runs(
    block: int, batch: int, layers: int, embd: int
) -> tuple[Callable[[int], list[float]], Callable[[int], list[float]]]:

    class Ids(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self, windows: Windows) -> None:
            self.windows = windows

        def __len__(self) -> int:
            return len(self.windows)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            window = self.windows[index]
            return {"input_ids": window, "labels": window}

    class Clocked(TrainerCallback):
        def __init__(self, clock: StepClock) -> None:
            self.clock = clock

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.clock.tick()

    windows = Windows(block)
    data = Ids(windows)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=block + 1, n_embd=embd, n_layer=layers, n_head=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="hf-bench-"))

    def runner(guarded: bool) -> Callable[[int], list[float]]:
        torch.manual_seed(0)
        model, clock = GPT2LMHeadModel(config), StepClock()

        def run(steps: int) -> list[float]:
            callbacks: list[Any] = [Clocked(clock)]
            trainer_class: type[Trainer] = Trainer
            if guarded:
                loader: SkipAwareLoader[Any] = SkipAwareLoader(
                    data, windows.shards, batch_size=batch
                )
                callbacks.insert(0, hf.StableTrainCallback(loader))

                class Guarded(Trainer):
                    def get_train_dataloader(self) -> Any:
                        return loader

                trainer_class = Guarded
            args = TrainingArguments(
                output_dir=str(scratch / ("guarded" if guarded else "bare")), max_steps=steps,
                learning_rate=3e-4, warmup_steps=100, lr_scheduler_type="constant_with_warmup",
                per_device_train_batch_size=batch, save_strategy="no", logging_strategy="no",
                report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
                max_grad_norm=0 if guarded else 1.0, ignore_data_skip=guarded,
            )  # fmt: skip
            trainer = trainer_class(model=model, args=args, train_dataset=data, callbacks=callbacks)
            trainer.remove_callback(PrinterCallback)
            clock.start()
            trainer.train()
            return clock.take()

        return run

    return runner(False), runner(True)


# ------------------------------------------------------------------------------------ main


def measure(
    name: str,
    bare: Callable[[int], list[float]],
    guarded: Callable[[int], list[float]],
    rounds: int,
    steps: int,
) -> None:
    bare(steps)  # warm-up: first fits pay imports, allocator growth, thread start-up
    guarded(steps)
    bare_medians: list[float] = []
    guarded_medians: list[float] = []
    ratios: list[float] = []
    for index in range(rounds):
        order = [(bare, bare_medians), (guarded, guarded_medians)]
        for run, medians in order if index % 2 == 0 else reversed(order):
            medians.append(statistics.median(run(steps)))
        ratios.append(guarded_medians[-1] / bare_medians[-1])
    quartiles = statistics.quantiles(ratios, n=4)
    median = statistics.median(ratios)
    print(f"{name}: {rounds} rounds x {steps} steps per run, alternating run by run")
    print(f"  bare step    median {statistics.median(bare_medians) * 1e3:8.3f} ms CPU")
    print(f"  guarded step median {statistics.median(guarded_medians) * 1e3:8.3f} ms CPU")
    print(
        f"  ratio guarded/bare: median {median:.4f}  IQR {quartiles[0]:.4f}-{quartiles[2]:.4f}  "
        f"min {min(ratios):.4f}  max {max(ratios):.4f}  -> overhead {100 * (median - 1):+.2f}% "
        "(target <= +1%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("lightning", "hf", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=25, help="steps per fit")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--block", type=int, default=64)
    args = parser.parse_args()
    if args.rounds < 2 or args.steps < 3:
        raise SystemExit("need --rounds >= 2 and --steps >= 3 to report a spread")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for noisy in ("pytorch_lightning", "lightning_fabric", "transformers", "stabletrain_agent"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="stabletrain-bench-") as root:
        tiers(Path(root))
        print(
            f"model: {args.layers} layers, {args.embd} dim, block {args.block}, batch "
            f"{args.batch_size}; AdamW; CPU, 1 thread"
        )
        shape = (args.block, args.batch_size, args.layers, args.embd)
        if args.framework in ("lightning", "both"):
            measure("Lightning", *lightning_runs(*shape), args.rounds, args.steps)
        if args.framework in ("hf", "both"):
            measure("HF Trainer", *hf_runs(*shape), args.rounds, args.steps)


if __name__ == "__main__":
    main()
