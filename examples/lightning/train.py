"""The tiny GPT on Shakespeare as a PyTorch Lightning module, guarded by stabletrain.

Lines marked `# stabletrain` are what stabletrain adds (README.md counts them). Settings come
from TRAIN_<NAME> variables (SETTINGS); steplog.py records each step for the tests.
"""

import os
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from steplog import StepLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tiny-gpt"))
from corpus import VOCAB_SIZE, Corpus
from model import GPTConfig, TinyGPT

from stabletrain_agent.data.loader import SkipAwareLoader  # stabletrain
from stabletrain_agent.integrations.lightning import StableTrainCallback  # stabletrain

PFS = os.environ.get("STABLETRAIN_PFS_CHECKPOINT_DIR", "/tmp")
SETTINGS = {"steps": 140, "lr": 3e-3, "warmup": 20, "batch": 8, "block": 64, "width": 64,
            "shard_samples": 64, "poison_shards": "",
            "log_dir": f"{PFS}/lightning-log"}  # fmt: skip
S = {k: type(v)(os.environ.get(f"TRAIN_{k.upper()}", v)) for k, v in SETTINGS.items()}


class Windows(torch.utils.data.Dataset[torch.Tensor]):
    """Dataset index i is sample i % shard_samples of shard i // shard_samples."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus, self.poisoned_reads = corpus, 0

    def __len__(self) -> int:
        return len(self.corpus.shards) * self.corpus.shard_samples

    def __getitem__(self, i: int) -> torch.Tensor:
        shard_id, sample = self.corpus.shard_id(i // S["shard_samples"]), i % S["shard_samples"]
        self.poisoned_reads += shard_id in self.corpus.poisoned
        return self.corpus.read(shard_id, sample, sample + 1)[0]


class LitGPT(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.model = TinyGPT(GPTConfig(VOCAB_SIZE, S["block"], n_layer=2, n_embd=S["width"]))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(batch[:, :-1], batch[:, 1:])

    def configure_optimizers(self) -> tuple[list, list]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=S["lr"], betas=(0.9, 0.95))
        warmup = lambda step: min(1.0, (step + 1) / S["warmup"])  # noqa: E731
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]


def main() -> None:
    poisoned = [s for s in S["poison_shards"].split(",") if s]
    corpus = Corpus(S["block"], S["shard_samples"], poisoned=poisoned)
    data, world = Windows(corpus), int(os.environ.get("WORLD_SIZE", "1"))
    rank, devices = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    loader = SkipAwareLoader(  # stabletrain
        data, corpus.shards, batch_size=S["batch"], rank=rank, world_size=world
    )
    stabletrain = StableTrainCallback(loader, warmup_steps=S["warmup"])  # stabletrain
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=world // devices,
        strategy="ddp" if world > 1 else "auto",
        max_steps=S["steps"],
        callbacks=[
            stabletrain,  # stabletrain
            ModelCheckpoint(
                every_n_train_steps=stabletrain.interval_steps, save_top_k=-1
            ),  # stabletrain
            StepLog(S["log_dir"], stabletrain, data),
        ],
        plugins=[stabletrain.checkpoint_io],  # stabletrain
        logger=False,
        enable_progress_bar=False,
        default_root_dir=S["log_dir"],
    )
    trainer.fit(LitGPT(), train_dataloaders=loader, ckpt_path=stabletrain.ckpt_path)  # stabletrain


if __name__ == "__main__":
    main()
