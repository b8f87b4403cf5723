"""A killed rank with the memory tier, under real torchrun: the tiny-GPT example's 2 pods
keep their memory tiers across the restart, the RestartFromLatest chosen from their
torch-free scans resumes from the newest snapshot, and both pods restore it from memory.
The same storage with the pods recreated (their memory gone) resumes from the local tier."""

from __future__ import annotations

from pathlib import Path

from support.memory_restart import CHECKPOINT_INTERVAL, kill_then_restart_both_ways

MEMORY_INTERVAL = 10
KILL_AT = 48
"""Rank 1 dies before step 48: 47 steps done, the local tier holds 25, memory 40."""


def newest_snapshot_before(done: int) -> int:
    """The last step the memory tier snapshots up to `done` (save steps excluded)."""
    return max(
        step
        for step in range(1, done + 1)
        if step % MEMORY_INTERVAL == 0 and step % CHECKPOINT_INTERVAL != 0
    )


def test_a_killed_rank_loses_less_than_a_snapshot_interval_when_the_pods_are_kept(
    tmp_path: Path,
) -> None:
    kept, recreated = kill_then_restart_both_ways(
        tmp_path, memory_interval=MEMORY_INTERVAL, kill_at=KILL_AT
    )
    assert kept.planned == newest_snapshot_before(kept.done_steps), kept.reason
    assert "every rank restores from memory" in kept.reason
    assert kept.restored == ((kept.planned, "memory"),) * 2
    assert kept.lost <= MEMORY_INTERVAL

    newest_save = recreated.done_steps // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL
    assert recreated.planned == newest_save, recreated.reason
    assert recreated.restored == ((newest_save, "local"),) * 2
    assert recreated.lost > kept.lost
