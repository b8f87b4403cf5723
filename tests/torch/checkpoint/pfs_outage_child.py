"""Runs inside a private mount namespace (unshare -m): saves while the PFS is read-only and
while it is gone, then brings it back.  Prints one JSON line of observations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from ckpt_reference import Holder, reference

from stabletrain_agent.checkpoint.layout import local_copy_dir
from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,bind,{mode}", str(path)], check=True)


def save(manager: CheckpointManager, holder: Holder, step: int) -> bool:
    holder.state = reference(step)
    manager.save(step, stable=True)
    manager.wait()
    return local_copy_dir(manager.config.local_dir, step, 1).is_dir()


def pfs_steps(manager: CheckpointManager) -> list[int]:
    return [record.step for record in manager.inventory() if record.pfs.verified]


def local_steps(manager: CheckpointManager) -> list[int]:
    return [s for s in range(1, 9) if local_copy_dir(manager.config.local_dir, s, 1).is_dir()]


def main() -> None:
    base = Path(sys.argv[1])
    local, pfs = base / "local", base / "pfs"
    subprocess.run(["mount", "--bind", str(pfs), str(pfs)], check=True)
    torch.set_num_threads(1)
    holder = Holder(reference(0))
    config = CheckpointConfig(
        local, pfs, 1, "n0", keep_local=3, keep_pfs=8, replication_retry_s=0.1
    )
    manager = CheckpointManager(config, {"app": holder})
    manager.restore()
    seen: dict[str, Any] = {}
    seen["healthy_saved"] = [save(manager, holder, step) for step in (1, 2)]
    seen["healthy_flush"] = not manager.flush(30).timed_out

    remount(pfs, "ro")
    seen["readonly_saved"] = [save(manager, holder, step) for step in (3, 4, 5)]
    seen["readonly_flush_timed_out"] = manager.flush(1).timed_out
    seen["readonly_condition"] = [manager.pfs_condition.available, manager.pfs_condition.message]
    seen["readonly_local"] = local_steps(manager)
    remount(pfs, "rw")
    seen["after_readonly_flush"] = not manager.flush(30).timed_out
    seen["after_readonly_condition"] = manager.pfs_condition.available
    seen["after_readonly_pfs"] = pfs_steps(manager)

    away = base / "pfs-away"
    subprocess.run(["umount", str(pfs)], check=True)
    pfs.rename(away)
    seen["removed_saved"] = [save(manager, holder, step) for step in (6, 7, 8)]
    seen["removed_flush_timed_out"] = manager.flush(1).timed_out
    seen["removed_condition"] = [manager.pfs_condition.available, manager.pfs_condition.message]
    seen["removed_not_recreated"] = not pfs.exists()
    seen["removed_local"] = local_steps(manager)
    away.rename(pfs)
    seen["after_removed_flush"] = not manager.flush(30).timed_out
    seen["after_removed_condition"] = manager.pfs_condition.available
    seen["final_pfs"] = pfs_steps(manager)
    manager.close()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
