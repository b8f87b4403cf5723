"""What the operator tells a run: where to resume, how hard to step, what data to avoid.

Directives are versioned by a generation that only ever grows: every rank applies the
newest one it has seen and ignores older ones, so a retried or reordered delivery cannot
undo a newer decision. The attempt number fences them: directives for another attempt are
refused, so a pod of an attempt being torn down cannot act on the next attempt's plan.

An agent refuses a field it does not know (a plan it cannot carry out must fail loudly),
so the operator leaves out every field at its default (`to_json`): an older agent then
reads a newer operator's directives until a decision needs what it lacks. Defaults never
change for that reason; a different default is a new field.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from stabletrain_contract.base import (
    ContractError,
    ContractModel,
    describe_errors,
    kubernetes_rules,
)
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.detection import CUSTOM_SIGNALS_MAX, DetectionConfig
from stabletrain_contract.names import (
    AGENT_SIGNALS,
    CUSTOM_SIGNAL_PREFIX,
    SIGNAL_NAME_MAX,
    Signal,
    is_signal_name,
)
from stabletrain_contract.trip_rules import TRIP_RULES_MAX, TripRule, same_as_trip_on


class SkipUnit(StrEnum):
    """What the numbers of a skip range count."""

    STEP = "Step"
    """The data the tripped run consumed at these optimizer steps, as its lineage recorded.
    The natural unit: the operator knows the onset step, not the sample indices."""
    BATCH = "Batch"
    """Global batch indices of the data order (PaLM's "skip 200-500 batches")."""


SHARD_ID_MAX = 128
SHARD_IDS_MAX = 1024
SKIP_RANGES_MAX = 65_536
"""More ranges than a directives body of MAX_DIRECTIVES_BYTES can hold (each is at least 20
bytes of JSON): the byte cap is the binding bound, this one states it."""
GENERATION_MAX = 2**31 - 1
"""Far beyond the decisions of any job (one per rollback, restart, LR reduction or save
request), and exact in every JSON reader and in the CRD's int64."""
GENERATION_ADVANCE_MAX = 64
"""How far one live directive may move a pod's generation. The operator moves it by one per
decision and re-sends the whole directives to a pod that missed some, so a pod lags by the
few decisions it missed; a larger jump would only make the operator's next decisions look
stale to that pod."""

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
    shard_ids: tuple[Annotated[str, Field(max_length=SHARD_ID_MAX)], ...] = Field(
        default=(), max_length=SHARD_IDS_MAX
    )
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

    generation: int = Field(ge=1, le=GENERATION_MAX)
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
    skip: tuple[SkipRange, ...] = Field(default=(), max_length=SKIP_RANGES_MAX)
    """Data never to be consumed again, across all attempts so far."""
    save_request: int = Field(default=0, ge=0)
    """Grows when the operator asks for a checkpoint now (before it stops the pods for
    spec.suspend): every rank saves at the step it adopts these directives, the copy is
    flushed to the PFS, and the status endpoint reports the request as `savedRequest`."""
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    trip_on: tuple[Annotated[str, Field(max_length=SIGNAL_NAME_MAX)], ...] = Field(
        default=DEFAULT_TRIP_ON, max_length=len(AGENT_SIGNALS) + CUSTOM_SIGNALS_MAX
    )
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

    def to_json(self, *, for_new_pods: bool = False) -> str:
        """The wire form: fields at their default left out, so an older agent that does
        not know a field reads the directives as long as no decision set it. So are rules
        that say no more than trip_on, and, `for_new_pods` (built from the spec these
        directives carry), the checkpoint settings their environment holds already."""
        left_out: set[str] = set()
        if self.trip_rules is not None and same_as_trip_on(self.trip_rules, self.trip_on):
            left_out.add("trip_rules")
        if for_new_pods:
            left_out.add("checkpoints")
        return self.model_dump_json(exclude_defaults=True, exclude=left_out)


def parse_directives(payload: str | bytes) -> Directives:
    """Directives from JSON; ContractError lists every offending field by its wire name."""
    try:
        return Directives.model_validate_json(payload)
    except ValidationError as error:
        raise ContractError(describe_errors("directives", error)) from None
