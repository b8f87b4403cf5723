"""The skip list across attempts: every range ever decided, merged where they overlap.

A range decided once is never consumed again by any later attempt, so the list only grows;
merging overlapping step ranges keeps it short enough to stay inline in status for long.
A shard suspected by a second rollback is skipped for the rest of the run, not only around
its onset. A step range covers one pass over the data; the pods keep what it passed over of
its suspect shards out of every later pass, but the part of the shard read before the
window is read again, and a shard that trips again has more bad data than the window met
(the long chaos run, shard-0228 at steps 3646 and 8449, from before that was kept out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stabletrain_contract.directives import RUN_END, SkipRange, SkipUnit


def merge_skip_ranges(*groups: Iterable[SkipRange]) -> tuple[SkipRange, ...]:
    """Union of the groups; ranges of the same unit and shard set that overlap or touch
    become one, ordered by unit, shard set and start."""
    ranges = sorted(
        {r for group in groups for r in group},
        key=lambda r: (r.unit.value, r.shard_ids, r.first, r.last),
    )
    merged: list[SkipRange] = []
    for current in ranges:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.unit is current.unit
            and last.shard_ids == current.shard_ids
            and current.first <= last.last + 1
        ):
            merged[-1] = last.model_copy(update={"last": max(last.last, current.last)})
        else:
            merged.append(current)
    return tuple(merged)


def skipping_repeat_suspects(
    added: Sequence[SkipRange], earlier: Iterable[SkipRange]
) -> tuple[SkipRange, ...]:
    """`added`, plus one range over every batch to the run's end for the shards it names
    that an earlier range named already."""
    named_before = {s for r in earlier for s in r.shard_ids}
    again = sorted({s for r in added for s in r.shard_ids if s in named_before})
    if not again:
        return tuple(added)
    rest = SkipRange(first=0, last=RUN_END, unit=SkipUnit.BATCH, shard_ids=tuple(again))
    return (rest, *added)
