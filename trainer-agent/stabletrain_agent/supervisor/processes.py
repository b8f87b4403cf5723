"""The processes of one attempt: started, reaped, and ended whatever they do.

torchrun starts each worker in a session of its own, so no process group holds an
attempt, and a worker orphaned by a killed torchrun would be re-parented out of reach. The
supervisor therefore makes itself the child subreaper (Linux `PR_SET_CHILD_SUBREAPER`):
every process the attempt ever starts stays its descendant, and "the attempt" is exactly
the supervisor's descendants minus the standby interpreter it keeps (see standby.py). One
thread reaps every child, as an init process must (the supervisor may be PID 1 of its
container), and records the launcher's own exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
REAP_POLL_SECONDS = 0.05
"""How often the reaper collects exited children: an attempt's end is seen this soon."""
UNCLAIMED_MAX = 64
"""Exits of children nobody watches (yet) that the reaper keeps."""
POLL_SECONDS = 0.05
"""How often a stop checks whether the processes are gone."""
PROC = Path("/proc")


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process instead of to init; whether the
    kernel agreed (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class Exit:
    """How the launcher ended, in a container's terms."""

    code: int
    """The exit status, or 128 + n when signal n killed it (what a kubelet reports)."""
    at: float
    """time.time() when it was reaped."""


def exit_code(status: int) -> int:
    """A wait status as a container runtime reports it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Reaper:
    """Reaps every child of this process; remembers the exits of the pids it is asked to.

    It polls (every REAP_POLL_SECONDS) rather than blocking in wait(), so it can be closed.
    `everything`: reap any child, as the process every orphan of the attempt is re-parented
    to must (it became the subreaper, or is PID 1); otherwise only the watched pids, so the
    exits of children that others wait for are left to them.
    """

    def __init__(self, *, everything: bool) -> None:
        self._everything = everything
        self._lock = threading.Condition()
        self._watched: dict[int, Exit | None] = {}
        self._unclaimed: dict[int, Exit] = {}
        """Exits reaped before anyone asked for them (a process that ended before `watch`)."""
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        """Remember `pid`'s exit (call right after starting it: an exit reaped in between
        is kept for it)."""
        with self._lock:
            self._watched.setdefault(pid, self._unclaimed.pop(pid, None))

    def wait(self, pid: int, timeout: float | None) -> Exit | None:
        """`pid`'s exit, waiting at most `timeout` seconds for it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._watched.get(pid) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._lock.wait(left)
            return self._watched[pid]

    def close(self) -> None:
        self._closed.set()
        self._thread.join(REAP_POLL_SECONDS * 10)

    def _run(self) -> None:
        while not self._closed.is_set():
            reaped = self._reap_all() if self._everything else self._reap_watched()
            if not reaped:
                self._closed.wait(REAP_POLL_SECONDS)

    def _reap_all(self) -> bool:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid != 0:
            self._record(pid, status)
        return pid != 0

    def _reap_watched(self) -> bool:
        with self._lock:
            waiting = [pid for pid, ended in self._watched.items() if ended is None]
        reaped = False
        for pid in waiting:
            try:
                found, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if found != 0:
                self._record(found, status)
                reaped = True
        return reaped

    def _record(self, pid: int, status: int) -> None:
        ended = Exit(exit_code(status), time.time())
        with self._lock:
            if pid in self._watched:
                self._watched[pid] = ended
                self._lock.notify_all()
            else:
                self._unclaimed[pid] = ended
                while len(self._unclaimed) > UNCLAIMED_MAX:
                    del self._unclaimed[next(iter(self._unclaimed))]


def _parent_and_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, None once it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may itself hold spaces or parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0]


def descendants(root: int, *, excluded: Iterable[int] = ()) -> list[int]:
    """Live (not zombie) descendants of `root`, skipping the subtrees of `excluded`."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        read = _parent_and_state(int(entry.name))
        if read is not None and read[1] != "Z":
            children.setdefault(read[0], []).append(int(entry.name))
    skip = set(excluded)
    found: list[int] = []
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in skip:
                found.append(child)
                frontier.append(child)
    return found


def signal_all(pids: Iterable[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def end_tree(
    root: int, *, excluded: Iterable[int], grace: float, kill_bound: float
) -> tuple[int, ...]:
    """TERM every descendant of `root` (outside `excluded`), KILL what is left after `grace`
    seconds, and return what is still there `kill_bound` seconds later (processes a KILL
    cannot end: uninterruptible sleep in a hung driver or file system)."""
    skip = tuple(excluded)
    signal_all(descendants(root, excluded=skip), signal.SIGTERM)
    if _gone_within(root, skip, grace):
        return ()
    left = descendants(root, excluded=skip)
    _log.warning("processes %s outlived the %.0f s grace period: KILL", left, grace)
    signal_all(left, signal.SIGKILL)
    if _gone_within(root, skip, kill_bound):
        return ()
    return tuple(descendants(root, excluded=skip))


def _gone_within(root: int, excluded: tuple[int, ...], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while descendants(root, excluded=excluded):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True
