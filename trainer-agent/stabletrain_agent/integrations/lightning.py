"""PyTorch Lightning: one callback and one CheckpointIO plugin, the rest of the loop as is.

    stabletrain = StableTrainCallback(loader)          # restores what the directives say
    trainer = pl.Trainer(
        max_steps=...,
        callbacks=[
            stabletrain,
            ModelCheckpoint(every_n_train_steps=stabletrain.interval_steps, save_top_k=-1),
        ],
        plugins=[stabletrain.checkpoint_io],
    )
    trainer.fit(module, train_dataloaders=loader, ckpt_path=stabletrain.ckpt_path)

The callback runs the guard on every optimizer step Lightning takes (see core.py: the
update happens only if the guard lets it, at the directives' LR scale), and a trip ends the
fit the way any exception does in Lightning: ``on_exception`` hooks (the callback closes the
guard and the manager there; Lightning calls no callback teardown on an exception), then
the trip's SystemExit leaves ``fit``. Gradient clipping is the guard's (it measures the grad
norm in the same pass), so Lightning's ``gradient_clip_val`` stays unset.

The plugin writes Lightning's checkpoint dict to the node-local tier and replicates it to
the PFS through the CheckpointManager (manifests, fences, retention, the inventory the
operator reads). Lightning's DDP strategy calls a CheckpointIO on global rank 0 only, but
every node needs its own part, so the callback hands the same dict to the plugin on the
other ranks from ``on_save_checkpoint``. That hook runs before the LightningModule's own
``on_save_checkpoint``, so a module that adds state there is refused at set-up.

Restoring follows the directives: the callback joins torchrun's process group and restores
exactly the directed step (checkpoint/planned.py; the newest standalone) when it is built,
before Lightning builds anything; ``ckpt_path`` then names that checkpoint, the plugin
hands Lightning the dict, and Lightning restores weights, optimizer, schedulers and loops
its own way. The guard's state (monitor baselines, LR scale, the loader's cursor) is the
callback's Lightning state.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from pytorch_lightning.utilities.model_helpers import is_overridden
from torch import Tensor

from stabletrain_agent.checkpoint.manager import (
    CheckpointManager,
    RestoreResult,
)
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_agent.guard import Guard
from stabletrain_agent.integrations.core import (
    BlobState,
    DeferredRng,
    FrameworkCheckpoints,
    GuardedOptimizer,
    SaveMarks,
    interval_steps,
    start_checkpoints,
)

RESTORED_PATH = "stabletrain://restored"
"""``ckpt_path`` of the checkpoint the callback restored; only the plugin can load it."""


class StableTrainCheckpointIO(CheckpointIO):
    """Lightning's checkpoints on the two tiers; loads only what the directives restored."""

    def __init__(self, callback: StableTrainCallback) -> None:
        self._callback = callback

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Hand the dict to the manager; the write happens in the background.

        ``path`` is Lightning's name for the file (ModelCheckpoint's); the tiers name
        checkpoints by step, and the step is the dict's ``global_step``.
        """
        self._callback.save(checkpoint)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if str(path) != RESTORED_PATH:
            raise ValueError(
                f"ckpt_path {path!r}: this plugin resumes from the checkpoint the operator's "
                f"directives chose; pass ckpt_path=callback.ckpt_path ({RESTORED_PATH!r} or None)"
            )
        return self._callback.restored_checkpoint()

    def remove_checkpoint(self, path: Any) -> None:
        """Nothing to do: the manager's retention keeps the tiers bounded, and never
        deletes the rollback target, whatever ModelCheckpoint's top-k would drop."""


