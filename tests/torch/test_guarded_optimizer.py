"""The framework adapters' step: the framework calls optimizer.step(closure), the guard decides.

A plain torch optimizer stands in for the one Lightning or the HF Trainer steps; what is
checked is what those frameworks rely on: the closure runs once, the update uses the
directives' LR scale only while it runs, a non-finite step never reaches the weights, and
a checkpoint requested from inside a step is declined rather than saved half-way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_agent.integrations.core import FrameworkCheckpoints, GuardedOptimizer
from stabletrain_contract.directives import Directives


def make(lr_scale: float = 0.5) -> tuple[nn.Linear, torch.optim.SGD, Guard]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    directives = Directives(generation=1, attempt=0, lr_scale=lr_scale)
    guard = Guard(model, optimizer, directives=DirectiveSource(0, directives), guard_env=GuardEnv())
    return model, optimizer, guard


def closure_of(
    model: nn.Linear, scale: float = 1.0
) -> tuple[Callable[[], torch.Tensor], list[int]]:
    calls: list[int] = []

    def closure() -> torch.Tensor:
        calls.append(1)
        loss = model(torch.ones(8, 4)).pow(2).mean() * scale
        loss.backward()
        return loss.detach()

    return closure, calls


def test_the_framework_step_runs_the_closure_then_the_guarded_update() -> None:
    model, optimizer, guard = make()
    applied: list[float] = []
    optimizer.register_step_pre_hook(lambda o, *_: applied.append(o.param_groups[0]["lr"]))
    consumed: list[int] = []
    original = optimizer.step
    stepper = GuardedOptimizer(
        optimizer, guard, loss_of=lambda c: c(), before_step=lambda: consumed.append(1)
    )
    before = model.weight.detach().clone()
    closure, calls = closure_of(model)
    optimizer.step(closure)  # what Lightning's precision plugin calls
    assert calls == [1]
    assert consumed == [1], "the step's batch is consumed before the guard records lineage"
    assert applied == [0.05], "the update ran at the directives' LR scale"
    assert optimizer.param_groups[0]["lr"] == 0.1, "and the scheduler's LR is back after it"
    assert not torch.equal(model.weight, before)
    assert guard.global_step == 1
    assert stepper.last_verdict is not None
    stepper.uninstall()
    assert optimizer.step == original


def test_a_non_finite_step_never_reaches_the_weights() -> None:
    model, optimizer, guard = make(lr_scale=1.0)
    GuardedOptimizer(optimizer, guard, loss_of=lambda c: c(), before_step=lambda: None)
    before = model.weight.detach().clone()
    closure, _ = closure_of(model, scale=math.nan)
    optimizer.step(closure)
    assert torch.equal(model.weight, before)
    assert guard.skipped_steps == 1
    assert guard.global_step == 1


def test_a_checkpoint_requested_inside_a_step_is_declined(tmp_path: Path) -> None:
    model, _, _ = make()
    config = CheckpointConfig(tmp_path / "local", tmp_path / "pfs", attempt=0, node="n")
    manager = CheckpointManager(config, {"model": model})
    manager.restore()
    framework = FrameworkCheckpoints(manager)
    try:
        with pytest.raises(RuntimeError, match="between its steps"):
            framework.save(10, stable=True)
        assert framework.inventory() == manager.inventory() == []
        assert framework.is_save_step(manager.config.interval_steps)
    finally:
        manager.close()
