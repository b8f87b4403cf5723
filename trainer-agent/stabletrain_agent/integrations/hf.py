"""Hugging Face Trainer: one TrainerCallback, the Trainer's own checkpoints on the two tiers.

    stabletrain = StableTrainCallback(loader)          # restores what the directives say
    args = TrainingArguments(
        output_dir=default_output_dir(), max_grad_norm=0, ignore_data_skip=True, ...
    )
    trainer = MyTrainer(model, args, callbacks=[stabletrain])   # get_train_dataloader -> loader
    try:
        trainer.train(resume_from_checkpoint=stabletrain.resume_from_checkpoint)
    finally:
        stabletrain.close()     # the Trainer has no exception hook: the hand-over after an error

The guard: the Trainer calls ``optimizer.step()`` itself, so the callback guards that step
(core.GuardedOptimizer): the loss comes from a forward hook on the model (the mean over the
step's micro-batches), the update happens only if the guard lets it, at the directives' LR
scale. The guard clips (``max_grad_norm=0`` turns the Trainer's clipping off: clipping
first would hide the grad norm the guard watches). A trip leaves ``train()`` as the trip's
SystemExit, after the guard flushed the checkpoints and wrote the trip report. Any other
error leaves it without a callback (the Trainer has no exception hook), so the script
closes the callback in a ``finally``: ``Guard.close`` then hands the checkpoints over, as in
a plain loop.

The two tiers, least intrusively: the Trainer keeps writing its checkpoint its own way
(``output_dir/checkpoint-N``: weights, optimizer, scheduler, RNG, trainer state), and the
callback's ``on_save`` hands those files to the CheckpointManager, which writes the local
tier and replicates to the PFS with manifests and fences. Restoring writes the directed
checkpoint's files back to a directory and the Trainer resumes from it through its own
``resume_from_checkpoint``, so every piece of Trainer state is restored by the code that
wrote it. A Trainer subclass overriding ``_save_checkpoint``/``_load_from_checkpoint``
would do the same through private methods that change between releases; the callback uses
only the documented hooks. The one override a user writes is the documented
``get_train_dataloader``, to hand the Trainer the skip-aware loader: the Trainer's own
sampler knows no skip-list, and ``ignore_data_skip=True`` stops it from fast-forwarding a
loader that resumes at its cursor by itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from stabletrain_agent.checkpoint.manager import (
    CheckpointManager,
    RestoreResult,
)
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_agent.guard import Guard
from stabletrain_agent.integrations.core import (
    BlobState,
    FrameworkCheckpoints,
    GuardedOptimizer,
    SaveMarks,
    interval_steps,
    start_checkpoints,
)
from stabletrain_contract import env

CHECKPOINT_PREFIX = "checkpoint"
"""The Trainer's name for ``output_dir/checkpoint-<global step>``."""
RESUME_DIR = "hf-resume"
"""Under the local tier: where a restored checkpoint's files are put for the Trainer."""
_RANK_FILE = re.compile(r"^rng_state(_\d+)?\.pth$")
"""Per-process files (each rank's RNG); everything else is the node's common state."""


