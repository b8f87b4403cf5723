"""The memory tier's rules on real directories: what an attempt drops before it loads, what
is kept after a snapshot, and what the torch-free scan lists (a supervisor scans it while
the training processes are down)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ckpt_copies import KEY, write_copy

from stabletrain_agent.checkpoint.fence import StaleAttemptError, read_fence
from stabletrain_agent.checkpoint.inventory_scan import (
    TierDirs,
    VerifyCache,
    memory_interval_steps,
    scan_tiers,
)
from stabletrain_agent.checkpoint.layout import (
    iter_attempt_dirs,
    local_part_root,
    local_temp_dir,
)
from stabletrain_agent.checkpoint.memory_tier import keep_only, start_attempt
from stabletrain_contract import env
from stabletrain_contract.checkpoint.inventory import PodCopy


def held(memory: Path) -> list[tuple[int, int]]:
    return [(step, attempt) for step, attempt, _ in iter_attempt_dirs(memory)]


def test_an_attempt_drops_snapshots_newer_than_its_resume_step(tmp_path: Path) -> None:
    """A rollback to 20 abandons the trajectory after it: attempt 1's snapshot of 30 must
    never load, whatever attempt later asks for step 30."""
    memory = tmp_path / "memory"
    write_copy(memory, 20, attempt=1)
    write_copy(memory, 30, attempt=1)
    dropped = start_attempt(memory, attempt=2, resume_step=20)
    assert held(memory) == [(20, 1)]
    assert dropped == ["step 30 of attempt 1 (another lineage)"]
    assert [(s.attempt, s.resume_step) for s in read_fence(memory).starts] == [(2, 20)]


def test_an_attempt_drops_torn_snapshots_and_keeps_only_the_newest(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    write_copy(memory, 10, attempt=0)
    write_copy(memory, 20, attempt=0)
    torn = local_temp_dir(memory, 30, 0)  # the writer died before its commit
    torn.mkdir(parents=True)
    (torn / "__0_0.distcp").write_bytes(b"half a snapshot")
    dropped = start_attempt(memory, attempt=1, resume_step=20)
    assert held(memory) == [(20, 0)]
    assert not torn.exists()
    assert sorted(dropped) == [
        "step 10 of attempt 0 (an older snapshot)",
        "step-0000000030/.tmp-attempt-0 (torn)",
    ]


def test_an_abandoned_lineage_stays_abandoned_for_later_attempts(tmp_path: Path) -> None:
    """Attempt 1 resumed from 20: attempt 0's 30 is off the lineage even for an attempt that
    resumes later than 30 (its snapshot can no longer be told apart by the step alone)."""
    memory = tmp_path / "memory"
    late = write_copy(tmp_path / "elsewhere", 30, attempt=0)
    start_attempt(memory, attempt=1, resume_step=20)
    # A stale writer of attempt 0 that checked the fence before attempt 1 started renames
    # its snapshot into place afterwards.
    late.parent.rename(memory / late.parent.name)
    start_attempt(memory, attempt=2, resume_step=40)
    assert held(memory) == []


def test_a_superseded_attempt_cannot_start(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    start_attempt(memory, attempt=3, resume_step=0)
    with pytest.raises(StaleAttemptError):
        start_attempt(memory, attempt=2, resume_step=0)


def test_a_committed_snapshot_replaces_every_other(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    copies = [write_copy(memory, step, attempt=1) for step in (10, 20, 30)]
    assert keep_only(memory, (30, 1)) == copies[:2]
    assert held(memory) == [(30, 1)]
    assert sorted(p.name for p in memory.iterdir()) == ["step-0000000030"]


def tiers(tmp_path: Path, *, pod: str = "pod-a") -> TierDirs:
    (tmp_path / "pfs").mkdir(exist_ok=True)
    return TierDirs(
        local_dir=local_part_root(tmp_path / "local", "0"),
        pfs_root=tmp_path / "pfs",
        memory_dir=local_part_root(tmp_path / "memory", "0"),
        part="0",
        node="node-a",
        pod=pod,
    )


def test_the_scan_lists_memory_snapshots_under_the_pod(tmp_path: Path) -> None:
    dirs = tiers(tmp_path)
    assert dirs.memory_dir is not None
    write_copy(dirs.local_dir, 25, node="0")
    write_copy(dirs.memory_dir, 30, node="0")
    records = {r.step: r for r in scan_tiers(dirs, VerifyCache(KEY))}
    assert records[30].memory == (PodCopy(pod="pod-a", complete=True, verified=True),)
    assert (records[30].local, records[30].pfs.complete) == ((), False)
    assert records[25].memory == ()
    assert [c.node for c in records[25].local] == ["node-a"]


def test_the_scan_never_lists_a_torn_snapshot(tmp_path: Path) -> None:
    dirs = tiers(tmp_path)
    assert dirs.memory_dir is not None
    snapshot = write_copy(dirs.memory_dir, 30, node="0")
    shard = next(snapshot.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[7] ^= 0x01
    shard.write_bytes(bytes(data))
    torn = local_temp_dir(dirs.memory_dir, 40, 1)
    torn.mkdir(parents=True)
    (torn / "__0_0.distcp").write_bytes(b"x")
    assert scan_tiers(dirs, VerifyCache(KEY)) == []


def test_the_scan_never_lists_a_snapshot_of_another_lineage(tmp_path: Path) -> None:
    """The local tier's fence knows that attempt 2 resumed from 20 (the memory tier, written
    before, does not yet): attempt 1's snapshot of 30 is off the lineage all the same."""
    dirs = tiers(tmp_path)
    assert dirs.memory_dir is not None
    write_copy(dirs.memory_dir, 30, attempt=1, node="0")
    write_copy(dirs.local_dir, 20, attempt=1, node="0")
    start_attempt(dirs.local_dir, attempt=2, resume_step=20)  # any tier's fence counts
    assert [(r.step, r.attempt) for r in scan_tiers(dirs, VerifyCache(KEY))] == [(20, 1)]


