"""Background checkpoint work yields the CPU to the training thread.

Writing, checksumming and replicating a checkpoint are throughput work with seconds of
slack; a training step is latency-bound.  On Linux every thread is its own schedulable task,
so raising one thread's nice value leaves the training thread's priority untouched while
the scheduler prefers it whenever both want a core.
"""

from __future__ import annotations

import contextlib
import os
import threading

BACKGROUND_NICE = 10


def lower_current_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Best effort: where per-thread priorities do not exist, nothing changes."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