class StableTrainCallback(TrainerCallback):
    """The guard on the Trainer's optimizer step, the directives, and the two tiers."""

    def __init__(
        self,
        loader: SkipAwareLoader[Any],
        *,
        max_grad_norm: float | None = 1.0,
        checkpoint_interval_steps: int | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        """`warmup_steps`: the LR warm-up, for the preflight checks; by default the
        TrainingArguments' (`warmup_steps`, else `warmup_ratio` of the run's steps)."""
        self.loader = loader
        loader.count_steps()
        self.max_grad_norm = max_grad_norm
        self.checkpoint_interval_steps = checkpoint_interval_steps
        self.warmup_steps = warmup_steps
        self.guard: Guard | None = None
        self._stepper: GuardedOptimizer | None = None
        self._hook: RemovableHandle | None = None
        self._losses: list[torch.Tensor] = []
        self._per_item = False
        self._items_scale = 1
        self._files: dict[str, bytes] = {}
        self._trainer_files = BlobState(lambda: self._files)
        self._guard_state = BlobState(lambda: self.guard.state_dict() if self.guard else None)
        self.manager: CheckpointManager | None = None
        self.restored: RestoreResult | None = None
        self.resume_from_checkpoint: str | None = None
        """What ``trainer.train(resume_from_checkpoint=)`` takes (None: a fresh start)."""
        self.manager, self.restored = start_checkpoints(
            {"guard": self._guard_state}, {"trainer": self._trainer_files}
        )
        if self.manager is not None and self.restored is not None:
            config = self.manager.config
            target = config.local_dir / RESUME_DIR / f"attempt-{config.attempt}"
            self.resume_from_checkpoint = str(self._write_restored(target, self.restored.step))

    @property
    def interval_steps(self) -> int:
        """spec.checkpoints.intervalSteps: what TrainingArguments(save_steps=) takes."""
        return interval_steps(self.manager)

    def _write_restored(self, root: Path, step: int) -> Path:
        """Put this rank's restored files where the Trainer resumes from; all ranks wait."""
        directory = root / f"{CHECKPOINT_PREFIX}-{step}"
        directory.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = self._trainer_files.loaded or {}
        rank = dist.get_rank() if dist.is_initialized() else 0
        for name, content in files.items():
            # The RNG file goes under this process's index of this attempt: a relaunch may
            # hand out global ranks in another order, the node rank and local rank stay.
            target = (
                f"rng_state_{rank}.pth"
                if _RANK_FILE.match(name) and dist.is_initialized()
                else name
            )
            temp = directory / f".{target}.tmp"
            temp.write_bytes(content)
            temp.replace(directory / target)
        if dist.is_initialized():
            dist.barrier()
        return directory

    # ------------------------------------------------------------- training

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if args.max_grad_norm and args.max_grad_norm > 0:
            raise ValueError(
                "set TrainingArguments(max_grad_norm=0): the guard clips (max_grad_norm of the "
                "callback) in the pass that measures the grad norm it watches"
            )
        if not args.ignore_data_skip:
            raise ValueError(
                "set TrainingArguments(ignore_data_skip=True): the skip-aware loader resumes at "
                "its own cursor, a fast-forward on top would drop batches"
            )
        model, optimizer = kwargs["model"], kwargs["optimizer"]
        raw = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
        self.guard = Guard.from_env(
            model,
            raw,
            max_grad_norm=self.max_grad_norm,
            data=self.loader,
            checkpoints=FrameworkCheckpoints(self.manager) if self.manager else None,
            checkpoint_interval_steps=self.checkpoint_interval_steps,
            warmup_steps=(
                self.warmup_steps
                if self.warmup_steps is not None
                else args.get_warmup_steps(state.max_steps)
            ),
        )
        if self.restored is not None:
            self.guard.load_state_dict(self._guard_state.loaded)
        self._hook = model.register_forward_hook(self._record_loss, with_kwargs=True)
        # With num_items_in_batch the model returns each micro-batch's loss sum over the
        # step's item count (all ranks' with average_tokens_across_devices): summed over
        # micro-batches, and times the world after the guard averages over ranks, that is
        # the step's mean loss per item.
        world = dist.get_world_size() if dist.is_initialized() else 1
        self._items_scale = world if args.average_tokens_across_devices else 1
        accumulation = args.gradient_accumulation_steps
        self._stepper = GuardedOptimizer(
            raw,
            self.guard,
            loss_of=self._step_loss,
            before_step=lambda: self.loader.consume(accumulation),
        )

    def _record_loss(
        self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any
    ) -> None:
        if module.training:
            self._losses.append(_loss_of_output(output).detach())
            self._per_item = kwargs.get("num_items_in_batch") is not None

    def _step_loss(self, closure: Callable[[], Any] | None) -> torch.Tensor:
        if closure is not None:
            closure()
        if not self._losses:
            raise RuntimeError("the Trainer stepped the optimizer without a training forward pass")
        losses, self._losses = self._losses, []
        if len(losses) == 1 and not (self._per_item and self._items_scale != 1):
            return losses[0]  # one micro-batch: its loss is the step's (no stack, no mean)
        stacked = torch.stack(losses)
        return stacked.sum() * self._items_scale if self._per_item else stacked.mean()

    # ---------------------------------------------------------- checkpoints

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Hand the checkpoint the Trainer just wrote to the tiers (written in the background)."""
        if self.manager is None:
            return
        directory = Path(str(args.output_dir)) / f"{CHECKPOINT_PREFIX}-{state.global_step}"
        if dist.is_initialized():
            dist.barrier()  # global rank 0 writes the weights and optimizer; wait until it has
        leader = self.manager.is_node_leader
        self._files = {
            path.name: path.read_bytes()
            for path in sorted(directory.iterdir())
            if path.is_file()
            and (
                _is_mine(path.name, args.process_index)
                or (leader and not _RANK_FILE.match(path.name))
            )
        }
        if leader and not any(not _RANK_FILE.match(name) for name in self._files):
            raise RuntimeError(
                f"{directory} holds no model or optimizer files on this node: the Trainer "
                "writes them on global rank 0 only, so output_dir must be on the shared file "
                "system (default_output_dir())"
            )
        verdict = self._stepper.last_verdict if self._stepper is not None else None
        try:
            self.manager.save(state.global_step, **SaveMarks.of(self.guard, verdict).as_kwargs())
        finally:
            self._files = {}

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """A finished run gets its last checkpoints to the PFS before the pod exits."""
        if self.manager is not None:
            self.manager.wait()
            self.manager.flush(60.0)
        self.close()

    def close(self) -> None:
        """Stop guarding and checkpointing (safe to call more than once). Called from the
        script's ``finally`` while an error other than a trip ends ``train()``, the guard
        first hands the checkpoints over (Guard.close)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._stepper is not None:
            self._stepper.uninstall()
            self._stepper = None
        if self.guard is not None:  # first: its hand-over flushes through the manager
            self.guard.close()
            self.guard = None
        if self.manager is not None:
            self.manager.close()
            self.manager = None


def _is_mine(name: str, process_index: int) -> bool:
    return name in (f"rng_state_{process_index}.pth", "rng_state.pth")


def _loss_of_output(output: Any) -> torch.Tensor:
    """The loss a Transformers model returns: ``output.loss``, ``output["loss"]`` or first."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, tuple | list) and output:
        loss = output[0]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise RuntimeError(
            "the model's training forward returned no scalar loss; pass labels so it computes one"
        )
    return loss


def default_output_dir(environ: Mapping[str, str] = os.environ) -> str:
    """Where the Trainer writes its own checkpoints: scratch on the PFS, one per attempt.

    The Trainer writes weights and optimizer on global rank 0 only (``save_pretrained``
    does so even with ``save_on_each_node``), so every node's leader reads them from a
    shared directory; a directory per attempt keeps a relaunch from meeting the tripped
    attempt's ``checkpoint-N``. The tiers' copies are the ones restored from; the Trainer's
    ``save_total_limit`` bounds this scratch.
    """
    pfs = Path(environ.get(env.PFS_CHECKPOINT_DIR) or "/tmp")
    return str(pfs / "hf-trainer" / f"attempt-{environ.get(env.ATTEMPT) or '0'}")
