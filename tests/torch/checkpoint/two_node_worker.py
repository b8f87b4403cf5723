"""One rank of a 2-node job (gloo on 127.0.0.1) with argv[4] ranks per node; each group of
ranks plays a node with its own local tier (or, with argv[5] "shared", both groups are pods
on one node and share its local tier).  `save` trains a data-parallel model a few
steps and checkpoints it; `restore` starts from a differently initialised model and
restores.  Both dump what they hold."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ckpt_reference import Holder

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.states import ModelOptimizerState, RngState

STEPS = 3


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cursor: Holder) -> Any:
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "cursor": dict(cursor.state),
        "next_random": torch.rand(8),  # draws from the (restored) per-rank generator
    }


def main() -> None:
    mode, base, attempt = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    per_node = int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    node_rank = rank // per_node
    # One node for both pods (argv[5] "shared"): one node name, one local volume.
    node = "n-shared" if sys.argv[5:] == ["shared"] else f"n{node_rank}"
    model, optimizer = build(seed=0 if mode == "save" else 999 + rank)
    cursor = Holder({"samples": -1, "shard": ""})
    config = CheckpointConfig(base / f"local-{node}", base / "pfs", attempt, node, node_rank)
    manager = CheckpointManager(
        config,
        {"train": ModelOptimizerState(model, optimizer)},
        {"rng": RngState(), "cursor": cursor},
    )
    if mode == "save":
        assert manager.restore() is None
        torch.manual_seed(100 + rank)  # different data and RNG streams per rank
        for step in range(1, STEPS + 1):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            for parameter in model.parameters():  # data-parallel: replicated weights
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad)
                parameter.grad /= dist.get_world_size()
            optimizer.step()
            cursor.state = {"samples": 8 * step + 1000 * rank, "shard": f"shard-{rank}"}
        manager.save(STEPS, stable=True)
        manager.wait()
        flushed = manager.flush(30)
        assert not flushed.timed_out, flushed
        dist.barrier()
        report: dict[str, Any] = {"step": STEPS}
    else:
        result = manager.restore()
        assert result is not None
        report = {"step": result.step, "source": result.source, "rejected": result.rejected}
    torch.save(snapshot(model, optimizer, cursor), base / f"{mode}-{attempt}-rank{rank}.pt")
    (base / f"{mode}-{attempt}-rank{rank}.json").write_text(json.dumps(report))
    manager.close()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
