"""Per-rank batches over sharded data that honour the skip-list and resume exactly.

Batches are read in the training process, one per ``next()``, so the cursor always
says what training consumed (a prefetching loader's sampler runs ahead of the step and
would checkpoint a position the model never saw). Every rank walks the same global
batch layout and reads only its own slice, so ranks never overlap and never need to
talk to agree on what comes next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from stabletrain_agent.data.sample_layout import (
    NO_SKIPPED_SAMPLES,
    SampleRange,
    Shard,
    ShardLayout,
    SkippedSamples,
    slice_ranges,
)

Chunk = TypeVar("Chunk")
Batch = TypeVar("Batch")

DEFAULT_READ_LOG = 4096


@dataclass(frozen=True)
class BatchSkip:
    """Global batch indices ``[start, stop)``; all of them, or only some shards' samples."""

    start: int
    stop: int
    shard_ids: frozenset[str] = field(default_factory=frozenset)
    """Empty: skip these batches whole. Otherwise pass over only these shards' samples."""

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(
                f"skip range [{self.start}, {self.stop}) is empty or negative; "
                "a range needs 0 <= start < stop"
            )

    def covers(self, batch_index: int) -> bool:
        return self.start <= batch_index < self.stop


@dataclass(frozen=True)
class SkipList:
    """Batches and shards that must never be read."""

    batches: tuple[BatchSkip, ...] = ()
    shard_ids: frozenset[str] = field(default_factory=frozenset)
    """Shards skipped everywhere."""

    def skips_batch(self, batch_index: int) -> bool:
        return any(r.covers(batch_index) and not r.shard_ids for r in self.batches)

    def shards_skipped_in(self, batch_index: int) -> frozenset[str]:
        skipped = set(self.shard_ids)
        for r in self.batches:
            if r.covers(batch_index):
                skipped |= r.shard_ids
        return frozenset(skipped)

    def every_shard_named(self) -> frozenset[str]:
        named = set(self.shard_ids)
        for r in self.batches:
            named |= r.shard_ids
        return frozenset(named)


class BatchLineage(NamedTuple):
    """What one batch of this rank was made of: ids, never contents (a tuple: one per
    batch)."""

    batch_index: int
    """Global batch index (counts skipped batches, so it lines up across rollbacks)."""
    ranges: tuple[SampleRange, ...]


class Cursor(NamedTuple):
    """A place in the stream (a tuple: one is built per batch)."""

    position: int
    """Stream position (counts skipped shards' samples too, see sample_layout.py)."""
    batch_index: int
    """Global index of the next batch (counts batches skipped whole)."""
    skipped_samples: SkippedSamples = NO_SKIPPED_SAMPLES
    """What skip ranges passed over for their suspect shards, skipped in every later pass."""


class GlobalBatch(NamedTuple):
    """One global batch taken from the stream, and the cursor right after it (a tuple:
    one is built per batch)."""

    batch_index: int
    ranges: list[SampleRange]
    after: Cursor


def next_global_batch(
    layout: ShardLayout, skip: SkipList, cursor: Cursor, global_size: int
) -> GlobalBatch:
    """The next global batch the skip-list lets through, from the cursor.

    Batches skipped whole still advance the index (without reading a sample), so the
    indices of every later batch stay the same across rollbacks that grow the skip-list.
    What a range's suspect shards passed over joins the cursor's samples skipped for good
    (the shards skipped everywhere need no record).
    """
    position, batch_index, skipped_samples = cursor
    if not skip.batches:  # the usual case: only shards skipped everywhere, no batch ranges
        layout.check_skippable(skip.shard_ids)
        ranges, position = layout.take(position, global_size, skip.shard_ids, skipped_samples)
        return GlobalBatch(batch_index, ranges, Cursor(position, batch_index + 1, skipped_samples))
    while True:
        index = batch_index
        skipped_shards = skip.shards_skipped_in(index)
        layout.check_skippable(skipped_shards)
        passed_over: list[SampleRange] = []
        ranges, position = layout.take(
            position, global_size, skipped_shards, skipped_samples, passed_over
        )
        skipped_samples = skipped_samples.with_ranges(
            [r for r in passed_over if r.shard_id not in skip.shard_ids]
        )
        batch_index += 1
        if not skip.skips_batch(index):
            return GlobalBatch(index, ranges, Cursor(position, batch_index, skipped_samples))


