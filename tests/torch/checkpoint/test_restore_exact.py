"""The step the directives name is the step restored, whichever attempt's lineage saved it;
a step the pods cannot find stops them with a RestoreFailed message instead of loading
another one (the two-spike run that resumed at 25 while status said 50)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_reference import Holder, empty_app, matches, reference

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.planned import RestoreFailed, restore_planned
from stabletrain_contract.directives import Directives
from stabletrain_contract.restore import RESTORE_EXIT_CODE, parse_restore_failure

KEEP = {"keep_local": 2, "keep_pfs": 2}


def run_attempt(
    local: Path, pfs: Path, attempt: int, resume: int | None, saves: range, *, offset: int = 0
) -> tuple[int | None, list[tuple[int, int]]]:
    """One attempt: restore as planned, save `saves` (state = reference(step + offset)),
    flush; returns the step restored and the inventory it leaves."""
    holder = empty_app()
    manager = CheckpointManager(CheckpointConfig(local, pfs, attempt, "n0", **KEEP), {"a": holder})
    try:
        directives = Directives(generation=attempt + 1, attempt=attempt, resume_step=resume)
        restored = restore_planned(manager, directives if attempt else None)
        for step in saves:
            holder.state = reference(step + offset)
            manager.save(step, stable=True)
        manager.wait()
        assert not manager.flush(30).timed_out
        records = [(r.step, r.attempt) for r in manager.inventory() if r.pfs.verified]
    finally:
        manager.close()
    return (restored.step if restored else None), records


def restore_only(local: Path, pfs: Path, attempt: int, resume: int, tmp: Path) -> Holder:
    holder = empty_app()
    manager = CheckpointManager(CheckpointConfig(local, pfs, attempt, "n0", **KEEP), {"a": holder})
    try:
        restore_planned(
            manager,
            Directives(generation=attempt + 1, attempt=attempt, resume_step=resume),
            termination_path=tmp / f"termination-{attempt}",
        )
    finally:
        manager.close()
    return holder


def test_a_step_retention_removed_fails_the_restore_instead_of_loading_an_older_one(
    tmp_path: Path,
) -> None:
    """Before: restore(max_step=50) loaded 25 (the resumed attempt's 50 was trimmed) and the
    guard's check raised only after the wrong state was in memory, as a bare traceback.
    After: every rank raises RestoreFailed, nothing is loaded, and the termination message
    names the step for the operator to re-plan."""
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    run_attempt(local, pfs, 0, None, range(25, 51, 25))
    restored, left = run_attempt(local, pfs, 1, 25, range(50, 151, 25), offset=1000)
    assert restored == 25
    assert (50, 1) not in left, "retention trimmed the resumed attempt's step 50"
    assert (25, 0) in left, "the restored checkpoint is protected"
    with pytest.raises(RestoreFailed) as failed:
        restore_only(local, pfs, 2, 50, tmp_path)
    assert failed.value.code == RESTORE_EXIT_CODE
    message = (tmp_path / "termination-2").read_text()
    assert parse_restore_failure(message) == (50, 2)
    assert "no restorable checkpoint of step 50" in message


def test_a_step_two_attempts_saved_restores_the_copy_on_the_lineage(tmp_path: Path) -> None:
    """Attempt 0 and attempt 1 (resumed from 25) both saved step 50: the second rollback to 50
    loads attempt 1's state, never the abandoned attempt 0's; a third rollback, further back,
    loads attempt 0's step 25 exactly."""
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    run_attempt(local, pfs, 0, None, range(25, 51, 25))
    restored, left = run_attempt(local, pfs, 1, 25, range(50, 76, 25), offset=1000)
    assert restored == 25
    assert (50, 0) not in left, "attempt 0's step 50 is off the lineage"
    second = restore_only(local, pfs, 2, 50, tmp_path)
    assert matches(second, reference(1050))
    third = restore_only(local, pfs, 3, 25, tmp_path)
    assert matches(third, reference(25))
    with pytest.raises(RestoreFailed):
        restore_only(local, pfs, 4, 75, tmp_path)  # attempt 3 resumed from 25: 75 abandoned


def test_step_zero_restores_nothing(tmp_path: Path) -> None:
    """Before: a start from scratch sent resumeStep null and the pods loaded the newest."""
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    run_attempt(local, pfs, 0, None, range(25, 51, 25))
    restored, _ = run_attempt(local, pfs, 1, 0, range(0))
    assert restored is None
