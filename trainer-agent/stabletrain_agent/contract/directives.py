"""What the operator tells a run: where to resume, how hard to step, what data to avoid.

Directives are versioned by a generation that only ever grows: every rank applies the
newest one it has seen and ignores older ones, so a retried or reordered delivery cannot
undo a newer decision. The attempt number fences them: directives for another attempt are
refused, so a pod of an attempt being torn down cannot act on the next attempt's plan.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from stabletrain_agent.contract.base import (
    ContractError,
    ContractModel,
    describe_errors,
    kubernetes_rules,
)
from stabletrain_agent.contract.checkpoint_settings import CheckpointSettings
from stabletrain_agent.contract.detection import DetectionConfig
from stabletrain_agent.contract.names import (
    AGENT_SIGNALS,
    CUSTOM_SIGNAL_PREFIX,
    Signal,
    is_signal_name,
)
from stabletrain_agent.contract.trip_rules import TRIP_RULES_MAX, TripRule


class SkipUnit(StrEnum):
    """What the numbers of a skip range count."""

    STEP = "Step"
    """The data the tripped run consumed at these optimizer steps, as its lineage recorded.
    The natural unit: the operator knows the onset step, not the sample indices."""
    BATCH = "Batch"
    """Global batch indices of the data order (PaLM's "skip 200-500 batches")."""


RUN_END = 2**53 - 1
"""`last` of a skip range that lasts for the rest of the run: the largest integer every JSON
reader keeps exactly. With unit Batch and first 0 it names shards never to be read again."""


class SkipRange(ContractModel):
    """A contiguous stretch of training data never to be consumed again."""

    model_config = ConfigDict(
        json_schema_extra=kubernetes_rules(
            ("self.last >= self.first", "a skip range must not end before it starts", ".last")
        )
    )

    first: int = Field(ge=0)
    """First step (or batch) skipped."""
    last: int = Field(ge=0)
    """Inclusive."""
    unit: SkipUnit = SkipUnit.STEP
    shard_ids: tuple[str, ...] = Field(default=(), max_length=1024)
    """When set, only samples of these shards inside the range are skipped (the lineage
    named them); empty means everything in the range."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.last < self.first:
            raise ValueError(f"skip range ends ({self.last}) before it starts ({self.first})")
        return self

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    @property
    def to_run_end(self) -> bool:
        return self.last >= RUN_END


DEFAULT_TRIP_ON: tuple[str, ...] = (Signal.LOSS_SPIKE.value, Signal.NON_FINITE.value)
"""What the default policy rolls back on; everything else only reports."""


class Directives(ContractModel):
    """The operator's complete instructions for one attempt of a run."""

    generation: int = Field(ge=1)
    """Grows with every new decision; the agent applies only generations newer than its own."""
    attempt: int = Field(ge=0)
    """Attempt these are for; must equal the pod's STABLETRAIN_ATTEMPT."""
    resume_step: int | None = Field(default=None, ge=0)
    """Checkpoint step to load at start, exactly (pods that cannot find it stop with a
    RestoreFailed termination message); 0 starts from step 0 with nothing restored; null
    (attempt 0) resumes the newest checkpoint found, as a run outside the operator does.
    Fixed per attempt: a live directive with another value is refused."""
    lr_scale: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    """Multiplier on the schedule's LR, the product of every reduction so far."""
    rewarmup_steps: int = Field(default=0, ge=0, le=1_000_000)
    """After resuming, the multiplier ramps linearly from 0 to `lr_scale` over this many
    steps: the optimizer state is fresh relative to the data and a full LR at once is what
    spiked in the first place."""
    skip: tuple[SkipRange, ...] = ()
    """Data never to be consumed again, across all attempts so far."""
    save_request: int = Field(default=0, ge=0)
    """Grows when the operator asks for a checkpoint now (before it stops the pods for
    spec.suspend): every rank saves at the step it adopts these directives, the copy is
    flushed to the PFS, and the status endpoint reports the request as `savedRequest`."""
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    trip_on: tuple[str, ...] = DEFAULT_TRIP_ON
    """Sustained signals that stop training on every rank at once and leave a trip report.
    All other signals only report (metrics, status endpoint)."""
    trip_rules: tuple[TripRule, ...] | None = Field(default=None, max_length=TRIP_RULES_MAX)
    """The policy's rules in order, as far as the agent's signals go: a sustained finding
    trips when the first of them that matches it (signal, class, every whileFiring signal
    firing at that step) stops the run. Null: every signal in trip_on trips (an operator
    before this field)."""
    checkpoints: CheckpointSettings | None = None
    """The spec's checkpoint interval and retentions, applied to the running checkpoint
    manager when these are adopted; null keeps what the pod's env said (an operator from
    before this field)."""

    @field_validator("trip_on")
    @classmethod
    def _trippable(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not is_signal_name(name):
                raise ValueError(f"{name!r} is not a signal name")
            if not name.startswith(CUSTOM_SIGNAL_PREFIX) and Signal(name) not in AGENT_SIGNALS:
                raise ValueError(f"{name} is observed by the operator; the agent cannot trip on it")
        return names

    @model_validator(mode="after")
    def _custom_trips_are_defined(self) -> Self:
        defined = self.detection.custom_signal_names()
        for name in self.trip_on:
            if name.startswith(CUSTOM_SIGNAL_PREFIX) and name not in defined:
                raise ValueError(f"trip_on names {name} but detection.custom does not define it")
        return self

    def to_json(self) -> str:
        return self.model_dump_json()


def parse_directives(payload: str | bytes) -> Directives:
    """Directives from JSON; ContractError lists every offending field by its wire name."""
    try:
        return Directives.model_validate_json(payload)
    except ValidationError as error:
        raise ContractError(describe_errors("directives", error)) from None