def pod_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        env.LOCAL_CHECKPOINT_DIR: str(tmp_path / "local"),
        env.PFS_CHECKPOINT_DIR: str(tmp_path / "pfs"),
        env.MEMORY_CHECKPOINT_DIR: str(tmp_path / "memory"),
        env.NODE_RANK: "1",
        env.NODE_NAME: "node-b",
        env.POD_NAME: "job-a0-1",
        **extra,
    }


def test_the_tiers_come_from_the_pods_env(tmp_path: Path) -> None:
    dirs = TierDirs.from_env(pod_env(tmp_path))
    assert dirs == TierDirs(
        local_dir=tmp_path / "local" / "node-1",
        pfs_root=tmp_path / "pfs",
        memory_dir=tmp_path / "memory" / "node-1",
        part="1",
        node="node-b",
        pod="job-a0-1",
    )
    off = TierDirs.from_env(pod_env(tmp_path, **{env.MEMORY_INTERVAL_STEPS: "0"}))
    assert off.memory_dir is None
    assert memory_interval_steps({}) == env.DEFAULT_MEMORY_INTERVAL_STEPS
    with pytest.raises(ValueError, match="STABLETRAIN_MEMORY_INTERVAL_STEPS must be an integer"):
        memory_interval_steps({env.MEMORY_INTERVAL_STEPS: "-3"})
    with pytest.raises(ValueError, match="STABLETRAIN_PFS_CHECKPOINT_DIR"):
        TierDirs.from_env({env.LOCAL_CHECKPOINT_DIR: "/l"})


def test_a_forgotten_copy_is_verified_again(tmp_path: Path) -> None:
    """The snapshot thread forgets the copies it deleted: the cache keeps no entry per
    snapshot of a long run (and a copy under that name is read afresh)."""
    copy = write_copy(tmp_path / "memory", 30, node="0")
    cache = VerifyCache(KEY)
    assert cache.check(copy, step=30, attempt=1, node="0").ok
    shard = next(copy.glob("*.distcp"))
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert cache.check(copy, step=30, attempt=1, node="0").ok, "the cached verdict"
    cache.forget(copy)
    assert not cache.check(copy, step=30, attempt=1, node="0").ok
