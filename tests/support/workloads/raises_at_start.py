"""A training script whose data cannot be read: it raises before its first step, the way a
trainer fails on a bad input file (the failure-cause tests keep torchrun's output of it)."""


def load(path: str) -> None:
    raise ValueError(f"tokenizer file {path} has 0 entries; expected a vocabulary")


load("/data/vocab.json")
