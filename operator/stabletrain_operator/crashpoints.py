"""Planned crash points: prove that a rollback survives the operator dying at any step.

When STABLETRAIN_OPERATOR_CRASH_AFTER names a phase, the process SIGKILLs itself right
after the status write that entered that phase (before any effect that follows the write),
once: the marker file named by STABLETRAIN_OPERATOR_CRASH_MARKER is created first, so the
restarted operator runs on. Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

CRASH_AFTER_ENV = "STABLETRAIN_OPERATOR_CRASH_AFTER"
CRASH_MARKER_ENV = "STABLETRAIN_OPERATOR_CRASH_MARKER"

_log = logging.getLogger(__name__)


def maybe_crash_after(phase: str) -> None:
    if os.environ.get(CRASH_AFTER_ENV) != phase:
        return
    marker = Path(os.environ.get(CRASH_MARKER_ENV, "/tmp/stabletrain-operator-crashed"))
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return
    _log.warning("planned crash point: SIGKILL after the status write entering %s", phase)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
