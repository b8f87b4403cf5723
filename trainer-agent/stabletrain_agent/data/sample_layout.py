"""Where every sample sits: shards laid end to end, repeated epoch after epoch.

A position is an index into that endless stream, counting the samples of skipped shards
too. Counting them keeps a saved cursor meaning the same place after the skip-list
grows: a rollback that adds a shard to the skip-list must not shift what the cursor
points at, or the resumed run would silently re-read or drop other data.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Shard:
    """One unit of the dataset that the skip-list can name (a file, an object, a split)."""

    shard_id: str
    num_samples: int


class SampleRange(NamedTuple):
    """Samples ``start`` (inclusive) to ``stop`` (exclusive) of one shard (a tuple: every
    batch makes one or more)."""

    shard_id: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class ShardLayout:
    """Maps stream positions to shard ranges, passing over skipped shards without reading."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        if not shards:
            raise ValueError("the dataset needs at least one shard")
        seen: set[str] = set()
        for shard in shards:
            if shard.num_samples <= 0:
                raise ValueError(
                    f"shard {shard.shard_id!r} has {shard.num_samples} samples; "
                    "every shard needs at least one"
                )
            if shard.shard_id in seen:
                raise ValueError(f"shard id {shard.shard_id!r} appears twice")
            seen.add(shard.shard_id)
        self.shards = tuple(shards)
        self._starts: list[int] = []
        total = 0
        for shard in self.shards:
            self._starts.append(total)
            total += shard.num_samples
        self.samples_per_epoch = total

    def check_known(self, shard_ids: Collection[str]) -> None:
        """Reject shard ids this dataset does not have: a typo would silently skip nothing."""
        unknown = sorted(set(shard_ids) - {shard.shard_id for shard in self.shards})
        if unknown:
            raise ValueError(f"skip-list names shards the dataset does not have: {unknown}")

    def check_skippable(self, skipped_shards: Collection[str]) -> None:
        """Reject skipping every shard at once: nothing would be left to train on (and
        `take` would never return). Runs per batch: no skipped shard costs no pass."""
        if skipped_shards and all(shard.shard_id in skipped_shards for shard in self.shards):
            raise ValueError("the skip-list names every shard; nothing is left to train on")

    def take(
        self, position: int, count: int, skipped_shards: Collection[str]
    ) -> tuple[list[SampleRange], int]:
        """The next ``count`` non-skipped samples from ``position`` and the position after them."""
        ranges: list[SampleRange] = []
        needed = count
        while needed > 0:
            offset = position % self.samples_per_epoch
            index = bisect.bisect_right(self._starts, offset) - 1
            shard = self.shards[index]
            start = offset - self._starts[index]
            available = shard.num_samples - start
            if shard.shard_id in skipped_shards:
                position += available
                continue
            used = min(available, needed)
            ranges.append(SampleRange(shard.shard_id, start, start + used))
            position += used
            needed -= used
        return ranges, position


def slice_ranges(ranges: Sequence[SampleRange], start: int, stop: int) -> list[SampleRange]:
    """The samples ``start:stop`` (counted across ``ranges``) as ranges of their own."""
    out: list[SampleRange] = []
    seen = 0
    for sample_range in ranges:
        lo = max(start, seen)
        hi = min(stop, seen + sample_range.size)
        if lo < hi:
            first = sample_range.start + lo - seen
            out.append(SampleRange(sample_range.shard_id, first, first + hi - lo))
        seen += sample_range.size
    return out
