"""The skip-list and an exact cursor for loops that read through torch's own data loaders.

``SkipAwareLoader`` builds a ``torch.utils.data.DataLoader`` (or torchdata's
``StatefulDataLoader``, or any loader class taking ``batch_sampler=``) around a batch
sampler that walks the same global batch layout as ``ShardedBatches``: shards laid end to
end in the dataset's index order, every rank taking its slice of each global batch, whole
batches and single shards passed over as the skip-list says, without their samples ever
being requested from the dataset.

The cursor is what training consumed, not what the loader dispatched. Worker processes,
``prefetch_factor`` and the loops above the loader (Lightning's fetcher, accelerate's
one-ahead iterator) all ask the sampler for batches before a step trains on them, so a
cursor taken from the sampler would checkpoint a position the model never saw, and a
restore would silently drop those batches. Every batch the sampler hands out is queued
with the cursor right after it; ``consume()`` pops as many as the step trained on. A
plain loop that trains on each batch as it takes it has that done per ``next()``; a
framework integration switches to ``count_steps()`` and consumes per optimizer step.

Restoring sets the cursor and ends every iteration in progress: the next ``iter()``
(frameworks start one after loading a checkpoint) dispatches again from the restored
cursor, so what had been prefetched but not trained is read again, never lost. The
loader's own ``state_dict`` (StatefulDataLoader's) is not needed and is not used: the
guard checkpoints this cursor with its own state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any, Generic, NamedTuple, TypeVar

from torch.utils.data import DataLoader, Dataset, Sampler

from stabletrain_agent.data.batches import (
    DEFAULT_READ_LOG,
    BatchLineage,
    Cursor,
    SkipList,
    cursor_state,
    next_global_batch,
    parse_cursor_state,
)
from stabletrain_agent.data.sample_layout import SampleRange, Shard, ShardLayout, slice_ranges

Batch = TypeVar("Batch")

OWNED_OPTIONS = frozenset({"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})
"""Loader options the skip-aware sampler decides; passing one would contradict it."""


class _Issued(NamedTuple):
    """A batch handed out and the cursor right after it (a tuple: one per batch)."""

    lineage: BatchLineage
    after: Cursor


class _SkipAwareBatchSampler(Sampler[list[int]]):
    """Yields this rank's dataset indices batch by batch and remembers what it handed out.

    It has no ``__len__``: the stream repeats epoch after epoch, so loops bound the run by
    steps (Lightning's ``max_steps``, the HF Trainer's ``max_steps``), not by epochs.
    """

    def __init__(
        self,
        layout: ShardLayout,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        read_log_size: int,
    ) -> None:
        self.layout = layout
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.skip = SkipList()
        self.consumed = Cursor(0, 0)
        self.issued: deque[_Issued] = deque()
        self.generation = 0
        self.read_log: deque[SampleRange] = deque(maxlen=read_log_size)
        offsets: dict[str, int] = {}
        total = 0
        for shard in layout.shards:
            offsets[shard.shard_id] = total
            total += shard.num_samples
        self._first_index = offsets

    def restart(self, cursor: Cursor) -> None:
        """Forget what was handed out and not consumed; iterations in progress end."""
        self.consumed = cursor
        self.issued.clear()
        self.generation += 1

    def __iter__(self) -> Iterator[list[int]]:
        self.restart(self.consumed)
        return self._batches(self.generation)

    def _batches(self, generation: int) -> Iterator[list[int]]:
        cursor = self.consumed
        global_size = self.batch_size * self.world_size
        first = self.rank * self.batch_size
        whole = self.world_size == 1  # this rank's slice is the global batch
        while generation == self.generation:
            taken = next_global_batch(self.layout, self.skip, cursor, global_size)
            cursor = taken.after
            mine = (
                taken.ranges
                if whole
                else slice_ranges(taken.ranges, first, first + self.batch_size)
            )
            self.issued.append(_Issued(BatchLineage(taken.batch_index, tuple(mine)), cursor))
            self.read_log.extend(mine)
            indices: list[int] = []
            for r in mine:
                offset = self._first_index[r.shard_id]
                indices.extend(range(offset + r.start, offset + r.stop))
            yield indices


class SkipAwareLoader(Generic[Batch]):
    """A data loader over shards that honours the skip-list; ``state_dict`` is the cursor.

    ``dataset[i]`` must hold sample ``i - first`` of the shard that starts at dataset index
    ``first`` (shards laid end to end in the order given). ``loader_class`` is called as
    ``loader_class(dataset, batch_sampler=..., **loader_options)``; it must yield batches in
    the order the sampler handed them out (DataLoader's and StatefulDataLoader's default,
    ``in_order=True``).
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        shards: Sequence[Shard],
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        skip: SkipList | None = None,
        loader_class: Callable[..., Any] = DataLoader,
        read_log_size: int = DEFAULT_READ_LOG,
        **loader_options: Any,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        owned = sorted(OWNED_OPTIONS & set(loader_options))
        if owned:
            raise ValueError(
                f"the skip-aware sampler decides {owned}; pass batch_size to SkipAwareLoader "
                "and leave the others out"
            )
        if loader_options.get("in_order", True) is not True:
            raise ValueError("in_order=False would hand out batches out of the cursor's order")
        layout = ShardLayout(shards)
        if isinstance(dataset, Sized) and len(dataset) < layout.samples_per_epoch:
            raise ValueError(
                f"the shards hold {layout.samples_per_epoch} samples but the dataset has only "
                f"{len(dataset)}"
            )
        self._sampler = _SkipAwareBatchSampler(
            layout,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            read_log_size=read_log_size,
        )
        self.set_skip(skip or SkipList())
        self.loader = loader_class(dataset, batch_sampler=self._sampler, **loader_options)
        self._counts_steps = False
        self.last_lineage: BatchLineage | None = None
        """The batch the latest consumption was; the guard records it per step."""

    def count_steps(self) -> None:
        """Batches are consumed by ``consume()`` per training step, not as they are taken.

        For loops that take batches ahead of the step that trains on them.
        """
        self._counts_steps = True

    def __iter__(self) -> Iterator[Batch]:
        batches = iter(self.loader)  # starts the sampler anew from the consumed cursor
        generation = self._sampler.generation
        for batch in batches:
            if generation != self._sampler.generation:
                return  # restored meanwhile: the batches still coming were never consumed
            if not self._counts_steps:
                self.consume()
            yield batch

    def consume(self, batches: int = 1) -> None:
        """The training step trained on the next ``batches`` batches handed out."""
        if batches <= 0:
            raise ValueError(f"a step consumes at least one batch, got {batches}")
        issued = self._sampler.issued
        if len(issued) < batches:
            raise RuntimeError(
                f"a step consumed {batches} batch(es) but only {len(issued)} were handed out "
                "since the loader started or was restored: is the loop reading another loader?"
            )
        for _ in range(batches):
            entry = issued.popleft()
        self._sampler.consumed = entry.after
        self.last_lineage = entry.lineage

    @property
    def next_batch_index(self) -> int:
        return self._sampler.consumed.batch_index

    @property
    def shards(self) -> tuple[Shard, ...]:
        return self._sampler.layout.shards

    @property
    def read_log(self) -> deque[SampleRange]:
        """Every range handed to the loader to read (prefetched ones too), newest last."""
        return self._sampler.read_log

    def set_skip(self, skip: SkipList) -> None:
        """Adopt a skip-list; batches handed out from now on honour it.

        Call it before iterating (the guard does, right after restoring the cursor): a
        batch already prefetched was planned under the old list.
        """
        self._sampler.layout.check_known(skip.every_shard_named())
        self._sampler.layout.check_skippable(skip.shard_ids)
        self._sampler.skip = skip

    def state_dict(self) -> dict[str, Any]:
        return cursor_state(self._sampler.consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sampler.restart(parse_cursor_state(state))
        self.last_lineage = None
