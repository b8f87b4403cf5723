"""The skip-aware loader inside torch's DataLoader and torchdata's StatefulDataLoader.

Each loop here takes batches ahead of the step that trains on them (as Lightning's fetcher
and worker prefetching do), and the dataset logs every index it is asked for to a file,
from whichever process reads it: the evidence is the dataset's, not the loader's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from stabletrain_agent.data import Shard, SkipList, skip_list_from_directives
from stabletrain_agent.data.loader import SkipAwareLoader
from stabletrain_contract.directives import SkipRange, SkipUnit

SHARD_SAMPLES = 12
SHARDS = [Shard(f"s{i:02d}", SHARD_SAMPLES) for i in range(12)]
BATCH = 4
WORLD = 2
RANK = 1
"""Rank 1 of 2: every global batch holds 8 samples, this rank reads the second half."""
LOOKAHEAD = 1
"""Batches the loop holds before the step that trains on them (Lightning's fetcher)."""


class LoggedIndices(Dataset[torch.Tensor]):
    """Sample i is the number i; every read is appended to a file, from any process."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def __len__(self) -> int:
        return len(SHARDS) * SHARD_SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        with self.log.open("a") as handle:
            handle.write(f"{index}\n")
        return torch.tensor(index)

    def reads(self) -> set[int]:
        return {int(line) for line in self.log.read_text().split()} if self.log.exists() else set()


LOADERS = [
    pytest.param(DataLoader, 0, id="DataLoader"),
    pytest.param(DataLoader, 2, id="DataLoader-2-workers"),
    pytest.param(StatefulDataLoader, 0, id="StatefulDataLoader"),
    pytest.param(StatefulDataLoader, 2, id="StatefulDataLoader-2-workers"),
]


def make(
    dataset: LoggedIndices, loader_class: Callable[..., Any], workers: int
) -> SkipAwareLoader[Any]:
    loader: SkipAwareLoader[torch.Tensor] = SkipAwareLoader(
        dataset,
        SHARDS,
        batch_size=BATCH,
        rank=RANK,
        world_size=WORLD,
        loader_class=loader_class,
        num_workers=workers,
        **({"multiprocessing_context": "fork"} if workers else {}),
    )
    loader.count_steps()
    return loader


def train(loader: SkipAwareLoader[torch.Tensor], steps: int) -> list[list[int]]:
    """Steps of a loop that takes LOOKAHEAD batches ahead; what each step trained on."""
    batches = iter(loader)
    held: deque[torch.Tensor] = deque()
    trained: list[list[int]] = []
    for _ in range(steps):
        while len(held) <= LOOKAHEAD:
            held.append(next(batches))
        trained.append(held.popleft().tolist())
        loader.consume()
    return trained


def global_batch(index: int) -> list[int]:
    """This rank's samples of global batch `index` when nothing is skipped."""
    per_epoch = len(SHARDS) * SHARD_SAMPLES
    first = index * BATCH * WORLD + RANK * BATCH
    return [(first + i) % per_epoch for i in range(BATCH)]


@pytest.mark.parametrize(("loader_class", "workers"), LOADERS)
def test_position_survives_save_and_restore_exactly(
    tmp_path: Path, loader_class: Callable[..., Any], workers: int
) -> None:
    dataset = LoggedIndices(tmp_path / "reads")
    reference = train(make(dataset, loader_class, workers), 40)
    assert reference == [global_batch(i) for i in range(40)], "40 steps cross two epochs"

    first = make(dataset, loader_class, workers)
    before = train(first, 13)
    saved = first.state_dict()
    assert first.last_lineage is not None
    assert first.last_lineage.batch_index == 12
    train(first, 5)  # the run goes on after the checkpoint ...

    fresh = make(dataset, loader_class, workers)  # ... a new process restores it
    fresh.load_state_dict(saved)
    assert before + train(fresh, 27) == reference, "no batch read twice, none lost"

    first.load_state_dict(saved)  # restoring the loader that is mid-iteration
    assert before + train(first, 27) == reference


@pytest.mark.parametrize(("loader_class", "workers"), LOADERS)
def test_rollback_resumes_at_the_checkpoint_and_never_reads_the_skipped_data(
    tmp_path: Path, loader_class: Callable[..., Any], workers: int
) -> None:
    """Attempt 0 reads a poisoned shard at steps 10-12 and trips at 14; the rollback restores
    step 4's cursor and skips steps 9-15 of the tripped run (the directives' step range)."""
    dataset = LoggedIndices(tmp_path / "reads-attempt-0")
    tripped = make(dataset, loader_class, workers)
    trained = train(tripped, 4)
    checkpoint = tripped.state_dict()
    trained += train(tripped, 10)
    poisoned = {i for step in (10, 11, 12) for i in trained[step - 1]}

    rolled_back = make(LoggedIndices(tmp_path / "reads-attempt-1"), loader_class, workers)
    rolled_back.load_state_dict(checkpoint)
    skip = [SkipRange(first=9, last=15, unit=SkipUnit.STEP)]
    rolled_back.set_skip(
        skip_list_from_directives(
            skip, resume_step=4, next_batch_index=rolled_back.next_batch_index
        )
    )
    resumed = train(rolled_back, 8)  # short of the next epoch, where the shard comes again
    # Steps 5-8 train what they did before; then the data of steps 9-15 never comes.
    assert resumed == trained[4:8] + [global_batch(i) for i in range(15, 19)]
    read = LoggedIndices(tmp_path / "reads-attempt-1").reads()
    assert not read & poisoned, "prefetching never read the skipped data either"
    assert read >= {i for batch in resumed for i in batch}


@pytest.mark.parametrize(("loader_class", "workers"), LOADERS)
def test_a_suspect_shard_passed_over_stays_unread_in_later_epochs_and_after_a_restore(
    tmp_path: Path, loader_class: Callable[..., Any], workers: int
) -> None:
    """Step 4's range names shard s02 (samples 24-35): it comes back every 18 steps at
    other batch indices, and neither this loader nor one restored from its cursor reads it."""
    suspect = set(range(2 * SHARD_SAMPLES, 3 * SHARD_SAMPLES))
    dataset = LoggedIndices(tmp_path / "reads")
    loader = make(dataset, loader_class, workers)
    skip = [SkipRange(first=4, last=4, unit=SkipUnit.STEP, shard_ids=("s02",))]
    loader.set_skip(skip_list_from_directives(skip, resume_step=0, next_batch_index=0))
    trained = train(loader, 12)
    saved = loader.state_dict()
    trained += train(loader, 30)  # past two more passes over the data
    assert not dataset.reads() & suspect
    shards_trained = {i // SHARD_SAMPLES for batch in trained for i in batch}
    assert shards_trained == set(range(len(SHARDS))) - {2}, "every other shard is trained"

    restored_reads = LoggedIndices(tmp_path / "reads-restored")
    restored = make(restored_reads, loader_class, workers)  # no skip-list of its own
    restored.load_state_dict(saved)
    train(restored, 40)
    assert restored_reads.reads()
    assert not restored_reads.reads() & suspect


def test_a_shard_skipped_everywhere_is_never_read(tmp_path: Path) -> None:
    dataset = LoggedIndices(tmp_path / "reads")
    loader = make(dataset, DataLoader, 0)
    loader.set_skip(SkipList(shard_ids=frozenset({"s03"})))
    shard = set(range(3 * SHARD_SAMPLES, 4 * SHARD_SAMPLES))
    stream = [i for i in range(len(SHARDS) * SHARD_SAMPLES) if i not in shard] * 2
    expected = [stream[b * 8 + BATCH : b * 8 + 2 * BATCH] for b in range(30)]
    assert train(loader, 30) == expected, "the other shards in order, across epochs"
    assert not dataset.reads() & shard


def test_a_plain_loop_consumes_per_batch_taken(tmp_path: Path) -> None:
    loader: SkipAwareLoader[torch.Tensor] = SkipAwareLoader(
        LoggedIndices(tmp_path / "reads"), SHARDS, batch_size=BATCH, rank=RANK, world_size=WORLD
    )
    batches = iter(loader)
    taken = [next(batches).tolist() for _ in range(3)]
    assert taken == [global_batch(i) for i in range(3)]
    assert loader.state_dict() == {"position": 3 * BATCH * WORLD, "batch_index": 3}


def test_bad_options_are_refused_with_the_reason(tmp_path: Path) -> None:
    dataset = LoggedIndices(tmp_path / "reads")
    with pytest.raises(ValueError, match="decides \\['drop_last', 'shuffle'\\]"):
        SkipAwareLoader(dataset, SHARDS, batch_size=2, shuffle=True, drop_last=True)
    with pytest.raises(ValueError, match="in_order=False"):
        SkipAwareLoader(dataset, SHARDS, batch_size=2, in_order=False)
    with pytest.raises(ValueError, match="dataset has only"):
        SkipAwareLoader(dataset, [*SHARDS, Shard("extra", 5)], batch_size=2)
    loader = make(dataset, DataLoader, 0)
    with pytest.raises(RuntimeError, match="only 0 were handed out"):
        loader.consume()
    with pytest.raises(ValueError, match="does not have"):
        loader.set_skip(SkipList(shard_ids=frozenset({"nope"})))
