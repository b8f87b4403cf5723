"""Restore order in one process: verified local copy, else the PFS (re-seeding local), else
the next older checkpoint; damaged copies are never loaded and the reasons are reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_reference import Holder, empty_app, matches, reference

from stabletrain_agent.checkpoint.layout import local_copy_dir, local_part_root, pfs_part_dir
from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_contract.checkpoint.inventory import compact_inventory


def flip_a_byte(directory: Path) -> None:
    shard = next(directory.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x04
    shard.write_bytes(bytes(data))


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[Path, Path]:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    holder = Holder(reference(0))
    manager = CheckpointManager(CheckpointConfig(local, pfs, 1, "n0"), {"app": holder})
    try:
        assert manager.restore() is None
        for step in (10, 20):
            holder.state = reference(step)
            manager.save(step, stable=True)
        manager.wait()
        assert not manager.flush(30).timed_out
        records = manager.inventory()
        assert [(r.step, r.pfs.verified, r.local_copy("n0") is not None) for r in records] == [
            (10, True, True),
            (20, True, True),
        ]
        assert compact_inventory(records, "n0") == ((10, 1, 61), (20, 1, 61))
    finally:
        manager.close()
    return local, pfs


def restore(local: Path, pfs: Path, attempt: int) -> tuple[Holder, object]:
    holder = empty_app()
    manager = CheckpointManager(CheckpointConfig(local, pfs, attempt, "n0"), {"app": holder})
    try:
        return holder, manager.restore()
    finally:
        manager.close()


def test_damaged_local_copy_falls_back_to_pfs_and_reseeds(tiers: tuple[Path, Path]) -> None:
    local, pfs = tiers
    flip_a_byte(local_copy_dir(local_part_root(local, "0"), 20, 1))
    holder, result = restore(local, pfs, 2)
    assert result is not None
    assert (result.step, result.source) == (20, "pfs")  # type: ignore[attr-defined]
    assert "fails its crc32 check" in result.rejected[0]  # type: ignore[attr-defined]
    assert matches(holder, reference(20))
    kept = (local_part_root(local, "0") / "step-0000000020").glob(".corrupt-attempt-1-*")
    assert len(list(kept)) == 1
    holder, result = restore(local, pfs, 3)  # the re-seeded local copy is now used
    assert (result.step, result.source) == (20, "local")  # type: ignore[attr-defined]


def test_both_copies_damaged_falls_back_to_the_older_checkpoint(tiers: tuple[Path, Path]) -> None:
    local, pfs = tiers
    flip_a_byte(local_copy_dir(local_part_root(local, "0"), 20, 1))
    flip_a_byte(pfs_part_dir(pfs, 20, 1, "0"))
    holder, result = restore(local, pfs, 2)
    assert result is not None
    assert (result.step, result.source) == (10, "local")  # type: ignore[attr-defined]
    assert len(result.rejected) == 2  # type: ignore[attr-defined]
    assert matches(holder, reference(10))


def test_fallback_skips_unstable_for_a_rollback_and_never_restores_spike_markers(
    tmp_path: Path,
) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    holder = Holder(reference(0))
    manager = CheckpointManager(
        CheckpointConfig(local, pfs, 1, "n0", keep_local=5), {"app": holder}
    )
    try:
        manager.restore()
        for step, stable, marker in (
            (10, True, False),
            (20, False, False),
            (30, True, False),
            (40, False, True),
        ):
            holder.state = reference(step)
            manager.save(step, stable=stable, spike_marker=marker)
        manager.wait()
        assert not manager.flush(30).timed_out
    finally:
        manager.close()
    flip_a_byte(local_copy_dir(local_part_root(local, "0"), 30, 1))
    flip_a_byte(pfs_part_dir(pfs, 30, 1, "0"))

    restart = empty_app()
    manager = CheckpointManager(CheckpointConfig(local, pfs, 2, "n0"), {"app": restart})
    try:
        result = manager.restore()
    finally:
        manager.close()
    assert result is not None
    assert result.step == 20  # 40 is a spike marker, 30 is damaged on both tiers
    assert len(result.rejected) == 2  # step 30's local copy and PFS part, each named
    assert matches(restart, reference(20))

    rollback = empty_app()
    manager = CheckpointManager(CheckpointConfig(local, pfs, 3, "n0"), {"app": rollback})
    try:
        result = manager.restore(max_step=35, stable_only=True)
    finally:
        manager.close()
    assert result is not None
    assert result.step == 10  # 20 was not stable
    assert matches(rollback, reference(10))
