"""Warm starts with real torchrun: the supervisor's first attempt starts cold, the next one
is handed to the standby launcher, whose standby workers become torchrun's workers, with the
attempt's own environment; a command that is not torchrun starts cold."""

from __future__ import annotations

import os
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabletrain_agent.supervisor.attempts import Attempts, AttemptSettings
from stabletrain_agent.supervisor.output import Tail
from stabletrain_agent.supervisor.processes import Reaper, descendants
from stabletrain_agent.supervisor.standby import StandbyLauncher
from stabletrain_contract import env
from stabletrain_contract.directives import Directives
from stabletrain_contract.supervisor import StartOrder

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    warm = "stabletrain_agent.warm.order" in sys.modules  # what a standby imported
    print(f"READY attempt={os.environ['STABLETRAIN_ATTEMPT']} rank={dist.get_rank()} "
          f"warm={warm} rdzv={os.environ.get('PET_RDZV_ID')} argv={sys.argv[1:]}", flush=True)
    time.sleep(600)
    """
)
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def start(attempt: int) -> StartOrder:
    return StartOrder(
        directives=Directives(generation=attempt + 1, attempt=attempt),
        rendezvous_endpoint="127.0.0.1:0",
        rendezvous_id=f"job-{attempt}",
        master_addr="127.0.0.1",
        grace_seconds=2.0,
    )


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[tuple[Attempts, Tail, list[str]]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [TORCHRUN, "--standalone", "--nproc-per-node=2", str(script), "--flag", "x"]
    environment = {**os.environ, env.ATTEMPT: "0", env.PET_NPROC_PER_NODE: "2",
                   "OMP_NUM_THREADS": "1"}  # fmt: skip
    settings = AttemptSettings(
        argv=tuple(argv),
        base_env=environment,
        local_agent_port=19777,
        run_dir=tmp_path / "run",
        termination_path=tmp_path / "termination-log",
        default_grace=2.0,
    )
    tail = Tail(1 << 20)
    launcher = StandbyLauncher(tail, environment)
    reaper = Reaper(everything=False)
    attempts = Attempts(settings, launcher, reaper, tail)
    yield attempts, tail, argv
    attempts.terminate(2.0)
    reaper.close()
    deadline = time.monotonic() + 30
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert descendants(os.getpid()) == [], "the standbys end with the supervisor"


def ready_lines(tail: Tail, attempt: int, timeout: float = 240.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = re.findall(rf"READY attempt={attempt} .*", tail.text())
        if len(lines) == 2:
            return lines
        assert time.monotonic() < deadline, tail.text()[-3000:]
        time.sleep(0.1)


def test_a_torchrun_attempt_is_handed_to_warm_standbys(
    supervisor: tuple[Attempts, Tail, list[str]],
) -> None:
    attempts, tail, _ = supervisor
    attempts.start_first()
    first = ready_lines(tail, 0)
    assert all("warm=False" in line for line in first), first
    assert not attempts.report(agent_answered=False).warm
    time.sleep(30)  # the standby launcher and its workers import meanwhile
    assert attempts.order_start(start(1))[0]
    second = ready_lines(tail, 1)
    assert all("warm=True rdzv=job-1 argv=['--flag', 'x']" in line for line in second), second
    assert attempts.report(agent_answered=False).warm


def test_a_command_that_is_not_torchrun_starts_cold(tmp_path: Path) -> None:
    tail = Tail(4096)
    launcher = StandbyLauncher(tail, dict(os.environ))
    reaper = Reaper(everything=False)
    try:
        launched = launcher.launch([sys.executable, "-c", "print('plain')"], dict(os.environ))
        reaper.watch(launched.pid)
        assert reaper.wait(launched.pid, 30) is not None
        launched.drain(5)
        assert not launched.warm
        assert launcher.spare_pids() == (), "no standby for a command it cannot stand in for"
        assert "plain" in tail.text()
    finally:
        launcher.close()
        reaper.close()
