"""Processes that not even SIGKILL ends, for as long as a test needs them: the cgroup v1
freezer. A frozen task does not run, so a KILL sent to it stays pending until it is thawed,
as a process stuck in uninterruptible sleep (a hung driver or file system) would. The
processes are always thawed on the way out, so the KILLs land and nothing is left."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

FREEZER = Path("/sys/fs/cgroup/freezer")


def available() -> str | None:
    """None when freezing works here, else why not."""
    if not (FREEZER / "tasks").exists():
        return f"no cgroup v1 freezer at {FREEZER}"
    return None


@contextlib.contextmanager
def frozen(pids: Iterable[int]) -> Iterator[Path]:
    group = FREEZER / f"stabletrain-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (group / "tasks").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        tasks = group / "tasks"
        for task in tasks.read_text().split():
            with contextlib.suppress(OSError):
                (FREEZER / "tasks").write_text(task)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
