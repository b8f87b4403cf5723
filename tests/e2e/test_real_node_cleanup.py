"""The real node leaves the host as it found it: after a normal stop, and after a SIGKILL of
the process that ran it once the next run has restored what it left.

Each case runs the standalone runner (`python -m support.realnode`) with a pod running in a
real container, so containerd's shims and the container's processes exist when it stops:
they leave the runner's process group and session, so only the node's cgroup finds them.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support.realnode.hoststate import CGROUP_PREFIX
from support.realnode.leftovers import HostSnapshot, find_leftovers
from support.realnode.requirements import node_binaries, unavailable_reason

pytestmark = pytest.mark.realnode

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def runner_env() -> dict[str, str]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no real node on this machine: {reason}")
    return dict(os.environ, PYTHONPATH=str(TESTS))


def _start(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """The runner, once it printed that its node is Ready (its first stdout line)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "support.realnode", "--images=base"], env=env, cwd=TESTS, text=True,
        stdout=subprocess.PIPE, stderr=log.open("w"),
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 300)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the runner printed nothing:\n{log.read_text()[-3000:]}")
    return proc, json.loads(line)


def _run_a_pod(info: dict[str, Any], kubectl: str) -> None:
    base = f"--kubeconfig={info['kubeconfig']}"
    image = info["images"]["base"]
    subprocess.run([kubectl, base, "run", "sleeper", f"--image={image}", "--restart=Never",
                    "--", "sleep", "infinity"], check=True, capture_output=True)  # fmt: skip
    waited = subprocess.run(
        [kubectl, base, "wait", "--for=condition=Ready", "pod/sleeper", "--timeout=90s"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr


@pytest.fixture
def kubectl(runner_env: dict[str, str]) -> str:
    return str(node_binaries() / "kubectl")


@pytest.mark.timeout(900)
def test_a_stopped_node_leaves_nothing(
    runner_env: dict[str, str], kubectl: str, tmp_path: Path
) -> None:
    before = HostSnapshot.take()
    proc, info = _start(runner_env, tmp_path / "runner.log")
    try:
        _run_a_pod(info, kubectl)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode == 0, (tmp_path / "runner.log").read_text()[-3000:]
    assert find_leftovers(before, info["node_id"], info["workdir"]) == []


@pytest.mark.timeout(900)
def test_a_sigkilled_node_is_restored_by_the_next_run(
    runner_env: dict[str, str], kubectl: str, tmp_path: Path
) -> None:
    before = HostSnapshot.take()
    proc, info = _start(runner_env, tmp_path / "runner.log")
    try:
        _run_a_pod(info, kubectl)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    time.sleep(1)
    left = find_leftovers(before, info["node_id"], info["workdir"])
    # The container and its shim outlive the runner (not in its process group or session).
    assert any(CGROUP_PREFIX in line and "pid" in line for line in left), left
    restored = subprocess.run([sys.executable, "-m", "support.realnode", "--restore"],
                              env=runner_env, cwd=TESTS, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
    assert restored.returncode == 0, restored.stderr
    assert find_leftovers(before, info["node_id"], info["workdir"]) == []
