"""The run's stability-relevant facts, as the agent gathers them before the first step.

Most loss spikes and most lost work have causes visible before training starts: no
gradient clipping, no LR warm-up, fp16 without a dynamic loss scale, an optimizer epsilon
that half precision cannot represent, a checkpoint tier too small for what it must keep.
Only the training script knows these (it builds the model, optimizer and scheduler), so the
agent reads them off the objects the Guard holds and hands them over; the operator judges
them against its checklist (stabletrain_operator.preflight). The facts travel in the
status endpoint of running pods and, for a job that refuses to start on severe findings,
as the termination message of one short preflight pod.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, ValidationError

from stabletrain_contract.base import AgentReport, ContractError, describe_errors

MAX_PREFLIGHT_MESSAGE_BYTES = 4096
"""Kubernetes keeps at most 4 KiB of a termination message; the facts must fit."""


class Precision(StrEnum):
    """Floating-point format the parameters and their gradients are computed in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    """Pure fp16 parameters, or fp32 parameters under fp16 autocast (the GradScaler case)."""


class OptimizerFacts(AgentReport):
    """The optimizer's stability knobs (param group 0; null when the optimizer has none)."""

    name: str = Field(max_length=128)
    """Class name, e.g. AdamW."""
    adaptive: bool
    """Adam-family (second-moment) optimizer: its epsilon and beta2 matter."""
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    state_dtype: str = Field(default="float32", max_length=32)
    """dtype of the parameters, hence of the optimizer state PyTorch keeps for them."""


class TierFacts(AgentReport):
    """One checkpoint tier as seen from this pod at start-up."""

    name: str = Field(pattern="^(local|pfs)$", max_length=5)
    path: str = Field(max_length=4096)
    free_bytes: int | None = Field(default=None, ge=0)
    """statvfs free space available to this process; null when the directory is missing."""
    total_bytes: int | None = Field(default=None, ge=0)


class PreflightFacts(AgentReport):
    """Everything the checklist judges; measured on rank 0 before the first step."""

    max_grad_norm: float | None = Field(default=None, gt=0.0)
    """The Guard's clipping bound; null means gradients are not clipped."""
    warmup_steps: int | None = Field(default=None, ge=0)
    """Steps until the scheduler's LR first reaches its peak (probed on a copy of the
    scheduler); 0 means the first step already runs at the peak; null: unknown (no
    scheduler, or one that cannot be stepped without arguments, and no value given)."""
    scheduler: str | None = Field(default=None, max_length=128)
    """Class name of the LR scheduler attached to the Guard; null when there is none."""
    peak_lr: float | None = Field(default=None, ge=0.0)
    """Highest LR seen while probing (or the optimizer's LR without a scheduler)."""
    precision: Precision = Precision.FP32
    grad_scaler: bool = False
    """A GradScaler is attached and enabled."""
    dynamic_loss_scale: bool = False
    """That scaler backs its scale off on overflow and grows it again (an enabled PyTorch
    GradScaler always does); a fixed scale overflows or underflows as gradients drift."""
    optimizer: OptimizerFacts
    parameters: int = Field(ge=0)
    """Trainable parameters of this rank's model."""
    checkpoint_bytes_estimate: int = Field(ge=0)
    """Parameter bytes plus the optimizer state PyTorch will allocate for them (Adam: two
    moments): the size of one full checkpoint, before compression."""
    checkpoint_interval_steps: int | None = Field(default=None, ge=1)
    """As the script declares it to the Guard; null: the job's spec says it."""
    tiers: tuple[TierFacts, ...] = Field(default=(), max_length=2, fail_fast=True)
    data_shards: int | None = Field(default=None, ge=0)
    """Shards of the ShardedBatches helper; null when the script uses no such helper (then a
    rollback cannot skip data)."""
    world_size: int = Field(default=1, ge=1)
    memory_limit_bytes: int | None = Field(default=None, ge=0)
    """The container's memory limit as its cgroup enforces it (a LimitRange default
    included); null when none applies or it cannot be read. The memory tier counts
    against it."""

    def to_json(self) -> str:
        return self.model_dump_json()


def parse_preflight_facts(payload: str | bytes) -> PreflightFacts:
    """The operator's side; ContractError names each bad field by its wire name."""
    try:
        return PreflightFacts.model_validate_json(payload)
    except ValidationError as error:
        raise ContractError(describe_errors("preflight facts", error)) from None
