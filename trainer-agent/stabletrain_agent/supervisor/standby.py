"""Warm starts from the supervisor's side: a standby launcher kept ready for the next attempt
(stabletrain_agent.warm), torch-free here.

After each start the supervisor starts a standby (`python -m stabletrain_agent.warm.launcher`
with the container's environment), which imports torchrun and starts its standby workers
while the attempt trains. The next attempt whose command is torchrun is handed to it: one
JSON line on its stdin, and it becomes that attempt's torchrun, its output already passing
through the supervisor. A standby is a spare: a stop never signals it, and it ends with the
supervisor. Any other command, a standby that died, or STABLETRAIN_WARM_START=0 starts cold.
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


class StandbyLauncher:
    """Hands torchrun attempts to a standby started during the attempt before."""

    def __init__(self, tail: Tail, standby_env: Mapping[str, str]) -> None:
        self.root = os.getpid()
        self._tail = tail
        self._env = dict(standby_env)
        self._standby: subprocess.Popen[bytes] | None = None
        self._standby_pumps: tuple[threading.Thread, ...] = ()

    def launch(self, argv: Sequence[str], environment: Mapping[str, str]) -> Launched:
        standby = self._standby
        if is_torchrun(argv) and standby is not None and standby.poll() is None:
            assert standby.stdin is not None
            try:
                standby.stdin.write(Become(tuple(argv), environment).to_line())
                standby.stdin.close()
            except OSError as error:
                _log.warning("supervisor: the standby launcher is gone (%s): cold start", error)
            else:
                launched = Launched(standby.pid, self._standby_pumps, warm=True, process=standby)
                self._standby = None
                self._prepare()
                return launched
        process = start(argv, environment)
        launched = Launched(process.pid, output_pumps(process, self._tail), process=process)
        if is_torchrun(argv) and self._standby is None:
            self._prepare()
        return launched

    def _prepare(self) -> None:
        """The standby for the next attempt (its imports run while this attempt trains)."""
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
