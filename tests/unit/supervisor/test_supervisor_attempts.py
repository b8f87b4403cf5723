"""The supervisor's attempts with real processes (small Python scripts as the job's command):
the first attempt, an attempt that ends on its own, a stop that must KILL, the next attempt
with its own environment and directives, fencing, and the pod's TERM."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabletrain_agent.supervisor.attempts import Attempts, AttemptSettings
from stabletrain_agent.supervisor.launch import ColdLauncher
from stabletrain_agent.supervisor.output import Tail
from stabletrain_agent.supervisor.processes import Reaper, descendants
from stabletrain_contract import env
from stabletrain_contract.directives import Directives
from stabletrain_contract.supervisor import ProcessState, StartOrder, StopOrder

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    out = os.environ["OUT_DIR"]
    attempt = os.environ["STABLETRAIN_ATTEMPT"]
    keys = ("STABLETRAIN_ATTEMPT", "PET_RDZV_ID", "PET_RDZV_ENDPOINT", "PET_MASTER_ADDR",
            "STABLETRAIN_DIRECTIVES_PATH", "STABLETRAIN_AGENT_PORT",
            "STABLETRAIN_AGENT_BIND_ADDRESS")
    with open(os.path.join(out, f"env-{attempt}.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
    mode = os.environ.get("MODE_" + attempt, "sleep")
    print(f"worker of attempt {attempt}: {mode}", flush=True)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "crash":
        print("train.py: error: unrecognized arguments: --nope", file=sys.stderr, flush=True)
        sys.exit(2)
    if mode == "trip":
        with open(os.environ["STABLETRAIN_TERMINATION_MESSAGE_PATH"], "w") as f:
            f.write('{"tripped": true}')
        sys.exit(1)
    if mode == "done":
        sys.exit(0)
    time.sleep(600)
    """
)


def directives(attempt: int) -> Directives:
    return Directives(generation=attempt + 1, attempt=attempt, resume_step=10 * attempt)


