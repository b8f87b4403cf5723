"""Warm starts from the supervisor's side: a standby launcher kept ready for the next attempt
(stabletrain_agent.warm), torch-free here.

After each start, once STANDBY_DELAY_SECONDS have passed, the supervisor starts a standby
(`python -m stabletrain_agent.warm.launcher` with the container's environment), which imports
torchrun and starts its standby workers while the attempt trains. The next attempt whose
command is torchrun is handed to it: one JSON line on its stdin, and it becomes that
attempt's torchrun, its output already passing through the supervisor. A standby is a spare:
a stop never signals it, and it ends with the supervisor. Any other command, a standby that
died or was not started yet, or STABLETRAIN_WARM_START=0 starts cold.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from stabletrain_agent.supervisor.launch import Launched, output_pumps, start
from stabletrain_agent.supervisor.output import Tail
from stabletrain_agent.supervisor.processes import end_tree
from stabletrain_agent.warm.order import Become, is_torchrun

_log = logging.getLogger(__name__)

LAUNCHER_MODULE = "stabletrain_agent.warm.launcher"
STANDBY_DELAY_SECONDS = 5.0
"""How long after an attempt starts the next attempt's standby does: its interpreters' imports
(seconds of CPU each) would otherwise take the cores from the attempt's own start (its
restore and first steps; measured here, they slowed a restart in place by about 1 s). An
attempt stopped sooner is followed by a cold start."""


class StandbyLauncher:
    """Hands torchrun attempts to a standby started during the attempt before."""

    def __init__(
        self, tail: Tail, standby_env: Mapping[str, str], delay: float = STANDBY_DELAY_SECONDS
    ) -> None:
        self.root = os.getpid()
        self._tail = tail
        self._env = dict(standby_env)
        self._delay = delay
        self._lock = threading.Lock()
        self._standby: subprocess.Popen[bytes] | None = None
        self._standby_pumps: tuple[threading.Thread, ...] = ()
        self._timer: threading.Timer | None = None
        self._closed = False

    def launch(self, argv: Sequence[str], environment: Mapping[str, str]) -> Launched:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()  # a standby not started yet: this attempt starts cold
            standby, self._standby = self._standby, None
        if is_torchrun(argv) and standby is not None and standby.poll() is None:
            assert standby.stdin is not None
            try:
                standby.stdin.write(Become(tuple(argv), environment).to_line())
                standby.stdin.close()
            except OSError as error:
                _log.warning("supervisor: the standby launcher is gone (%s): cold start", error)
            else:
                launched = Launched(standby.pid, self._standby_pumps, warm=True, process=standby)
                self._prepare_later()
                return launched
        elif standby is not None:
            with self._lock:
                self._standby = standby  # kept for the next torchrun attempt
        process = start(argv, environment)
        launched = Launched(process.pid, output_pumps(process, self._tail), process=process)
        if is_torchrun(argv):
            self._prepare_later()
        return launched

    def _prepare_later(self) -> None:
        timer = threading.Timer(self._delay, self._prepare)
        timer.daemon = True
        with self._lock:
            self._timer = timer
        timer.start()

    def _prepare(self) -> None:
        """The standby for the next attempt (its imports run while this attempt trains)."""
        with self._lock:
            if self._closed or self._standby is not None:
                return
            try:
                standby = start(
                    [sys.executable, "-m", LAUNCHER_MODULE], self._env, stdin=subprocess.PIPE
                )
            except OSError as error:
                _log.warning("supervisor: no standby launcher (%s): the next start is cold", error)
                return
            self._standby = standby
            self._standby_pumps = output_pumps(standby, self._tail)

    def spare_pids(self) -> tuple[int, ...]:
        standby = self._standby
        return (standby.pid,) if standby is not None else ()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            standby, self._standby = self._standby, None
        if standby is None:
            return
        if standby.stdin is not None:
            with contextlib.suppress(OSError):
                standby.stdin.close()  # it reads the end of its orders and exits
        end_tree(standby.pid, excluded=(), grace=5.0, kill_bound=5.0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(standby.pid, signal.SIGKILL)
        standby.returncode = -signal.SIGKILL  # reaped by the supervisor's reaper, not here
