"""The Lightning callback closes the guard and the manager when fit ends on an exception.

Lightning calls `on_exception`, never a callback's `teardown`, when fit raises. Before,
the callback closed only in `teardown`: after a peer died, the guard never handed its
checkpoints over (`Guard.close` while the error is handled) and the manager's replication
thread was left running.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from stabletrain_agent.data import Shard
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_agent.integrations.lightning import StableTrainCallback
from support.guard_closes import GuardCloses

SHARDS = [Shard(f"s{i}", 8) for i in range(4)]
FAILING_STEP = 3


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8 * len(SHARDS)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), float(index))


class PeerLost(pl.LightningModule):
    """Trains a linear layer until the third step, then fails as a broken collective does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.global_step == FAILING_STEP:
            raise RuntimeError("Connection reset by peer")
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_an_error_inside_fit_closes_the_guard_while_it_is_handled_and_the_manager(
    tmp_path: Path, guard_closes: GuardCloses
) -> None:
    loader = SkipAwareLoader(Numbers(), SHARDS, batch_size=2, rank=0, world_size=1)
    callback = StableTrainCallback(loader)
    assert callback.manager is not None
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=8,
        callbacks=[callback],
        plugins=[callback.checkpoint_io],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(RuntimeError, match="by peer"):
        trainer.fit(PeerLost(), train_dataloaders=loader, ckpt_path=callback.ckpt_path)
    assert guard_closes.in_flight == [RuntimeError], (
        "closed once, while the error was being handled"
    )
    assert not guard_closes.replicators_left(), "the manager's replication thread was stopped"