def start(attempt: int, grace: float = 5.0) -> StartOrder:
    return StartOrder(
        directives=directives(attempt),
        rendezvous_endpoint="job-a0-0.job.ns.svc:29400",
        rendezvous_id=f"job-{attempt}",
        master_addr="job-a0-0.job.ns.svc",
        grace_seconds=grace,
    )


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[tuple[Attempts, Path, dict[str, str]]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    first = tmp_path / "directives-a0.json"
    first.write_text(directives(0).to_json())
    environment = {
        **os.environ,
        "OUT_DIR": str(tmp_path),
        env.ATTEMPT: "0",
        env.DIRECTIVES_PATH: str(first),
        env.TERMINATION_MESSAGE_PATH: str(tmp_path / "termination-log"),
    }
    settings = AttemptSettings(
        argv=(sys.executable, str(script)),
        base_env=environment,
        local_agent_port=19401,
        run_dir=tmp_path / "run",
        termination_path=tmp_path / "termination-log",
        default_grace=5.0,
    )
    reaper = Reaper(everything=False)
    tail = Tail(4096)
    attempts = Attempts(settings, ColdLauncher(tail), reaper, tail)
    yield attempts, tmp_path, environment
    attempts.terminate(0.0)
    reaper.close()
    assert descendants(os.getpid()) == [], "every process of every attempt is gone"


def wait_for(attempts: Attempts, check: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check(attempts.report(agent_answered=False)):  # type: ignore[operator]
        assert time.monotonic() < deadline, attempts.report(agent_answered=False)
        attempts.wait_changed(0.1)


def test_the_first_attempt_runs_with_the_pods_env_and_the_agent_behind_the_supervisor(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    attempts, out, _ = pod
    attempts.start_first()
    wait_for(attempts, lambda r: (out / "env-0.json").exists())
    seen = (out / "env-0.json").read_text()
    assert '"STABLETRAIN_AGENT_PORT": "19401"' in seen
    assert '"STABLETRAIN_AGENT_BIND_ADDRESS": "127.0.0.1"' in seen
    report = attempts.report(agent_answered=False)
    assert (report.attempt, report.state, report.attempts_started) == (0, "Running", 1)
    assert attempts.directives() == directives(0)
    assert attempts.ready()


def test_an_attempt_that_ends_on_its_own_is_reported_with_its_last_words(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    attempts, _, environment = pod
    environment["MODE_0"] = "crash"
    attempts.start_first()
    wait_for(attempts, lambda r: r.state is ProcessState.EXITED)
    report = attempts.report(agent_answered=False)
    assert report.exit_code == 2
    assert "train.py: error: unrecognized arguments: --nope" in report.message
    assert not attempts.ready(), "the readiness probe is what tells the kubelet"
    assert not attempts.completed()


def test_a_trip_report_left_in_the_termination_file_is_the_message(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    attempts, _, environment = pod
    environment["MODE_0"] = "trip"
    attempts.start_first()
    wait_for(attempts, lambda r: r.state is ProcessState.EXITED)
    assert attempts.report(agent_answered=False).message == '{"tripped": true}'


def test_the_next_attempt_starts_after_a_stop_that_had_to_kill(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    attempts, out, environment = pod
    environment["MODE_0"] = "ignore-term"
    attempts.start_first()
    wait_for(attempts, lambda r: (out / "env-0.json").exists())
    began = time.monotonic()
    accepted, _ = attempts.order_start(start(1, grace=0.5))
    assert accepted
    wait_for(attempts, lambda r: r.attempt == 1 and (out / "env-1.json").exists())
    assert time.monotonic() - began < 5, "KILL came after the 0.5 s grace period"
    seen = (out / "env-1.json").read_text()
    assert '"PET_RDZV_ID": "job-1"' in seen
    assert '"PET_RDZV_ENDPOINT": "job-a0-0.job.ns.svc:29400"' in seen
    written = out / "run" / "directives-a1.json"
    assert f'"STABLETRAIN_DIRECTIVES_PATH": "{written}"' in seen
    assert Directives.model_validate_json(written.read_text()) == directives(1)
    report = attempts.report(agent_answered=False)
    assert (report.state, report.attempts_started) == (ProcessState.RUNNING, 2)
    # Fencing: an order for the attempt this pod left behind is refused; a repeat is a no-op.
    assert attempts.order_start(start(0))[0] is False
    assert attempts.order_stop(StopOrder(attempt=0))[0] is False
    assert attempts.order_start(start(1)) == (True, "attempt 1 already ordered")
    assert attempts.report(agent_answered=False).attempts_started == 2


def test_a_stop_order_ends_the_attempt_and_the_pods_term_ends_the_supervisor(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    attempts, out, _ = pod
    attempts.start_first()
    wait_for(attempts, lambda r: (out / "env-0.json").exists())
    assert attempts.order_stop(StopOrder(attempt=0, grace_seconds=5))[0]
    wait_for(attempts, lambda r: r.state is ProcessState.STOPPED)
    assert attempts.ready(), "a stop that was ordered is not news for the kubelet"
    assert attempts.report(agent_answered=False).exit_code == 128 + 15
    assert descendants(os.getpid()) == []
    assert attempts.terminate(1.0) == 143


def test_training_complete_ends_the_container_with_exit_code_0(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    attempts, _, environment = pod
    environment["MODE_0"] = "done"
    attempts.start_first()
    wait_for(attempts, lambda r: r.state is ProcessState.EXITED)
    assert attempts.completed()


def test_a_start_still_queued_when_the_pod_goes_never_runs(
    pod: tuple[Attempts, Path, dict[str, str]],
) -> None:
    """The pod's TERM drops the orders not yet carried out: the next attempt's processes
    never start after it (they would outlive the supervisor outside a container)."""
    attempts, out, _ = pod
    attempts.start_first()
    wait_for(attempts, lambda r: (out / "env-0.json").exists())
    assert attempts.order_start(start(1, grace=1.0))[0]
    attempts.terminate(0.0)
    time.sleep(3.0)  # the orders' worker carries out what was queued: the stop, the start
    assert not (out / "env-1.json").exists(), "attempt 1 started after the pod's TERM"
    assert descendants(os.getpid()) == []
