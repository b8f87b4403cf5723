"""The directives' skip ranges in the data helper's terms (global batch indices).

Batch ranges map one to one. Step ranges name "the data the tripped run consumed at these
steps": a resumed run starts at the checkpoint's cursor, and from there each step consumed
the next batch that was not skipped whole, so walking forward from the cursor finds the
batch of every later step. Steps at or before the resume step were consumed before the
cursor and can never be read again, so they need no entry.
"""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_agent.data.batches import BatchSkip, SkipList
from stabletrain_contract.directives import SkipRange, SkipUnit


def skip_list_from_directives(
    ranges: Sequence[SkipRange], *, resume_step: int, next_batch_index: int
) -> SkipList:
    """Translate every range; step ranges are placed relative to the resume cursor.

    The walk assumes the tripped run took one batch per step from the cursor, passing over
    only the batch-unit ranges skipped whole, which is what this helper does.
    """
    batch_skips = [
        BatchSkip(r.first, r.last + 1, frozenset(r.shard_ids))
        for r in ranges
        if r.unit is SkipUnit.BATCH
    ]
    whole = SkipList(tuple(s for s in batch_skips if not s.shard_ids))
    shards_by_step: dict[int, frozenset[str]] = {}
    for r in ranges:
        if r.unit is not SkipUnit.STEP:
            continue
        for step in range(max(r.first, resume_step + 1), r.last + 1):
            earlier = shards_by_step.get(step)
            whole_step = not r.shard_ids or earlier == frozenset()
            shards_by_step[step] = (
                frozenset() if whole_step else (earlier or frozenset()) | set(r.shard_ids)
            )
    batch_index, step = next_batch_index, resume_step
    per_batch: list[tuple[int, frozenset[str]]] = []
    for target in sorted(shards_by_step):
        while step < target:
            while whole.skips_batch(batch_index):
                batch_index += 1
            step += 1
            batch_index += 1
        per_batch.append((batch_index - 1, shards_by_step[target]))
    return SkipList((*batch_skips, *_merged(per_batch)))


def _merged(per_batch: list[tuple[int, frozenset[str]]]) -> list[BatchSkip]:
    """Adjacent batches with the same shard set as one range, so the list stays short."""
    merged: list[BatchSkip] = []
    for index, shards in per_batch:
        last = merged[-1] if merged else None
        if last is not None and last.stop == index and last.shard_ids == shards:
            merged[-1] = BatchSkip(last.start, index + 1, shards)
        else:
            merged.append(BatchSkip(index, index + 1, shards))
    return merged
