"""Shard-aware batches that honour the directives' skip-list and resume at an exact cursor."""

from stabletrain_agent.data.batches import BatchLineage, ShardedBatches, SkipList, skip_list
from stabletrain_agent.data.layout import SampleRange, Shard

__all__ = ["BatchLineage", "SampleRange", "Shard", "ShardedBatches", "SkipList", "skip_list"]
