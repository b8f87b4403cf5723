"""2 nodes x 1 rank over gloo, separate local tiers, one PFS: restores are bit-exact whichever
tier they come from, and a damaged copy is passed over for the other tier."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from stabletrain_agent.checkpoint.layout import local_copy_dir, local_part_root
from support.processes import ManagedProcess, free_port

HERE = Path(__file__).parent
TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun(
    base: Path, mode: str, attempt: int, per_node: int = 1, *, one_node: bool = False
) -> list[dict[str, Any]]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    process = ManagedProcess(
        f"torchrun-{mode}-{attempt}",
        [
            str(TORCHRUN),
            "--nnodes=1",
            f"--nproc-per-node={2 * per_node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            str(HERE / "two_node_worker.py"),
            mode,
            str(base),
            str(attempt),
            str(per_node),
            *(["shared"] if one_node else []),
        ],
        base / f"torchrun-{mode}-{attempt}.log",
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while process.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process.alive(), f"torchrun timed out:\n{process.log_tail()}"
        assert process.popen.returncode == 0, process.log_tail()
    finally:
        process.stop()
    return [
        json.loads((base / f"{mode}-{attempt}-rank{r}.json").read_text())
        for r in range(2 * per_node)
    ]


def assert_bit_exact(expected: Any, actual: Any, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert expected.dtype == actual.dtype, where
        assert torch.equal(expected, actual), where
    elif isinstance(expected, dict):
        assert set(expected) == set(actual), where
        for key in expected:
            assert_bit_exact(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert len(expected) == len(actual), where
        for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_bit_exact(e, a, f"{where}[{index}]")
    else:
        assert expected == actual, where


def compare(base: Path, attempt: int, ranks: int = 2) -> None:
    for rank in range(ranks):
        saved = torch.load(base / f"save-1-rank{rank}.pt", weights_only=False)
        restored = torch.load(base / f"restore-{attempt}-rank{rank}.pt", weights_only=False)
        assert_bit_exact(saved, restored, f"rank{rank}")


def test_restore_from_pfs_after_wipe_from_other_tier_after_bitflip_and_from_local_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "pfs").mkdir()
    torchrun(tmp_path, "save", 1)
    saved0 = torch.load(tmp_path / "save-1-rank0.pt", weights_only=False)
    saved1 = torch.load(tmp_path / "save-1-rank1.pt", weights_only=False)
    assert_bit_exact(saved0["model"], saved1["model"])  # replicated state on both nodes
    assert saved0["cursor"] != saved1["cursor"]  # per-rank state differs per rank

    shutil.rmtree(tmp_path / "local-n1")  # node n1 lost its local disk
    reports = torchrun(tmp_path, "restore", 2)
    assert [(r["step"], r["source"]) for r in reports] == [(3, "local"), (3, "pfs")]
    compare(tmp_path, 2)
    reseeded = local_copy_dir(local_part_root(tmp_path / "local-n1", "1"), 3, 1)
    assert reseeded.is_dir()  # re-seeded from the PFS

    node0 = local_copy_dir(local_part_root(tmp_path / "local-n0", "0"), 3, 1)
    shard = next(node0.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    reports = torchrun(tmp_path, "restore", 3)
    assert [(r["step"], r["source"]) for r in reports] == [(3, "pfs"), (3, "local")]
    assert "fails its crc32 check" in " ".join(reports[0]["rejected"])
    compare(tmp_path, 3)

    (tmp_path / "pfs").rename(tmp_path / "pfs-gone")  # local tiers alone
    reports = torchrun(tmp_path, "restore", 4)
    assert [(r["step"], r["source"]) for r in reports] == [(3, "local"), (3, "local")]
    compare(tmp_path, 4)


def test_two_nodes_of_two_ranks_each_node_holds_what_its_ranks_need(tmp_path: Path) -> None:
    """DCP writes a replicated key once per process group: over per-node groups, each node's
    local tier holds the full model and optimizer plus its own ranks' per-rank state."""
    (tmp_path / "pfs").mkdir()
    torchrun(tmp_path, "save", 1, per_node=2)
    shutil.rmtree(tmp_path / "local-n1")
    reports = torchrun(tmp_path, "restore", 2, per_node=2)
    assert [r["source"] for r in reports] == ["local", "local", "pfs", "pfs"]
    compare(tmp_path, 2, ranks=4)


def test_two_pods_on_one_node_share_its_local_volume_and_keep_their_copies_apart(
    tmp_path: Path,
) -> None:
    """Two pods of a job on one node (a hostPath local tier): each commits its own part of
    every step under its node rank, so neither save fails and both restore locally."""
    (tmp_path / "pfs").mkdir()
    torchrun(tmp_path, "save", 1, one_node=True)  # a save that failed fails its worker
    shared = tmp_path / "local-n-shared"
    assert sorted(p.name for p in shared.iterdir()) == ["node-0", "node-1"]
    reports = torchrun(tmp_path, "restore", 2, one_node=True)
    assert [(r["step"], r["source"], r["rejected"]) for r in reports] == [(3, "local", [])] * 2
    compare(tmp_path, 2)
