"""Starting an attempt's launcher (the job's command, usually torchrun) as a process.

`ColdLauncher` starts the command as it is, the way a container would. standby.py hands the
command to an interpreter that already imported what it needs instead; both give the
attempt the same `Launched` handle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from stabletrain_agent.supervisor.output import Tail, pump


@dataclass
class Launched:
    """One running launcher: its pid and the threads copying its output."""

    pid: int
    pumps: tuple[threading.Thread, ...]
    warm: bool = False
    process: subprocess.Popen[bytes] | None = None
    """Held so that subprocess never polls it on its own: the supervisor's reaper collects
    every exit, and a Popen dropped while it believes its process runs would later wait
    for its pid, which by then may belong to another process."""

    def reaped(self, code: int) -> None:
        """The reaper collected the exit: the Popen must not wait for the pid again."""
        if self.process is not None:
            self.process.returncode = code

    def drain(self, seconds: float) -> None:
        """Wait (at most `seconds` each) for the output threads to reach the end."""
        for thread in self.pumps:
            thread.join(seconds)


class Launcher(Protocol):
    root: int
    """The process whose descendants are the attempt's processes (the supervisor)."""

    def launch(self, argv: Sequence[str], environment: Mapping[str, str]) -> Launched:
        """Start `argv`, its output passed through the attempts' tail; raises OSError when
        it cannot be started."""
        ...

    def spare_pids(self) -> tuple[int, ...]:
        """Children of the supervisor that belong to no attempt (a standby interpreter)."""
        ...

    def close(self) -> None:
        """End what the launcher keeps for later attempts."""
        ...


def output_pumps(process: subprocess.Popen[bytes], tail: Tail) -> tuple[threading.Thread, ...]:
    """Pass the process's stdout and stderr through to the supervisor's, keeping the tail."""
    assert process.stdout is not None
    assert process.stderr is not None
    return (
        pump(process.stdout, sys.stdout.fileno(), tail),
        pump(process.stderr, sys.stderr.fileno(), tail),
    )


def start(
    argv: Sequence[str], environment: Mapping[str, str], *, stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """`argv` in a new session (its own process group: a stop can signal the whole of it),
    its output piped to the supervisor."""
    return subprocess.Popen(
        list(argv),
        env=dict(environment),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


class ColdLauncher:
    """Starts the command as it is, like a container runtime starts it."""

    def __init__(self, tail: Tail) -> None:
        self.root = os.getpid()
        self._tail = tail

    def launch(self, argv: Sequence[str], environment: Mapping[str, str]) -> Launched:
        process = start(argv, environment)
        return Launched(process.pid, output_pumps(process, self._tail), process=process)

    def spare_pids(self) -> tuple[int, ...]:
        return ()

    def close(self) -> None:
        """Nothing is kept."""
