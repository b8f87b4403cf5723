"""PFS read-only, then removed: training keeps saving locally, the condition says why, and
when the PFS is back replication catches up with what the local retention kept (the newest
copies and the newest already on the PFS).  Read-only is a real read-only bind mount in a
private mount namespace (root ignores directory permissions, so chmod would prove nothing)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from support.processes import ManagedProcess

HERE = Path(__file__).parent


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root")
def test_saves_continue_condition_exposed_replication_catches_up(tmp_path: Path) -> None:
    (tmp_path / "pfs").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "PYTHONWARNINGS": "ignore",
    }
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        str(HERE / "pfs_outage_child.py"),
        str(tmp_path),
    ]
    child = ManagedProcess("pfs-outage", argv, tmp_path / "child.log", env=env)
    try:
        deadline = time.monotonic() + 120
        while child.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not child.alive(), f"timed out:\n{child.log_tail()}"
        assert child.popen.returncode == 0, child.log_tail()
    finally:
        child.stop()
    line = next(
        text for text in (tmp_path / "child.log").read_text().splitlines() if text.startswith("{")
    )
    seen = json.loads(line)
    print("\n" + json.dumps(seen, indent=1))
    assert seen["healthy_saved"] == [True, True]
    assert seen["healthy_flush"]
    assert seen["readonly_saved"] == [True, True, True]
    assert seen["readonly_flush_timed_out"]
    assert seen["readonly_condition"][0] is False
    assert "Read-only file system" in seen["readonly_condition"][1]
    # Retention 3: the newest two, waiting for the PFS, and the newest copy already on it.
    assert seen["readonly_local"] == [2, 4, 5]
    assert seen["after_readonly_flush"]
    assert seen["after_readonly_condition"] is True
    # Step 3 made way for step 2 before the PFS was back: the newest reach it.
    assert seen["after_readonly_pfs"] == [1, 2, 4, 5]
    assert seen["removed_saved"] == [True, True, True]
    assert seen["removed_flush_timed_out"]
    assert seen["removed_condition"][0] is False
    assert "not there" in seen["removed_condition"][1]
    assert seen["removed_not_recreated"]
    assert seen["removed_local"] == [5, 7, 8]
    assert seen["after_removed_flush"]
    assert seen["after_removed_condition"] is True
    assert seen["final_pfs"] == [1, 2, 4, 5, 7, 8]
