"""The memory tier with real saves and restores: a restarted process resumes from the pod's
snapshot bit-exactly; a torn snapshot never loads; a snapshot of another attempt's lineage
never loads; a replaced pod (empty memory) falls back to the local tier and the PFS."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ckpt_reference import Holder, empty_app, matches, reference

from stabletrain_agent.checkpoint.inventory_scan import VerifyCache, scan_tiers
from stabletrain_agent.checkpoint.layout import iter_attempt_dirs, local_copy_dir
from stabletrain_agent.checkpoint.manager import (
    CheckpointConfig,
    CheckpointManager,
    RestoreResult,
)
from stabletrain_agent.checkpoint.planned import RestoreFailed, restore_planned
from stabletrain_contract.checkpoint.inventory import PodCopy
from stabletrain_contract.directives import Directives

SAVE_EVERY = 5
SNAPSHOT_EVERY = 3


def config(base: Path, attempt: int, memory: str = "memory") -> CheckpointConfig:
    (base / "pfs").mkdir(exist_ok=True)
    return CheckpointConfig(
        base / "local",
        base / "pfs",
        attempt,
        "n0",
        interval_steps=SAVE_EVERY,
        memory_root=base / memory,
        memory_interval_steps=SNAPSHOT_EVERY,
        pod="pod-0",
        keep_local=2,
        keep_pfs=2,
    )


def train(
    base: Path,
    attempt: int,
    resume: int | None,
    steps: range,
    *,
    offset: int = 0,
    also_save: tuple[int, ...] = (),
) -> RestoreResult | None:
    """One attempt of a loop: restore as planned, then after each step save at save steps
    (and at `also_save`) and offer a snapshot; state = reference(step + offset)."""
    holder = empty_app()
    manager = CheckpointManager(config(base, attempt), {"app": holder})
    try:
        directives = Directives(generation=attempt + 1, attempt=attempt, resume_step=resume)
        restored = restore_planned(manager, directives if resume is not None else None)
        for step in steps:
            holder.state = reference(step + offset)
            if manager.is_save_step(step) or step in also_save:
                manager.save(step, stable=True)
            manager.snapshot(step, stable=True)
        manager.wait()
        assert not manager.flush(30).timed_out
    finally:
        manager.close()
    return restored


def restore(
    base: Path, attempt: int, step: int, memory: str = "memory"
) -> tuple[RestoreResult | None, Holder]:
    holder = empty_app()
    manager = CheckpointManager(config(base, attempt, memory), {"app": holder})
    try:
        directives = Directives(generation=attempt + 1, attempt=attempt, resume_step=step)
        return restore_planned(manager, directives), holder
    finally:
        manager.close()


def memory_steps(base: Path, memory: str = "memory") -> list[tuple[int, int]]:
    return [(s, a) for s, a, _ in iter_attempt_dirs(base / memory / "node-0")]


def snapshot_dir(base: Path, step: int, attempt: int) -> Path:
    return local_copy_dir(base / "memory" / "node-0", step, attempt)


def put_back(stale: Path, base: Path, step: int, attempt: int) -> None:
    """A stale writer's late rename into the tier (its step directory may be gone)."""
    target = snapshot_dir(base, step, attempt)
    target.parent.mkdir(exist_ok=True)
    stale.rename(target)


def test_a_restarted_process_resumes_from_the_pods_memory_snapshot(tmp_path: Path) -> None:
    """Killed after step 7: the local tier holds 5, the memory tier 6 (3 was replaced)."""
    train(tmp_path, 0, None, range(1, 8))
    assert memory_steps(tmp_path) == [(6, 0)]
    settings = config(tmp_path, 0)
    records = {r.step: r for r in scan_tiers(settings.tiers, VerifyCache(settings.key))}
    assert records[6].memory == (PodCopy(pod="pod-0", complete=True, verified=True),)
    assert (records[6].local, records[6].pfs.complete) == ((), False)
    assert (records[5].memory, records[5].pfs.verified) == ((), True)

    restored, holder = restore(tmp_path, 1, 6)
    assert restored is not None
    assert (restored.step, restored.source) == (6, "memory")
    assert matches(holder, reference(6))


