"""One pod of a 2-pod job started by its own torchrun (c10d rendezvous on loopback).

The environment is what the operator gives a pod (tiers, attempt, node name, node rank);
the global rank is whatever the rendezvous hands out.  `save` trains a data-parallel model a
few steps with per-pod data and RNG streams and checkpoints it; `restore` starts from a
differently initialised model and restores.  Both dump what they hold under the node rank,
the identity that survives a relaunch, together with the global rank they got.
"""

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
from stabletrain_contract import env

STEPS = 3


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    node_rank = int(os.environ[env.NODE_RANK])
    attempt = int(os.environ[env.ATTEMPT])
    torch.manual_seed(0 if mode == "save" else 999 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cursor = Holder({"samples": -1, "shard": ""})
    manager = CheckpointManager(
        CheckpointConfig.from_env(),
        {"train": ModelOptimizerState(model, optimizer)},
        {"rng": RngState(), "cursor": cursor},
    )
    report: dict[str, Any] = {"rank": rank, "node_rank": node_rank}
    if mode == "save":
        assert manager.restore() is None
        torch.manual_seed(100 + node_rank)  # each pod its own data and RNG stream
        for step in range(1, STEPS + 1):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            for parameter in model.parameters():
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad)
                parameter.grad /= dist.get_world_size()
            optimizer.step()
            cursor.state = {"samples": 8 * step + 1000 * node_rank, "shard": f"shard-{node_rank}"}
        manager.save(STEPS, stable=True)
        manager.wait()
        flushed = manager.flush(30)
        assert not flushed.timed_out, flushed
        dist.barrier()
        report["step"] = STEPS
    else:
        result = manager.restore()
        assert result is not None
        report.update(step=result.step, source=result.source, rejected=list(result.rejected))
    snapshot = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "cursor": dict(cursor.state),
        "next_random": torch.rand(8),  # draws from the (restored) per-pod generator
    }
    torch.save(snapshot, out / f"{mode}-{attempt}-node{node_rank}.pt")
    (out / f"{mode}-{attempt}-node{node_rank}.json").write_text(json.dumps(report))
    manager.close()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
