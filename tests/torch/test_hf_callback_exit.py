"""The Hugging Face callback's `close()` in the script's `finally` hands the checkpoints over.

The Trainer has no exception hook: an error other than a trip leaves `train()` without any
callback, so before `close()` the guard was never closed while the error was handled (no
hand-over after a peer died) and the manager's replication thread was left running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from stabletrain_agent.data import Shard
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_agent.integrations.hf import StableTrainCallback
from support.guard_closes import GuardCloses

SHARDS = [Shard(f"s{i}", 8) for i in range(4)]
FAILING_CALL = 3


class Numbers(Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 8 * len(SHARDS)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((4,), float(index))}


class PeerLost(torch.nn.Module):
    """A linear layer whose third forward pass fails as a broken collective does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.calls == FAILING_CALL:
            raise RuntimeError("Connection reset by peer")
        return {"loss": self.layer(x).pow(2).mean()}


def test_close_in_the_scripts_finally_closes_the_guard_while_the_error_is_handled(
    tmp_path: Path, guard_closes: GuardCloses
) -> None:
    loader = SkipAwareLoader(Numbers(), SHARDS, batch_size=2, rank=0, world_size=1)
    callback = StableTrainCallback(loader)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=8, learning_rate=0.01, save_strategy="no",
        max_grad_norm=0, ignore_data_skip=True, use_cpu=True, report_to=[],
        disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip

    class LoaderTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return loader

    trainer = LoaderTrainer(model=PeerLost(), args=args, callbacks=[callback])

    def train_as_the_example_does() -> None:
        try:
            trainer.train(resume_from_checkpoint=callback.resume_from_checkpoint)
        finally:
            callback.close()

    with pytest.raises(RuntimeError, match="by peer"):
        train_as_the_example_does()
    callback.close()  # twice is harmless
    assert guard_closes.in_flight == [RuntimeError], (
        "closed once, while the error was being handled"
    )
    assert not guard_closes.replicators_left(), "the manager's replication thread was stopped"
