"""A skip range as people read it, in the decision's reason, Events and conditions.

The policy words its decisions itself (no I/O, no plan), so the wording lives here and the
plan and the machine borrow it.
"""

from __future__ import annotations

from stabletrain_contract.directives import SkipRange, SkipUnit

SHARDS_NAMED_MAX = 16
"""Shard ids spelled out in one message; the rest are counted (status lists them all)."""


def describe_skip(skip: SkipRange) -> str:
    """A skip range as people read it in Events and conditions, with the shards it names."""
    unit = "steps" if skip.unit is SkipUnit.STEP else "batches"
    span = f"{skip.first} to the end of the run" if skip.to_run_end else f"{skip.first}-{skip.last}"
    where = f"the data of {unit} {span}"
    if not skip.shard_ids:
        return where
    shards = ", ".join(skip.shard_ids[:SHARDS_NAMED_MAX])
    more = len(skip.shard_ids) - SHARDS_NAMED_MAX
    if more > 0:
        shards += f" and {more} more"
    return f"shard(s) {shards} in {where}"
