"""A pod of attempt 1 that keeps running after attempt 2 started must not complete anything."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ckpt_copies import KEY, write_copy

from stabletrain_agent.checkpoint.commit import commit_copy
from stabletrain_agent.checkpoint.fence import StaleAttemptError, advance_fence
from stabletrain_agent.checkpoint.inventory_scan import (
    VerifyCache,
    build_records,
    combined_fence,
    scan_local,
    scan_pfs,
)
from stabletrain_agent.checkpoint.layout import MANIFEST_NAME, local_temp_dir, pfs_part_dir
from stabletrain_agent.checkpoint.replicate import replicate_copy

NODES = ("n0", "n1")


def pfs_complete(pfs: Path, n0_local: Path) -> dict[tuple[int, int], bool]:
    cache = VerifyCache(KEY)
    records = build_records(
        "n0", scan_local(n0_local, "n0", cache), scan_pfs(pfs, cache), combined_fence([pfs])
    )
    return {(r.step, r.attempt): r.pfs.verified for r in records}


def test_stale_writer_cannot_complete_new_attempts_checkpoint(tmp_path: Path) -> None:
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    n0, lost = tmp_path / "n0", tmp_path / "lost-node"
    advance_fence(pfs, attempt=1, resume_step=0)
    write_copy(lost, 200, attempt=1, node="n1", nodes=NODES)  # the stale pod's own copy

    advance_fence(pfs, attempt=2, resume_step=100)  # attempt 2 rolled back to step 100
    write_copy(n0, 200, attempt=2, node="n0", nodes=NODES)
    replicate_copy(n0, pfs, 200, 2, "n0", key=KEY)  # n1 of attempt 2 has not replicated yet

    with pytest.raises(StaleAttemptError, match="attempt 1 is superseded by attempt 2"):
        replicate_copy(lost, pfs, 200, 1, "n1", key=KEY)
    assert pfs_complete(pfs, n0) == {(200, 2): False}

    # Even if the stale writer won the race against the fence check, its part lands under
    # attempt 1, and attempt 1's step 200 lies after attempt 2's resume step: off lineage.
    shutil.copytree(lost / "step-0000000200" / "attempt-1", pfs_part_dir(pfs, 200, 1, "n1"))
    assert pfs_complete(pfs, n0) == {(200, 2): False}

    # Forging the path does not help: the manifest carries the writer's attempt.
    forged = pfs_part_dir(pfs, 200, 2, "n1")
    shutil.copytree(lost / "step-0000000200" / "attempt-1", forged)
    assert pfs_complete(pfs, n0) == {(200, 2): False}
    raw = json.loads((forged / MANIFEST_NAME).read_text())
    assert raw["attempt"] == 1


def test_stale_writer_cannot_commit_locally_after_the_fence(tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    advance_fence(local, attempt=2, resume_step=100)
    temp = local_temp_dir(local, 200, 1)
    temp.mkdir(parents=True)
    (temp / "__0_0.distcp").write_bytes(b"x" * 10)
    with pytest.raises(StaleAttemptError):
        commit_copy(
            temp,
            local,
            key=KEY,
            step=200,
            attempt=1,
            node="n0",
            nodes=("n0",),
            ranks=(0,),
            world_size=1,
            stable=True,
        )
    assert not (local / "step-0000000200" / "attempt-1").exists()
