"""Today's torchrun writes what the failure-cause test data holds.

tests/unit/operator/test_failure_cause.py judges captured torchrun logs; these run the same
commands again (a script rejecting an argument, one raising at start) and read the fresh
output with the same function, so a torch upgrade that changes torchrun's summary shows up
here rather than as a crash loop quoting the launcher again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from stabletrain_operator.observe.failure_cause import FailureCause, failure_cause
from support.processes import ManagedProcess

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
WORKLOADS = REPO / "tests" / "support" / "workloads"
RUN_TIMEOUT = 120.0


def torchrun_output(tmp_path: Path, *script: str) -> str:
    log = tmp_path / "torchrun.log"
    run = ManagedProcess(
        "torchrun",
        [str(TORCHRUN), "--standalone", "--nnodes", "1", "--nproc-per-node", "1", *script],
        log,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while run.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not run.alive(), f"torchrun still runs after {RUN_TIMEOUT} s"
        assert run.popen.returncode == 1, "torchrun exits 1 whatever the rank's code"
    finally:
        run.stop()
    return log.read_text()


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            ("examples/tiny-gpt/train.py", "--no-such-flag"),
            FailureCause(("train.py: error: unrecognized arguments: --no-such-flag",), 2, 0),
        ),
        (
            (str(WORKLOADS / "raises_at_start.py"),),
            FailureCause(
                (
                    "ValueError: tokenizer file /data/vocab.json has 0 entries; "
                    "expected a vocabulary",
                ),
                1,
                0,
            ),
        ),
    ],
    ids=["bad-argument", "exception"],
)
def test_a_fresh_torchrun_failure_names_the_rank_s_error(
    tmp_path: Path, script: tuple[str, ...], expected: FailureCause
) -> None:
    output = torchrun_output(tmp_path, *script)
    assert "ChildFailedError" in output, output
    assert failure_cause(output) == expected
