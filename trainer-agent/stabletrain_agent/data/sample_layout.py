"""Where every sample sits: shards laid end to end, repeated epoch after epoch.

A position is an index into that endless stream, counting the samples of skipped shards
too. Counting them keeps a saved cursor meaning the same place after the skip-list
grows: a rollback that adds a shard to the skip-list must not shift what the cursor
points at, or the resumed run would silently re-read or drop other data.

The samples a skip range passed over for its suspect shards stay skipped in every later
pass over the data (`SkippedSamples`): the same samples come back each epoch at other
batch indices, where the range's batches no longer reach them, and would spike again.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Sequence
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


class SkippedSamples:
    """Samples of suspect shards passed over once, never to be read again (immutable: a
    cursor holds one; `with_ranges` makes the next). Overlapping or touching ranges of a
    shard merge, so a long run holds a few ranges per suspect shard."""

    __slots__ = ("_spans",)

    def __init__(self, ranges: Iterable[SampleRange] = ()) -> None:
        merged: dict[str, list[tuple[int, int]]] = {}
        for shard_id, start, stop in sorted(ranges):
            spans = merged.setdefault(shard_id, [])
            if spans and start <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], stop))
            else:
                spans.append((start, stop))
        self._spans = {
            shard_id: (tuple(a for a, _ in spans), tuple(b for _, b in spans))
            for shard_id, spans in merged.items()
        }

    def __bool__(self) -> bool:
        return bool(self._spans)

    def __repr__(self) -> str:
        return f"SkippedSamples({self.ranges()!r})"

    def ranges(self) -> list[SampleRange]:
        return [
            SampleRange(shard_id, start, stop)
            for shard_id, (starts, stops) in sorted(self._spans.items())
            for start, stop in zip(starts, stops, strict=True)
        ]

    def with_ranges(self, ranges: Sequence[SampleRange]) -> SkippedSamples:
        return SkippedSamples([*self.ranges(), *ranges]) if ranges else self

    def next_span(self, shard_id: str, start: int) -> tuple[int, int] | None:
        """The first skipped span of the shard that ends after `start`, if any."""
        spans = self._spans.get(shard_id)
        if spans is None:
            return None
        starts, stops = spans
        index = bisect.bisect_right(stops, start)
        return (starts[index], stops[index]) if index < len(stops) else None

    def to_json(self) -> list[list[str | int]]:
        return [[r.shard_id, r.start, r.stop] for r in self.ranges()]

    @classmethod
    def from_json(cls, data: object) -> SkippedSamples:
        """A cursor's list of [shard id, start, stop]; anything else is a ValueError."""
        if not isinstance(data, list):
            raise ValueError(f"skipped samples must be a list, got {data!r}")
        ranges = []
        for item in data:
            match item:
                case [str(shard_id), int(start), int(stop)] if 0 <= start < stop:
                    ranges.append(SampleRange(shard_id, start, stop))
                case _:
                    raise ValueError(
                        f"a skipped sample range must be [shard id, start, stop] with "
                        f"0 <= start < stop, got {item!r}"
                    )
        return cls(ranges)


NO_SKIPPED_SAMPLES = SkippedSamples()


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
        self,
        position: int,
        count: int,
        skipped_shards: Collection[str],
        skipped_samples: SkippedSamples = NO_SKIPPED_SAMPLES,
        passed_over: list[SampleRange] | None = None,
    ) -> tuple[list[SampleRange], int]:
        """The next ``count`` samples from ``position`` that neither a skipped shard nor
        ``skipped_samples`` holds, and the position after them. The rest of each skipped
        shard passed over is appended to ``passed_over`` when given."""
        ranges: list[SampleRange] = []
        needed = count
        idle_from = position
        next_span = skipped_samples.next_span if skipped_samples else None
        while needed > 0:
            if position - idle_from >= self.samples_per_epoch:
                raise ValueError(
                    "the skip-list and the samples it passed over leave nothing to train on"
                )
            offset = position % self.samples_per_epoch
            index = bisect.bisect_right(self._starts, offset) - 1
            shard = self.shards[index]
            start = offset - self._starts[index]
            available = shard.num_samples - start
            if shard.shard_id in skipped_shards:
                if passed_over is not None:
                    passed_over.append(SampleRange(shard.shard_id, start, shard.num_samples))
                position += available
                continue
            if next_span is not None:
                span = next_span(shard.shard_id, start)
                if span is not None and span[0] <= start:
                    position += min(span[1], shard.num_samples) - start
                    continue
                if span is not None:
                    available = min(available, span[0] - start)
            used = min(available, needed)
            ranges.append(SampleRange(shard.shard_id, start, start + used))
            position += used
            needed -= used
            idle_from = position
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
