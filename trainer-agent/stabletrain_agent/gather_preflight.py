"""Gather the run's stability facts from the objects the Guard already holds.

Read-only by construction: the scheduler is probed on a deep copy (stepping the real one
would shift the user's schedule), optimizer hyper-parameters are read from param group 0,
and tier free space is a statvfs. Nothing here touches the weights or the data cursor, so
gathering facts at start-up cannot change the run it describes.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler
from torch.optim.lr_scheduler import LRScheduler

from stabletrain_agent.data.source import BatchSource
from stabletrain_contract import env
from stabletrain_contract.preflight import (
    MAX_PREFLIGHT_MESSAGE_BYTES,
    OptimizerFacts,
    Precision,
    PreflightFacts,
    TierFacts,
)

WARMUP_PROBE_STEPS = 100_000
"""Longest warm-up the probe looks for; past it the schedule is reported as never peaking
within the probe (a warm-up that long is a finding of its own only with a known peak)."""
PLATEAU_STEPS = 50
"""The probe stops once the LR has not risen for this many steps after its maximum."""
ADAPTIVE_STATE_TENSORS = 2
"""Adam-family optimizers keep two moments (exp_avg, exp_avg_sq) per parameter."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V1_UNLIMITED = 2**62
"""cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit value; anything
this large is no limit a container was given."""


def preflight_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True in the operator's preflight pod (STABLETRAIN_PREFLIGHT=1)."""
    source = os.environ if environ is None else environ
    return source.get(env.PREFLIGHT_ENV, "") == "1"


def probe_schedule(
    optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None
) -> tuple[int | None, float]:
    """(warm-up steps, peak LR) of param group 0, read off a deep copy of the scheduler.

    The warm-up is the first step at which the LR reaches its maximum over the probe, so a
    schedule that starts at its peak reports 0. Without a scheduler the LR is constant: the
    warm-up is unknown (None) and the peak is the optimizer's LR. A scheduler that cannot be
    copied or stepped alone (ReduceLROnPlateau wants a metric) is unknown too: gathering
    facts must never stop a run.
    """
    lr_now = float(optimizer.param_groups[0]["lr"])
    if scheduler is None:
        return None, lr_now
    # The parameters (and any optimizer state) are shared with the copy, never duplicated:
    # a copy of a large model's weights would cost its memory a second time.
    shared: dict[int, Any] = {id(p): p for g in optimizer.param_groups for p in g["params"]}
    shared.update({id(s): s for s in optimizer.state.values()})
    try:
        probe_scheduler = copy.deepcopy(scheduler, shared)
        probe_optimizer = probe_scheduler.optimizer
        peak, peak_step = float(probe_optimizer.param_groups[0]["lr"]), 0
        with warnings.catch_warnings():
            # "scheduler.step() before optimizer.step()": the probe never steps the optimizer.
            warnings.simplefilter("ignore", UserWarning)
            for step in range(1, WARMUP_PROBE_STEPS + 1):
                probe_scheduler.step()
                lr = float(probe_optimizer.param_groups[0]["lr"])
                if lr > peak * (1 + 1e-9):
                    peak, peak_step = lr, step
                elif step - peak_step >= PLATEAU_STEPS:
                    break
    except Exception:
        return None, lr_now
    return peak_step, peak


def precision_of(model: torch.nn.Module, scaler: GradScaler | None) -> Precision:
    """fp16 when parameters are half or a GradScaler is in use (it only exists for fp16)."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if torch.float16 in dtypes or (scaler is not None and scaler.is_enabled()):
        return Precision.FP16
    if torch.bfloat16 in dtypes:
        return Precision.BF16
    return Precision.FP32


def optimizer_facts(optimizer: torch.optim.Optimizer, state_dtype: torch.dtype) -> OptimizerFacts:
    group = optimizer.param_groups[0]
    betas = group.get("betas")
    beta1 = beta2 = None
    if isinstance(betas, tuple | list) and len(betas) == 2:
        beta1, beta2 = float(betas[0]), float(betas[1])
    eps = group.get("eps")
    decay = group.get("weight_decay")
    return OptimizerFacts(
        name=type(optimizer).__name__,
        adaptive=beta2 is not None,
        beta1=beta1,
        beta2=beta2,
        eps=float(eps) if isinstance(eps, int | float) else None,
        weight_decay=float(decay) if isinstance(decay, int | float) else None,
        state_dtype=str(state_dtype).removeprefix("torch."),
    )


def checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters plus the optimizer state they will get: one checkpoint's size."""
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    group = optimizer.param_groups[0]
    per_param = 0
    if "betas" in group:
        per_param = ADAPTIVE_STATE_TENSORS
    elif float(group.get("momentum", 0.0) or 0.0) > 0.0:
        per_param = 1
    return param_bytes * (1 + per_param)