class ShardedBatches(Generic[Chunk, Batch]):
    """An endless iterator of this rank's batches; ``state_dict`` is the exact cursor.

    ``read(shard_id, start, stop)`` fetches one contiguous range of a shard; ``combine``
    turns this rank's chunks (one per range, in order) into the batch the loop uses.
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        read: Callable[[str, int, int], Chunk],
        combine: Callable[[list[Chunk]], Batch],
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        skip: SkipList | None = None,
        read_log_size: int = DEFAULT_READ_LOG,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self._layout = ShardLayout(shards)
        self._read = read
        self._combine = combine
        self._batch_size = batch_size
        self._rank = rank
        self._world_size = world_size
        self._skip = SkipList()
        self.set_skip(skip or SkipList())
        self._cursor = Cursor(0, 0)
        self.last_lineage: BatchLineage | None = None
        """The batch the most recent ``next()`` returned; the guard records it."""
        self.read_log: deque[SampleRange] = deque(maxlen=read_log_size)
        """Every range read, newest last (bounded): evidence of what was never touched."""

    def set_skip(self, skip: SkipList) -> None:
        """Adopt a new skip-list; it applies from the next batch on."""
        self._layout.check_known(skip.every_shard_named())
        self._layout.check_skippable(skip.shard_ids)
        self._skip = skip

    @property
    def skip(self) -> SkipList:
        """The skip-list in force (the directives' since the last ``set_skip``)."""
        return self._skip

    @property
    def next_batch_index(self) -> int:
        return self._cursor.batch_index

    @property
    def shards(self) -> tuple[Shard, ...]:
        """The dataset's shards in order; the preflight reports how many there are."""
        return self._layout.shards

    def __iter__(self) -> ShardedBatches[Chunk, Batch]:
        return self

    def __next__(self) -> Batch:
        taken = next_global_batch(
            self._layout, self._skip, self._cursor, self._batch_size * self._world_size
        )
        self._cursor = taken.after
        first = self._rank * self._batch_size
        mine = slice_ranges(taken.ranges, first, first + self._batch_size)
        chunks = []
        for sample_range in mine:
            self.read_log.append(sample_range)
            chunks.append(self._read(sample_range.shard_id, sample_range.start, sample_range.stop))
        self.last_lineage = BatchLineage(taken.batch_index, tuple(mine))
        return self._combine(chunks)

    def state_dict(self) -> dict[str, Any]:
        return cursor_state(self._cursor)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cursor = parse_cursor_state(state)
        self.last_lineage = None


def cursor_state(cursor: Cursor) -> dict[str, Any]:
    """A data cursor as the guard checkpoints it (the samples skipped for good only once
    there are some, so a run that never skipped any keeps the cursor it always had)."""
    state: dict[str, Any] = {"position": cursor.position, "batch_index": cursor.batch_index}
    if cursor.skipped_samples:
        state["skipped_samples"] = cursor.skipped_samples.to_json()
    return state


def parse_cursor_state(state: dict[str, Any]) -> Cursor:
    """A checkpointed data cursor; one saved before samples were skipped for good has none."""
    position, batch_index = int(state["position"]), int(state["batch_index"])
    if position < 0 or batch_index < 0:
        raise ValueError(f"a data cursor cannot be negative: {state!r}")
    return Cursor(position, batch_index, SkippedSamples.from_json(state.get("skipped_samples", [])))
