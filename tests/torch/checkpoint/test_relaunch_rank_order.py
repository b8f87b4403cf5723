"""Two pods, each its own torchrun with c10d rendezvous: after a relaunch the rendezvous
may hand the pods other global ranks, and every pod must still get back its own per-rank
state (RNG, data cursor) from its node's local copy, bit-exact.

c10d orders the participants by their node descriptor, whose first field is torchrun's
`--local-addr`, so two loopback addresses decide the global ranks deterministically:
swapping them between the save and the restore swaps the global ranks while the node
ranks (STABLETRAIN_NODE_RANK, what the operator sets per pod) stay put.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from test_two_nodes import assert_bit_exact

from stabletrain_agent.checkpoint.layout import local_copy_dir, local_part_root
from stabletrain_contract import env
from support.processes import ManagedProcess, free_port

HERE = Path(__file__).parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
NODES = ("node-a", "node-b")
"""Kubernetes node of node rank 0 and 1; each pod returns to its node (preferred affinity)."""


def relaunch(base: Path, mode: str, attempt: int, local_addrs: tuple[str, str]) -> list[Any]:
    """Both pods of one attempt; `local_addrs[n]` is node rank n's rendezvous address."""
    port = free_port()
    processes = []
    try:
        for node_rank, node in enumerate(NODES):
            pod_env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                "OMP_NUM_THREADS": "1",
                "PYTHONWARNINGS": "ignore",
                env.LOCAL_CHECKPOINT_DIR: str(base / f"local-{node}"),
                env.PFS_CHECKPOINT_DIR: str(base / "pfs"),
                env.ATTEMPT: str(attempt),
                env.NODE_NAME: node,
                env.NODE_RANK: str(node_rank),
            }
            command = [
                str(TORCHRUN),
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id=relaunch-{attempt}",
                f"--local-addr={local_addrs[node_rank]}",
                str(HERE / "relaunch_worker.py"),
                mode,
                str(base),
            ]
            log = base / f"torchrun-{mode}-{attempt}-{node}.log"
            processes.append(ManagedProcess(f"{mode}-{attempt}-{node}", command, log, env=pod_env))
        deadline = time.monotonic() + 120
        while any(p.alive() for p in processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for process in processes:
            assert not process.alive(), f"torchrun timed out:\n{process.log_tail()}"
            assert process.popen.returncode == 0, process.log_tail()
    finally:
        for process in processes:
            process.stop()
    return [json.loads((base / f"{mode}-{attempt}-node{n}.json").read_text()) for n in range(2)]


def test_relaunch_with_swapped_global_ranks_restores_each_pods_own_state(tmp_path: Path) -> None:
    (tmp_path / "pfs").mkdir()
    saved = relaunch(tmp_path, "save", 1, ("127.0.0.1", "127.0.0.2"))
    assert [r["rank"] for r in saved] == [0, 1]

    restored = relaunch(tmp_path, "restore", 2, ("127.0.0.2", "127.0.0.1"))
    assert [r["rank"] for r in restored] == [1, 0]  # the rendezvous swapped the global ranks
    assert [(r["step"], r["source"], r["rejected"]) for r in restored] == [(3, "local", [])] * 2
    for node_rank in range(2):
        before = torch.load(tmp_path / f"save-1-node{node_rank}.pt", weights_only=False)
        after = torch.load(tmp_path / f"restore-2-node{node_rank}.pt", weights_only=False)
        assert_bit_exact(before, after, f"node{node_rank}")
    first = torch.load(tmp_path / "restore-2-node0.pt", weights_only=False)
    second = torch.load(tmp_path / "restore-2-node1.pt", weights_only=False)
    assert first["cursor"] != second["cursor"]  # per-pod state really differs
    assert not torch.equal(first["next_random"], second["next_random"])


def test_pods_that_swap_nodes_restore_their_own_part_from_the_pfs(tmp_path: Path) -> None:
    """A relaunched pod that lands on the other pod's node finds no copy of its own node
    rank on that node's local tier (the other's stays apart, untouched): it takes its own
    part from the PFS instead."""
    (tmp_path / "pfs").mkdir()
    relaunch(tmp_path, "save", 1, ("127.0.0.1", "127.0.0.2"))
    (tmp_path / "local-node-a").rename(tmp_path / "local-swap")
    (tmp_path / "local-node-b").rename(tmp_path / "local-node-a")
    (tmp_path / "local-swap").rename(tmp_path / "local-node-b")

    restored = relaunch(tmp_path, "restore", 2, ("127.0.0.1", "127.0.0.2"))
    assert [(r["step"], r["source"]) for r in restored] == [(3, "pfs")] * 2
    for node_rank in range(2):
        before = torch.load(tmp_path / f"save-1-node{node_rank}.pt", weights_only=False)
        after = torch.load(tmp_path / f"restore-2-node{node_rank}.pt", weights_only=False)
        assert_bit_exact(before, after, f"node{node_rank}")
    for node in NODES:  # each local tier now holds both node ranks' copies, apart
        for part in ("0", "1"):
            assert local_copy_dir(local_part_root(tmp_path / f"local-{node}", part), 3, 1).is_dir()
