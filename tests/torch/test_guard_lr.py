"""The LR scale seen where it matters: in how far plain SGD moves the parameters.

Under SGD without momentum or weight decay one step moves every parameter by exactly
``-lr x grad``, so the LR the optimizer really used can be read back from the weights,
whatever ``param_groups`` claims. The expected LR comes from the schedule's closed form,
independently of the scheduler object.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_agent.lr import LrScale
from stabletrain_contract.directives import Directives
from support.workloads.contract_worker import lr_factor

BASE_LR = 0.1
ETA_MIN = 0.01
T_MAX = 12


def lambda_schedule(epoch: int) -> float:
    return 1.0 / (1.0 + 0.5 * epoch)


def make_lambda(optimizer: torch.optim.Optimizer) -> LRScheduler:
    return LambdaLR(optimizer, lambda_schedule)


def make_cosine(optimizer: torch.optim.Optimizer) -> LRScheduler:
    return CosineAnnealingLR(optimizer, T_max=T_MAX, eta_min=ETA_MIN)


def lambda_lr(step: int) -> float:
    return BASE_LR * lambda_schedule(step - 1)


def cosine_lr(step: int) -> float:
    return ETA_MIN + (BASE_LR - ETA_MIN) * (1 + math.cos(math.pi * (step - 1) / T_MAX)) / 2


SCHEDULES = {
    "LambdaLR": (make_lambda, lambda_lr),
    "CosineAnnealingLR": (make_cosine, cosine_lr),
}


class Run:
    """A model, SGD, the user's scheduler and a guard: one training process."""

    def __init__(self, make_scheduler: Callable[[torch.optim.Optimizer], LRScheduler]) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=BASE_LR)
        self.scheduler = make_scheduler(self.optimizer)
        self.guard: Guard | None = None

    def attach(self, directives: Directives) -> Guard:
        self.guard = Guard(
            self.model,
            self.optimizer,
            scheduler=self.scheduler,
            max_grad_norm=None,
            directives=DirectiveSource(0, directives),
            guard_env=GuardEnv(),
        )
        return self.guard

    def step_and_measure_lr(self, seed: int) -> float:
        """One guarded step; the LR it used, read back from the parameter update."""
        assert self.guard is not None
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(16, 4, generator=generator)
        targets = torch.randn(16, 3, generator=generator)
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        loss.backward()
        before = [p.detach().clone() for p in self.model.parameters()]
        grads = [p.grad.detach().clone() for p in self.model.parameters() if p.grad is not None]
        self.guard.step(loss)
        self.optimizer.zero_grad()
        deltas = torch.cat(
            [
                (p.detach() - b).flatten()
                for p, b in zip(self.model.parameters(), before, strict=True)
            ]
        )
        flat_grads = torch.cat([g.flatten() for g in grads])
        used_lr = float(-(deltas @ flat_grads) / (flat_grads @ flat_grads))
        torch.testing.assert_close(deltas, -used_lr * flat_grads, rtol=1e-4, atol=1e-7)
        return used_lr

    def save(self, path: Path) -> None:
        assert self.guard is not None
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "guard": self.guard.state_dict(),
            },
            path,
        )

    def restore(self, path: Path, *, guard_first: bool) -> None:
        assert self.guard is not None
        state = torch.load(path, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if guard_first:
            self.guard.load_state_dict(state["guard"])
            self.scheduler.load_state_dict(state["scheduler"])
        else:
            self.scheduler.load_state_dict(state["scheduler"])
            self.guard.load_state_dict(state["guard"])


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize(
    "guard_first", [False, True], ids=["scheduler-then-guard", "guard-then-scheduler"]
)
def test_scaled_lr_moves_the_weights_before_and_after_a_restore(
    schedule: str, guard_first: bool, tmp_path: Path
) -> None:
    make_scheduler, closed_form = SCHEDULES[schedule]
    directives = Directives(generation=1, attempt=0, lr_scale=0.5)
    original = Run(make_scheduler)
    original.attach(directives)
    for step in range(1, 6):
        used = original.step_and_measure_lr(seed=step)
        assert used == pytest.approx(0.5 * closed_form(step), rel=1e-4)
    original.save(tmp_path / "step-5.pt")
    continued = [original.step_and_measure_lr(seed=step) for step in range(6, 11)]

    resumed = Run(make_scheduler)
    resumed.attach(directives)
    resumed.restore(tmp_path / "step-5.pt", guard_first=guard_first)
    for step, expected in zip(range(6, 11), continued, strict=True):
        used = resumed.step_and_measure_lr(seed=step)
        assert used == pytest.approx(0.5 * closed_form(step), rel=1e-4)
        assert used == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_rewarmup_ramps_the_scaled_lr_after_a_resume(schedule: str, tmp_path: Path) -> None:
    make_scheduler, closed_form = SCHEDULES[schedule]
    original = Run(make_scheduler)
    original.attach(Directives(generation=1, attempt=0))
    for step in range(1, 5):
        assert original.step_and_measure_lr(seed=step) == pytest.approx(closed_form(step), rel=1e-4)
    original.save(tmp_path / "step-4.pt")

    rollback = Directives(generation=2, attempt=0, resume_step=4, lr_scale=0.5, rewarmup_steps=4)
    resumed = Run(make_scheduler)
    resumed.attach(rollback)
    resumed.restore(tmp_path / "step-4.pt", guard_first=False)
    factors = [resumed.step_and_measure_lr(seed=step) / closed_form(step) for step in range(5, 11)]
    assert factors == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.5, 0.5], rel=1e-4)
    assert factors == pytest.approx([lr_factor(rollback, step) for step in range(5, 11)], rel=1e-4)


def test_the_ramp_starts_at_the_first_step_after_the_resume_step() -> None:
    scale = LrScale(scale=0.5, rewarmup_from_step=1000, rewarmup_steps=100)
    rollback = Directives(
        generation=2, attempt=1, resume_step=1000, lr_scale=0.5, rewarmup_steps=100
    )
    steps = (1001, 1050, 1099, 1100, 5000)
    expected = [0.5 / 100, 0.25, 0.5 * 99 / 100, 0.5, 0.5]
    assert [scale.factor(step) for step in steps] == pytest.approx(expected)
    assert [lr_factor(rollback, step) for step in steps] == pytest.approx(expected)


def test_without_rewarmup_the_factor_is_the_scale() -> None:
    assert LrScale(scale=0.3).factor(7) == 0.3
    assert LrScale(scale=0.3, rewarmup_from_step=10, rewarmup_steps=0).factor(11) == 0.3
    assert lr_factor(Directives(generation=1, attempt=0, lr_scale=0.3), 7) == 0.3
    fresh = Directives(generation=1, attempt=0, resume_step=10, lr_scale=0.3, rewarmup_steps=0)
    assert lr_factor(fresh, 11) == 0.3


def test_the_scheduler_keeps_its_own_lr_between_steps() -> None:
    run = Run(make_lambda)
    run.attach(Directives(generation=1, attempt=0, lr_scale=0.25))
    run.step_and_measure_lr(seed=1)
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(lambda_lr(2))
    assert run.scheduler.get_last_lr() == pytest.approx([lambda_lr(2)])


def test_a_tensor_lr_is_refused_with_the_reason() -> None:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))
    guard = Guard(model, optimizer, directives=DirectiveSource(0), guard_env=GuardEnv())
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(TypeError, match="param group 0 has lr of type Tensor"):
        guard.step(torch.tensor(1.0))
