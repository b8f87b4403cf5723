"""What the guard needs from a data helper, whichever loop feeds the model.

Two helpers satisfy it: ``ShardedBatches`` (the loop calls ``next()`` and trains on what it
got) and ``SkipAwareLoader`` (a torch or torchdata loader around a skip-aware batch
sampler, for loops that own their data loading). The guard only records the lineage of
the batch a step consumed, saves and restores the cursor, and places the directives' skip
ranges from it.
"""

from __future__ import annotations

from typing import Any, Protocol

from stabletrain_agent.data.batches import BatchLineage, SkipList
from stabletrain_agent.data.sample_layout import Shard


class BatchSource(Protocol):
    @property
    def last_lineage(self) -> BatchLineage | None:
        """The batch the latest training step consumed (None before the first)."""
        ...

    @property
    def next_batch_index(self) -> int:
        """Global index of the next batch a step would consume: where skips are placed from."""
        ...

    @property
    def shards(self) -> tuple[Shard, ...]: ...

    def set_skip(self, skip: SkipList) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
