"""Which copies a tier may delete: a pure plan, applied separately, so it is easy to test.

Per tier: keep the newest `keep` regular checkpoints (at least 2, so a crash during the
newest save never leaves none), always the rollback target and the newest stable one, at
most `max_spike_markers` spike markers (evidence, never a target), and nothing that has
fallen off the lineage (an abandoned trajectory is never restored, only misleads).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

MIN_KEEP = 2
MAX_SPIKE_MARKERS = 3


@dataclass(frozen=True)
class RetentionItem:
    step: int
    attempt: int
    stable: bool
    spike_marker: bool
    on_lineage: bool = True

    @property
    def key(self) -> tuple[int, int]:
        return (self.step, self.attempt)


def plan_deletions(
    items: Sequence[RetentionItem],
    *,
    keep: int,
    max_spike_markers: int = MAX_SPIKE_MARKERS,
    protected: Collection[tuple[int, int]] = (),
) -> list[tuple[int, int]]:
    """The (step, attempt) keys to delete, oldest first."""
    if keep < MIN_KEEP:
        raise ValueError(f"keep must be >= {MIN_KEEP}, got {keep}")
    if not 0 <= max_spike_markers <= MAX_SPIKE_MARKERS:
        raise ValueError(f"max_spike_markers must be 0..{MAX_SPIKE_MARKERS}")
    newest_first = sorted(items, key=lambda item: item.key, reverse=True)
    kept: set[tuple[int, int]] = set(protected)
    live = [item for item in newest_first if item.on_lineage]
    regular = [item for item in live if not item.spike_marker]
    markers = [item for item in live if item.spike_marker]
    kept.update(item.key for item in regular[:keep])
    kept.update(item.key for item in markers[:max_spike_markers])
    newest_stable = next((item for item in regular if item.stable), None)
    if newest_stable is not None:
        kept.add(newest_stable.key)
    return sorted(item.key for item in items if item.key not in kept)