class StableTrainCallback(pl.Callback):
    """The guard on Lightning's optimizer step, the directives, and the two-tier saves."""

    def __init__(
        self,
        loader: SkipAwareLoader[Any],
        *,
        max_grad_norm: float | None = 1.0,
        checkpoint_interval_steps: int | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        """`warmup_steps`: the LR warm-up the module's scheduler runs, for the preflight
        checks (Lightning steps the scheduler itself, so the guard cannot probe it)."""
        self.loader = loader
        loader.count_steps()
        self.max_grad_norm = max_grad_norm
        self.checkpoint_interval_steps = checkpoint_interval_steps
        self.warmup_steps = warmup_steps
        self.checkpoint_io = StableTrainCheckpointIO(self)
        self.guard: Guard | None = None
        self._stepper: GuardedOptimizer | None = None
        self._loaded_state: dict[str, Any] | None = None
        self._current: dict[str, Any] | None = None
        self._checkpoint = BlobState(lambda: self._current)
        self._rng = DeferredRng()
        self.manager: CheckpointManager | None = None
        self.restored: RestoreResult | None = None
        self.manager, self.restored = start_checkpoints(
            {"lightning": self._checkpoint}, {"rng": self._rng}
        )

    @property
    def interval_steps(self) -> int:
        """spec.checkpoints.intervalSteps: what ModelCheckpoint(every_n_train_steps=) takes."""
        return interval_steps(self.manager)

    @property
    def ckpt_path(self) -> str | None:
        """``trainer.fit(..., ckpt_path=)``: the restored checkpoint, or None for a fresh start."""
        return RESTORED_PATH if self.restored is not None else None

    def restored_checkpoint(self) -> dict[str, Any]:
        checkpoint = self._checkpoint.loaded
        if self.restored is None or not isinstance(checkpoint, dict):
            raise RuntimeError("no checkpoint was restored: fit with ckpt_path=callback.ckpt_path")
        return checkpoint

    # ------------------------------------------------------------------ set-up

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.strategy.checkpoint_io is not self.checkpoint_io:
            raise ValueError(
                "pass the callback's plugin: Trainer(plugins=[callback.checkpoint_io])"
            )
        if trainer.gradient_clip_val:
            raise ValueError(
                "leave Trainer(gradient_clip_val=...) unset: the guard clips (max_grad_norm) in "
                "the pass that measures the grad norm it watches"
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "accumulate_grad_batches > 1 is not supported: Lightning's closure returns only "
                "the last micro-batch's loss, not the step's"
            )
        if not pl_module.automatic_optimization:
            raise ValueError("manual optimization: call stabletrain's Guard in training_step")
        if is_overridden("on_save_checkpoint", pl_module):
            raise ValueError(
                f"{type(pl_module).__name__}.on_save_checkpoint adds state after the callbacks "
                "have handed the checkpoint to the tiers on ranks other than 0; keep that state "
                "in a Callback's state_dict instead"
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"the guard steps one optimizer; this module configures {len(trainer.optimizers)}"
            )
        (optimizer,) = trainer.optimizers
        self.guard = Guard.from_env(
            pl_module,
            optimizer,
            max_grad_norm=self.max_grad_norm,
            data=self.loader,
            checkpoints=FrameworkCheckpoints(self.manager) if self.manager else None,
            checkpoint_interval_steps=self.checkpoint_interval_steps,
            warmup_steps=self.warmup_steps,
        )
        if self._loaded_state is not None:
            self.guard.load_state_dict(self._loaded_state)
            self._loaded_state = None
        self._rng.apply()
        self._stepper = GuardedOptimizer(
            optimizer, self.guard, loss_of=_closure_loss, before_step=self.loader.consume
        )

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        return self.guard.state_dict() if self.guard is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning restores callbacks before it builds the optimizers: held until then."""
        self._loaded_state = state_dict

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if not trainer.is_global_zero:  # rank 0's copy arrives through the plugin
            self.save(checkpoint)

    def save(self, checkpoint: dict[str, Any]) -> None:
        if self.manager is None:
            return
        verdict = self._stepper.last_verdict if self._stepper is not None else None
        self._current = checkpoint
        try:
            self.manager.save(
                int(checkpoint["global_step"]), **SaveMarks.of(self.guard, verdict).as_kwargs()
            )
        finally:
            self._current = None  # the manager took its snapshot; the dict is Lightning's

    # ------------------------------------------------------------- teardown

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A finished run gets its last checkpoints to the PFS before the pod exits."""
        if self.manager is not None:
            self.manager.wait()
            self.manager.flush(60.0)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """A fit that ends on an exception calls no teardown hook: close here, while the
        exception is being handled, so an error other than a trip hands the checkpoints
        over (Guard.close) as a plain loop's ``finally`` does."""
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._stepper is not None:
            self._stepper.uninstall()
            self._stepper = None
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        if self.manager is not None:
            self.manager.close()
            self.manager = None


def _closure_loss(closure: Any) -> Tensor:
    """Run Lightning's closure (training_step, backward) and return the step's loss."""
    if closure is None:
        raise RuntimeError(
            "Lightning stepped the optimizer without a closure (a precision plugin with a "
            "GradScaler); the stabletrain callback supports 32-bit and bf16 precision"
        )
    loss = closure()
    if not isinstance(loss, Tensor):
        raise RuntimeError(
            "training_step returned no loss; the guard needs it on every step (it skips bad "
            "steps itself)"
        )
    return loss
