"""Restore what the operator planned for this attempt, and nothing else.

The directives' `resumeStep` is the step the operator recorded in status: a rollback's
target, a restart's newest checkpoint, or 0 for a start from scratch. The pods load exactly
that step. If they cannot, every rank stops with a RestoreFailed termination message: the
operator then re-plans the same action without that step, instead of the pods guessing a
step that may lie inside the spike (or older than the status says). Without directives
(a run outside the operator) the newest restorable checkpoint is resumed, as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from stabletrain_agent.checkpoint.manager import (
    CheckpointManager,
    RestoreResult,
    RestoreTargetMissingError,
)
from stabletrain_contract.directives import Directives
from stabletrain_contract.restore import RESTORE_EXIT_CODE, render_restore_failure


class RestoreFailed(SystemExit):
    """Raised on every rank when the planned step cannot be restored; exits with
    RESTORE_EXIT_CODE after the termination message is written."""

    def __init__(self, message: str) -> None:
        super().__init__(RESTORE_EXIT_CODE)
        self.message = message

    def __str__(self) -> str:
        return self.message


def restore_planned(
    manager: CheckpointManager,
    directives: Directives | None,
    *,
    termination_path: Path | None = None,
) -> RestoreResult | None:
    """Load the directives' resume step exactly (0: nothing), or raise RestoreFailed.

    One process per pod (local rank 0) writes the termination message, like a trip report.
    """
    target = directives.resume_step if directives is not None else None
    if target is None:
        return manager.restore()
    try:
        return manager.restore(max_step=target, exact=True)
    except RestoreTargetMissingError as error:
        assert directives is not None
        message = render_restore_failure(target, directives.attempt, str(error))
        print(f"stabletrain: {message}", file=sys.stderr)
        if termination_path is not None and manager.local_rank == 0:
            _write(termination_path, message)
        raise RestoreFailed(message) from error


def _write(path: Path, message: str) -> None:
    """Where the kubelet reads it (the file is bind-mounted: no rename)."""
    with path.open("w", encoding="utf-8") as handle:
        handle.write(message)
        handle.flush()
        os.fsync(handle.fileno())
