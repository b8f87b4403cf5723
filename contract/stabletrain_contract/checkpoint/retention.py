"""Which copies a tier may delete: a pure plan, applied separately, so it is easy to test.

Per tier: keep the newest `keep` regular checkpoints (at least 2, so a crash during the
newest save never leaves none), always the rollback target and the newest stable one, and
nothing regular that has fallen off the lineage (an abandoned trajectory is never
restored, only misleads).

While the newest copies wait for the PFS (it is slow, full or away), the newest copy that
is already on it takes the place of the oldest one kept by choice (there is none at the
minimum retention of 2, which holds the two newest): it is the newest restore point on
both tiers, which a `BothTiers` selection needs. Without it, an outage of a few
intervals left only the old rollback target on both tiers, and a restart went back
thousands of steps.

Spike markers (saved inside an anomaly, never restored) are evidence: at most
`max_spike_markers` of them, the earliest of their episode first, because the state just
as the spike began is what explains it; the newest episode wins over older ones.  A marker
is kept even off the lineage: the spike that caused a rollback is exactly such a one.

A size budget (`max_copies`) only ever removes copies the rules above would keep by
choice, never the ones they must keep: the tier keeps fewer copies rather than fill up.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
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
    episode: int | None = None
    """For a marker: the step of the first marker of its anomaly episode (None: unknown,
    the marker is an episode of its own)."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.step, self.attempt)

    @property
    def episode_key(self) -> tuple[int, int]:
        """(attempt, first step): episodes of one attempt never mix with another's."""
        return (self.attempt, self.step if self.episode is None else self.episode)


def copies_within(size_limit_bytes: int, copy_bytes: int) -> int:
    """Copies a tier of `size_limit_bytes` can keep while one more is being written.

    The next save lands on the tier before retention trims it, so the budget holds the
    kept copies plus that one.  May be below MIN_KEEP: then the tier is too small to
    protect anything, which the preflight reports, and retention keeps MIN_KEEP anyway.
    """
    if size_limit_bytes < 0 or copy_bytes <= 0:
        raise ValueError(
            f"need a size limit >= 0 and a copy size > 0, got {size_limit_bytes}, {copy_bytes}"
        )
    return max(0, size_limit_bytes // copy_bytes - 1)


def local_copies(
    keep: int, spike_markers: int, size_limit_bytes: int | None, copy_bytes: int
) -> int:
    """Most copies the local tier keeps between saves under these settings (the one being
    written comes on top): the retention plus the markers, fewer under a size limit, never
    fewer than MIN_KEEP.  The manager and the preflight both count with this."""
    copies = keep + spike_markers
    if size_limit_bytes is None or copy_bytes <= 0:
        return copies
    return min(copies, max(MIN_KEEP, copies_within(size_limit_bytes, copy_bytes)))


def markers_by_preference(markers: Iterable[RetentionItem]) -> list[RetentionItem]:
    """Newest episode first; inside an episode, its earliest markers first."""
    return sorted(markers, key=lambda item: (_negated(item.episode_key), item.key))


def _negated(key: tuple[int, int]) -> tuple[int, int]:
    return (-key[0], -key[1])


def plan_deletions(
    items: Sequence[RetentionItem],
    *,
    keep: int,
    max_spike_markers: int = MAX_SPIKE_MARKERS,
    protected: Collection[tuple[int, int]] = (),
    waiting: Sequence[tuple[int, int]] = (),
    unreplicated: Collection[tuple[int, int]] | None = None,
    max_copies: int | None = None,
) -> list[tuple[int, int]]:
    """The (step, attempt) keys to delete, oldest first.

    `protected` is never deleted (the rollback target); `waiting` (copies not yet on the
    PFS, the last one kept first) is kept as long as the size budget allows, before older regular
    checkpoints and before markers. `unreplicated` names every copy not on the PFS (None:
    there is no PFS), so the newest one that is gets kept.
    """
    if keep < MIN_KEEP:
        raise ValueError(f"keep must be >= {MIN_KEEP}, got {keep}")
    if not 0 <= max_spike_markers <= MAX_SPIKE_MARKERS:
        raise ValueError(f"max_spike_markers must be 0..{MAX_SPIKE_MARKERS}")
    present = {item.key for item in items}
    newest_first = sorted(items, key=lambda item: item.key, reverse=True)
    regular = [item for item in newest_first if item.on_lineage and not item.spike_marker]
    must = set(protected) & present
    must.update(item.key for item in regular[:MIN_KEEP])
    newest_stable = next((item for item in regular if item.stable), None)
    if newest_stable is not None:
        must.add(newest_stable.key)
    by_choice = [item.key for item in regular[MIN_KEEP:keep]]
    on_both = _newest_on_pfs(regular, unreplicated)
    if on_both is not None and on_both not in must and by_choice:
        by_choice = [on_both, *(key for key in by_choice if key != on_both)][: len(by_choice)]
    markers = markers_by_preference(item for item in items if item.spike_marker)
    wanted = [
        *(key for key in reversed(waiting) if key in present),
        *by_choice,
        *(item.key for item in markers[:max_spike_markers]),
    ]
    kept = set(must)
    for key in wanted:
        if max_copies is not None and len(kept) >= max_copies:
            break
        kept.add(key)
    return sorted(key for key in present if key not in kept)


def _newest_on_pfs(
    regular_newest_first: Sequence[RetentionItem],
    unreplicated: Collection[tuple[int, int]] | None,
) -> tuple[int, int] | None:
    if unreplicated is None:
        return None
    return next((i.key for i in regular_newest_first if i.key not in unreplicated), None)
