"""Planned crash points: prove that an action survives the operator dying at any step.

STABLETRAIN_OPERATOR_CRASH_AFTER names phases (comma-separated); right after the status
write that enters one of them (before any effect that follows the write) the process
SIGKILLs itself, once per phase: a marker file per phase in the directory named by
STABLETRAIN_OPERATOR_CRASH_MARKERS is created first, so the restarted operator runs on.
Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

CRASH_AFTER_ENV = "STABLETRAIN_OPERATOR_CRASH_AFTER"
CRASH_MARKERS_ENV = "STABLETRAIN_OPERATOR_CRASH_MARKERS"

_log = logging.getLogger(__name__)


def maybe_crash_after(phase: str) -> None:
    planned = {p.strip() for p in os.environ.get(CRASH_AFTER_ENV, "").split(",") if p.strip()}
    markers = os.environ.get(CRASH_MARKERS_ENV)
    if phase not in planned or not markers:
        return
    try:
        (Path(markers) / phase).touch(exist_ok=False)
    except FileExistsError:
        return
    _log.warning("planned crash point: SIGKILL after the status write entering %s", phase)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