def tier_facts(environ: Mapping[str, str]) -> tuple[TierFacts, ...]:
    """Free space of each tier the pod's env names; a missing directory reports no space."""
    tiers = []
    for name, variable in (("local", env.LOCAL_CHECKPOINT_DIR), ("pfs", env.PFS_CHECKPOINT_DIR)):
        path = environ.get(variable)
        if not path:
            continue
        try:
            stats = os.statvfs(path)
        except OSError:
            tiers.append(TierFacts(name=name, path=path))
            continue
        tiers.append(
            TierFacts(
                name=name,
                path=path,
                free_bytes=stats.f_bavail * stats.f_frsize,
                total_bytes=stats.f_blocks * stats.f_frsize,
            )
        )
    return tuple(tiers)


def container_memory_limit(cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of this container's cgroup in bytes (v2 `memory.max`, v1
    `memory/memory.limit_in_bytes`); None when there is none or it cannot be read."""
    for path in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if not raw.isdigit():
            return None  # "max": no limit
        value = int(raw)
        return value if value < CGROUP_V1_UNLIMITED else None
    return None


def gather_facts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: LRScheduler | None,
    scaler: GradScaler | None,
    max_grad_norm: float | None,
    data: BatchSource | None,
    warmup_steps: int | None = None,
    checkpoint_interval_steps: int | None = None,
    world_size: int = 1,
    environ: Mapping[str, str] | None = None,
) -> PreflightFacts:
    """The facts of this run; `warmup_steps` given by the user wins over the probe."""
    probed_warmup, peak = probe_schedule(optimizer, scheduler)
    params = [p for p in model.parameters() if p.requires_grad]
    state_dtype = params[0].dtype if params else torch.float32
    # An enabled GradScaler backs off on every overflow and grows again: it is dynamic.
    dynamic = scaler is not None and scaler.is_enabled() and scaler.get_backoff_factor() < 1.0
    return PreflightFacts(
        max_grad_norm=max_grad_norm,
        warmup_steps=warmup_steps if warmup_steps is not None else probed_warmup,
        scheduler=None if scheduler is None else type(scheduler).__name__,
        peak_lr=peak,
        precision=precision_of(model, scaler),
        grad_scaler=scaler is not None and scaler.is_enabled(),
        dynamic_loss_scale=dynamic,
        optimizer=optimizer_facts(optimizer, state_dtype),
        parameters=sum(p.numel() for p in params),
        checkpoint_bytes_estimate=checkpoint_bytes(model, optimizer),
        checkpoint_interval_steps=checkpoint_interval_steps,
        tiers=tier_facts(os.environ if environ is None else environ),
        data_shards=len(data.shards) if data is not None else None,
        world_size=world_size,
        memory_limit_bytes=container_memory_limit(),
    )


def write_preflight_message(path: Path, facts: PreflightFacts) -> None:
    """The facts as the container's termination message (the preflight pod's answer)."""
    payload = facts.to_json().encode()
    if len(payload) > MAX_PREFLIGHT_MESSAGE_BYTES:
        raise ValueError(
            f"preflight facts take {len(payload)} bytes; a termination message keeps "
            f"{MAX_PREFLIGHT_MESSAGE_BYTES}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)


def finish_preflight(facts: PreflightFacts, *, local_rank: int, termination: Path | None) -> None:
    """Leave the facts (local rank 0) and end the process with 0: no step is taken."""
    if local_rank == 0:
        if termination is None:
            raise RuntimeError(
                f"{env.PREFLIGHT_ENV}=1 but {env.TERMINATION_MESSAGE_PATH} is not set: the "
                "preflight facts would have nowhere to go"
            )
        write_preflight_message(termination, facts)
        print(f"stabletrain: preflight facts written to {termination}", file=sys.stderr)
    sys.exit(0)
