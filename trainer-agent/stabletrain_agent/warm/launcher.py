"""A standby launcher: torchrun imported, one standby worker per local rank started, waiting
to become the next attempt's `torchrun ...`.

torchrun starts its workers through `SubprocessHandler._popen` (torch 2.9,
`torch/distributed/elastic/multiprocessing/subprocess_handler`); here that call hands each
worker's command line to a standby worker (worker.py), whose Popen torchrun then watches,
signals and waits for as it would its own. A worker torchrun would not start as
`<this python> -u ...`, or one more than the standbys, starts cold.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Any

import torch.distributed.run as torchrun
from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import (
    SubprocessHandler,
)

from stabletrain_agent.warm.order import Become, read_order, take_on, torchrun_args
from stabletrain_contract import env

WORKER_MODULE = "stabletrain_agent.warm.worker"


class StandbyWorkers:
    """Interpreters started now, each to become one worker of the attempt later."""

    def __init__(self, count: int) -> None:
        self._idle = [
            subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                stdin=subprocess.PIPE,
                start_new_session=True,
            )
            for _ in range(count)
        ]

    def take(self, order: Become) -> subprocess.Popen[bytes] | None:
        """A standby that became the order's worker; None when none is left alive."""
        while self._idle:
            standby = self._idle.pop(0)
            if standby.poll() is not None or standby.stdin is None:
                continue
            try:
                standby.stdin.write(order.to_line())
                standby.stdin.close()
            except OSError:
                continue
            return standby
        return None

    def close(self) -> None:
        """The standbys no attempt took end (their stdin closes: they exit)."""
        for standby in self._idle:
            if standby.stdin is not None:
                with contextlib.suppress(OSError):
                    standby.stdin.close()
        for standby in self._idle:
            try:
                standby.wait(10)
            except subprocess.TimeoutExpired:
                standby.kill()
        self._idle = []


def _stand_in(workers: StandbyWorkers) -> None:
    """torchrun's workers from the standbys where one can stand in."""
    cold = SubprocessHandler._popen

    def _popen(self: Any, args: tuple[str, ...], env_vars: dict[str, str]) -> Any:
        if len(args) >= 3 and args[0] == sys.executable and args[1] == "-u":
            order = Become(
                argv=tuple(args),
                env=env_vars,
                stdout=getattr(self._stdout, "name", None),
                stderr=getattr(self._stderr, "name", None),
            )
            standby = workers.take(order)
            if standby is not None:
                return standby
        return cold(self, args, env_vars)

    SubprocessHandler._popen = _popen  # type: ignore[method-assign,assignment]


def main() -> None:
    processes = os.environ.get(env.PET_NPROC_PER_NODE) or os.environ.get(env.PROCESSES_PER_NODE)
    workers = StandbyWorkers(int(processes) if processes and processes.isdigit() else 1)
    try:
        order = read_order(sys.stdin)
        if order is None:
            return
        take_on(order)
        _stand_in(workers)
        sys.argv = ["torchrun", *torchrun_args(order.argv)]
        torchrun.main()
    finally:
        workers.close()


if __name__ == "__main__":
    main()
