"""Forks training-like children that restore, then save every step until SIGKILLed.

Importing torch once and forking per run keeps 50+ kill rounds fast.  Commands on stdin:
`run <attempt>` prints the child's pid; `reap <pid>` waits for it and prints its status.
Each child writes restored-<attempt>.json after a restore that matched the reference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from ckpt_reference import empty_app, empty_cursor, matches, reference, reference_cursor

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager


def run(attempt: int, local: Path, pfs: Path, out: Path) -> int:
    torch.set_num_threads(1)
    app, cursor = empty_app(), empty_cursor()
    config = CheckpointConfig(
        local, pfs, attempt, "n0", keep_local=2, keep_pfs=2, replication_retry_s=0.05
    )
    manager = CheckpointManager(config, {"app": app}, {"cursor": cursor})
    restored = manager.restore()
    step = restored.step if restored else 0
    if restored is not None and not (
        matches(app, reference(step)) and matches(cursor, reference_cursor(step))
    ):
        return 3
    record = {"step": step, "source": restored.source if restored else None}
    (out / f"restored-{attempt}.json").write_text(json.dumps(record))
    while True:
        step += 1
        app.state = reference(step)
        cursor.state = reference_cursor(step)
        manager.save(step, stable=step % 3 != 0, spike_marker=step % 11 == 0)


def main() -> None:
    local, pfs, out = (Path(arg) for arg in sys.argv[1:4])
    for line in sys.stdin:
        command, value = line.split()
        if command == "run":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = run(int(value), local, pfs, out)
                finally:
                    os._exit(code)
            print(pid, flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(value), 0)
            print(status, flush=True)


if __name__ == "__main__":
    main()