def test_a_torn_snapshot_never_loads(tmp_path: Path) -> None:
    train(tmp_path, 0, None, range(1, 8), also_save=(6,))  # 6 on the local tier too
    shard = next(snapshot_dir(tmp_path, 6, 0).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x04
    shard.write_bytes(bytes(data))
    restored, holder = restore(tmp_path, 1, 6)
    assert restored is not None
    assert (restored.step, restored.source) == (6, "local")
    assert any("memory snapshot" in r and "crc32" in r for r in restored.rejected)
    assert matches(holder, reference(6))
    assert not snapshot_dir(tmp_path, 6, 0).exists(), "a torn snapshot is dropped"


def test_a_snapshot_whose_write_was_cut_short_never_loads(tmp_path: Path) -> None:
    """The writer died before its commit: the files sit under a temporary name."""
    train(tmp_path, 0, None, range(1, 8))
    committed = snapshot_dir(tmp_path, 6, 0)
    torn = committed.parent.parent / "step-0000000009" / ".tmp-attempt-0"
    torn.parent.mkdir()
    shutil.copytree(committed, torn)
    (torn / "MANIFEST.json").unlink()
    with pytest.raises(RestoreFailed, match="no restorable checkpoint of step 9"):
        restore(tmp_path, 1, 9)
    restored, holder = restore(tmp_path, 2, 6)
    assert restored is not None
    assert (restored.step, restored.source) == (6, "memory")
    assert matches(holder, reference(6))
    assert not torn.exists(), "swept when the attempt started"


def test_a_snapshot_of_another_lineage_never_loads(tmp_path: Path) -> None:
    """Attempt 0 reached step 7 (snapshot 6); attempt 1 rolls back to 5 and snapshots its
    own, different 6: a restart to 6 loads attempt 1's. Attempt 0's 6 is dropped when
    attempt 1 starts, and refused even when it reappears (a stale writer's late rename)."""
    train(tmp_path, 0, None, range(1, 8))
    stale = tmp_path / "stale-6"
    shutil.copytree(snapshot_dir(tmp_path, 6, 0), stale)
    train(tmp_path, 1, 5, range(6, 7), offset=1000)
    assert memory_steps(tmp_path) == [(6, 1)]
    put_back(stale, tmp_path, 6, 0)
    restored, holder = restore(tmp_path, 2, 6)
    assert restored is not None
    assert (restored.step, restored.attempt, restored.source) == (6, 1, "memory")
    assert matches(holder, reference(6 + 1000))


def test_an_abandoned_snapshot_alone_is_no_restore_target(tmp_path: Path) -> None:
    train(tmp_path, 0, None, range(1, 8))
    stale = tmp_path / "stale-6"
    shutil.copytree(snapshot_dir(tmp_path, 6, 0), stale)
    train(tmp_path, 1, 5, range(6, 6))  # rolled back to 5, stopped before step 6
    put_back(stale, tmp_path, 6, 0)
    with pytest.raises(RestoreFailed, match="no restorable checkpoint of step 6"):
        restore(tmp_path, 2, 6)


def test_a_replaced_pod_restores_from_the_local_tier_and_the_pfs(tmp_path: Path) -> None:
    """A new pod has an empty memory tier: a step on the other tiers loads from them, a
    step only the old pod's memory held cannot be restored (the operator re-plans)."""
    train(tmp_path, 0, None, range(1, 8))
    restored, holder = restore(tmp_path, 1, 5, memory="memory-of-the-new-pod")
    assert restored is not None
    assert (restored.step, restored.source) == (5, "local")
    assert matches(holder, reference(5))
    with pytest.raises(RestoreFailed, match="no restorable checkpoint of step 6"):
        restore(tmp_path, 2, 6, memory="memory-of-the-new-pod")
