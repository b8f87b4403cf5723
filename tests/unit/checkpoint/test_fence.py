from __future__ import annotations

from pathlib import Path

import pytest

from stabletrain_agent.checkpoint.fence import (
    StaleAttemptError,
    advance_fence,
    check_not_stale,
    read_fence,
)
from stabletrain_agent.checkpoint.layout import FENCE_NAME


def test_lineage_drops_the_abandoned_trajectory(tmp_path: Path) -> None:
    advance_fence(tmp_path, attempt=1, resume_step=0)
    fence = advance_fence(tmp_path, attempt=2, resume_step=300)  # rolled back to step 300
    assert fence.on_lineage(300, 1)
    assert not fence.on_lineage(400, 1)  # attempt 1 after the rollback point: abandoned
    assert fence.on_lineage(400, 2)
    assert fence.on_lineage(999, 7)  # a newer attempt than any recorded: not fenced
    assert read_fence(tmp_path) == fence


def test_stale_attempt_is_refused(tmp_path: Path) -> None:
    advance_fence(tmp_path, attempt=3, resume_step=100)
    with pytest.raises(StaleAttemptError, match="attempt 2 is superseded by attempt 3"):
        check_not_stale(tmp_path, 2)
    with pytest.raises(StaleAttemptError, match="attempt 3 already started"):
        advance_fence(tmp_path, attempt=2, resume_step=0)
    check_not_stale(tmp_path, 3)
    advance_fence(tmp_path, attempt=3, resume_step=100)  # idempotent


def test_corrupt_fence_is_an_error_not_an_empty_history(tmp_path: Path) -> None:
    (tmp_path / FENCE_NAME).write_text("not json")
    with pytest.raises(Exception, match="is not a valid fence"):
        read_fence(tmp_path)
