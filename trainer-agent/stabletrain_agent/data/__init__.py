"""Shard-aware batches that honour the directives' skip-list and resume at an exact cursor."""

from stabletrain_agent.data.batches import BatchLineage, BatchSkip, ShardedBatches, SkipList
from stabletrain_agent.data.sample_layout import SampleRange, Shard
from stabletrain_agent.data.skip_ranges import skip_list_from_directives

__all__ = [
    "BatchLineage",
    "BatchSkip",
    "SampleRange",
    "Shard",
    "ShardedBatches",
    "SkipList",
    "skip_list_from_directives",
]
