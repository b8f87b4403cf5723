"""Child processes that can never outlive the test run.

Each child gets its own process group (so its own children are stopped with it) and a
parent-death signal set by util-linux's `setpriv --pdeathsig` (no preexec_fn, which is unsafe
in a threaded parent), so even a SIGKILLed pytest takes its servers down with it. The signal
fires when the spawning *thread* exits, so spawn from threads that live as long as the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


class ManagedProcess:
    """A started child whose output goes to a log file and whose stop always waits."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            [*DIE_WITH_PARENT, *argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the whole group, SIGKILL it after the grace period, and reap."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._log.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
