"""A live directive with a newer saveRequest makes the guard save the step it adopts it at,
flush it to the PFS and report it: what spec.suspend waits for before it stops the pods."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_contract.directives import Directives


def test_a_save_request_is_saved_flushed_and_reported_once(tmp_path: Path) -> None:
    """Before: Directives had no save request and the guard never saved by itself, so a
    suspend lost every step since the last interval save. After: the guard saves step 7
    (no interval save there), its copy is complete on the PFS, the status says so, and a
    repeated delivery of the same request saves nothing more."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token="t", node="node-a", node_rank=0)
    guard = Guard(
        model, optimizer, directives=source, exporter=exporter, guard_env=GuardEnv(node="node-a")
    )
    (tmp_path / "pfs").mkdir()
    manager = CheckpointManager(
        CheckpointConfig(tmp_path / "local", tmp_path / "pfs", 0, "node-a"), {"train": guard}
    )
    guard.checkpoints = manager
    assert manager.restore() is None

    def train(steps: int) -> None:
        for _ in range(steps):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()

    train(6)
    assert manager.inventory() == []
    assert exporter.status().saved_request == 0
    base = source.latest()
    assert base is not None
    source.offer(base.model_copy(update={"generation": 2, "save_request": 2}))
    train(1)
    status = exporter.status()
    assert (status.saved_request, status.saved_step) == (2, 7)
    (saved,) = manager.inventory()
    assert (saved.step, saved.stable, saved.pfs.complete, saved.pfs.verified) == (
        7,
        True,
        True,
        True,
    )
    assert [r.step for r in status.inventory] == [7], "the inventory the operator resumes from"

    source.offer(base.model_copy(update={"generation": 3, "save_request": 2}))
    train(2)
    assert [r.step for r in manager.inventory()] == [7], "an answered request is not saved again"
    manager.save(9, stable=True)
    manager.save(9, stable=True)  # the loop's interval save at a step saved on request
    manager.wait()
    assert [r.step for r in manager.inventory()] == [7, 9]
    manager.close()
