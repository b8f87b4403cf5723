"""The one collective and the one host read of each step.

Everything the guard decides on goes through a single SUM all-reduce of a small float64
vector and a single ``tolist()``: the loss (averaged), the grad norm (averaged: DDP makes
it identical on every rank already, averaging just makes agreement exact), the step time
(averaged, so throughput is the same number everywhere), token counts (summed), the count
of ranks that hold newer directives, and the count of ranks with a checkpoint save in
flight. A NaN anywhere stays NaN through the sum, so one rank's non-finite loss becomes
every rank's. Because every rank then feeds the same host numbers into the deterministic
monitor, the trip decision is identical everywhere without a second collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.distributed as dist


class Agreed(NamedTuple):
    """Host values every rank holds identically after the step's all-reduce (a tuple:
    built on every step, where a frozen dataclass costs several times more)."""

    loss: float
    grad_norm: float
    step_seconds: float
    tokens: float
    ranks_with_newer_directives: int
    ranks_saving: int
    custom: dict[str, float]


def agree(
    loss: torch.Tensor,
    grad_norm: torch.Tensor,
    *,
    step_seconds: float,
    tokens: int,
    has_newer_directives: bool,
    saving: bool,
    custom: Mapping[str, torch.Tensor | float],
    group: dist.ProcessGroup | None,
    distributed: bool,
) -> Agreed:
    """Pack, all-reduce (when `distributed`: the caller's process group was up when it was
    made) and read back: one collective, one sync.

    ``custom`` must have the same keys on every rank (the vector's layout depends on them).
    """
    device = loss.device
    names = sorted(custom)
    # One stack of 0-d tensors (it promotes to the widest type, as cat would): a third of
    # what reshaping each to 1-d and concatenating costs on the CPU, per step.
    scalars = [_scalar(loss), _scalar(grad_norm)]
    scalars += [_as_tensor(custom[name], device) for name in names]
    host_values = [step_seconds, float(tokens), float(has_newer_directives), float(saving)]
    world = 1
    if distributed:
        host = torch.tensor(host_values, dtype=torch.float64)
        if device.type == "cuda":
            # A pageable host-to-device copy waits for the stream: pinned memory does not.
            host = host.pin_memory()
        # cat promotes every part to float64, the host part's type, in the same kernel.
        vector = torch.cat([torch.stack(scalars), host.to(device, non_blocking=True)])
        dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=group)
        world = dist.get_world_size(group)
        values = vector.tolist()
    else:
        values = torch.stack(scalars).tolist() + host_values
    custom_values = values[2 : 2 + len(names)]
    seconds, total_tokens, newer, saving_ranks = values[2 + len(names) :]
    return Agreed(
        loss=values[0] / world,
        grad_norm=values[1] / world,
        step_seconds=seconds / world,
        tokens=total_tokens,
        ranks_with_newer_directives=round(newer),
        ranks_saving=round(saving_ranks),
        custom={name: value / world for name, value in zip(names, custom_values, strict=True)},
    )


def _scalar(value: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor outside autograd, with no op when it already is one."""
    if value.requires_grad:
        value = value.detach()
    return value if value.dim() == 0 else value.reshape(())


def _as_tensor(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return _scalar(value)
    return torch.tensor(float(value), dtype=torch.float64, device=device)
