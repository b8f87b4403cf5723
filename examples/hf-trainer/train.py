"""A tiny GPT-2 (random init from a config) on Shakespeare with the HF Trainer, guarded.

Lines marked `# stabletrain` are what stabletrain adds (README.md counts them). Settings come
from TRAIN_<NAME> variables (SETTINGS); steplog.py records each step for the tests.
"""

import os
import sys
from pathlib import Path

import torch
from steplog import StepLog
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tiny-gpt"))
from corpus import VOCAB_SIZE, Corpus

from stabletrain_agent.data.loader import SkipAwareLoader  # stabletrain
from stabletrain_agent.integrations.hf import StableTrainCallback, default_output_dir  # stabletrain

PFS = os.environ.get("STABLETRAIN_PFS_CHECKPOINT_DIR", "/tmp")
SETTINGS = {"steps": 140, "lr": 3e-3, "warmup": 20, "batch": 8, "block": 64, "width": 64,
            "shard_samples": 64, "poison_shards": "",
            "log_dir": f"{PFS}/hf-trainer-log"}  # fmt: skip
S = {k: type(v)(os.environ.get(f"TRAIN_{k.upper()}", v)) for k, v in SETTINGS.items()}


class Windows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Dataset index i is sample i % shard_samples of shard i // shard_samples."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus, self.poisoned_reads = corpus, 0

    def __len__(self) -> int:
        return len(self.corpus.shards) * self.corpus.shard_samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        shard_id, sample = self.corpus.shard_id(i // S["shard_samples"]), i % S["shard_samples"]
        self.poisoned_reads += shard_id in self.corpus.poisoned
        window = self.corpus.read(shard_id, sample, sample + 1)[0]
        return {"input_ids": window, "labels": window}


def main() -> None:
    poisoned = [s for s in S["poison_shards"].split(",") if s]
    corpus = Corpus(S["block"], S["shard_samples"], poisoned=poisoned)
    data, world = Windows(corpus), int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    loader = SkipAwareLoader(  # stabletrain
        data, corpus.shards, batch_size=S["batch"], rank=rank, world_size=world
    )
    stabletrain = StableTrainCallback(loader)  # stabletrain
    torch.manual_seed(1234)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=S["block"] + 1,
        n_embd=S["width"],
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    args = TrainingArguments(
        output_dir=default_output_dir(),  # stabletrain: scratch on the PFS, per attempt
        max_steps=S["steps"],
        learning_rate=S["lr"],
        warmup_steps=S["warmup"],
        lr_scheduler_type="constant_with_warmup",
        adam_beta2=0.95,
        save_steps=stabletrain.interval_steps,  # stabletrain: spec.checkpoints.intervalSteps
        save_total_limit=2,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        max_grad_norm=0,  # stabletrain: the guard clips
        ignore_data_skip=True,  # stabletrain: the loader resumes at its cursor
    )

    class ShakespeareTrainer(Trainer):  # stabletrain: the Trainer's documented override
        def get_train_dataloader(self) -> SkipAwareLoader:  # stabletrain
            return loader  # stabletrain

    model = GPT2LMHeadModel(config)
    callbacks = [stabletrain, StepLog(S["log_dir"], stabletrain, data)]  # stabletrain
    trainer = ShakespeareTrainer(model=model, args=args, callbacks=callbacks)
    try:  # stabletrain
        trainer.train(resume_from_checkpoint=stabletrain.resume_from_checkpoint)  # stabletrain
    finally:  # stabletrain
        stabletrain.close()  # stabletrain: after an error, hands the checkpoints over


if __name__ == "__main__":
    main()
