"""A manager of an earlier attempt that keeps running after a rollback started a new attempt
cannot write, and what it wrote after the rollback point is not part of the inventory."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_reference import Holder, empty_app, matches, reference

from stabletrain_agent.checkpoint.fence import StaleAttemptError
from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager


def test_stale_attempt_is_fenced_off(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    old_holder = Holder(reference(0))
    old = CheckpointManager(CheckpointConfig(local, pfs, 1, "n0"), {"app": old_holder})
    new_holder = empty_app()
    new = CheckpointManager(CheckpointConfig(local, pfs, 2, "n0"), {"app": new_holder})
    try:
        old.restore()
        for step in (10, 20):
            old_holder.state = reference(step)
            old.save(step, stable=True)
        old.wait()
        assert not old.flush(30).timed_out

        result = new.restore(max_step=10)  # the operator rolled back to step 10
        assert result is not None
        assert (result.step, result.attempt) == (10, 1)
        assert matches(new_holder, reference(10))
        assert [(r.step, r.attempt) for r in new.inventory()] == [(10, 1)]  # 20 abandoned

        old_holder.state = reference(30)
        with pytest.raises(StaleAttemptError, match="attempt 1 is superseded by attempt 2"):
            old.save(30, stable=True)

        new_holder.state = reference(20)
        new.save(20, stable=True)
        new.wait()
        assert not new.flush(30).timed_out
        records = {(r.step, r.attempt): r.pfs.verified for r in new.inventory()}
        assert records == {(10, 1): True, (20, 2): True}
    finally:
        old.close()
        new.close()
