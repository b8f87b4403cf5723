"""Finds every process a local cluster started, wherever it went, by an inherited variable.

Process groups miss children that start sessions of their own (torchrun starts each worker in
a new session), and PID namespaces would make the user's command PID 1, where SIGTERM without
a handler is ignored. Every process the node starts carries MARKER_ENV instead, and children
inherit it, so a sweep over /proc finds the ones a container left behind, as the end of a
container's PID namespace would kill them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from support.localnode.namespaces import MARKER_ENV


def marked_processes(marker_prefix: str) -> list[int]:
    """PIDs whose environment has MARKER_ENV starting with this prefix."""
    wanted = f"{MARKER_ENV}={marker_prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for variable in (entry / "environ").read_bytes().split(b"\0"):
                if variable.startswith(wanted):
                    found.append(int(entry.name))
                    break
    return found


def kill_marked(marker_prefix: str, spare: frozenset[int] = frozenset()) -> list[int]:
    """SIGKILLs every marked process but the spared ones; returns whom it killed."""
    found = [pid for pid in marked_processes(marker_prefix) if pid not in spare]
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found
