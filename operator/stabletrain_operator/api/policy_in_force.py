"""status.policy and status.policyRollout: the policy a job runs, and an edit on its way.

The spec says what a person asked for; the pods run what reached them. status.policy is the
second: the effective detection, recovery and checkpoint settings (the job's own values,
then its StableTrainingPolicy defaults, then the built-in ones) that the running pods have
applied and that the operator decides by, with where each value came from. An edit that
changes what the pods run is in status.policyRollout until every pod reports its directives
generation; status.observedGeneration follows status.policy.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AwareDatetime, Field

from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.detection import DetectionConfig
from stabletrain_operator.api.base import ApiModel
from stabletrain_operator.api.shared import Shared
from stabletrain_operator.api.spec import RecoverySpec

SOURCE_JOB = "Job"
"""The source of a value the job's own spec sets."""
SOURCES_MAX = 16
FIELDS_MAX = 128


class PolicySource(ApiModel):
    """The fields one source gave the effective policy."""

    source: str = Field(max_length=300)
    """`Job` (the job's spec) or `StableTrainingPolicy/<name>` (its defaults, or a limit it
    held an inherited value to)."""
    fields: tuple[str, ...] = Field(default=(), max_length=FIELDS_MAX)
    """Spec paths (e.g. `recovery.budgets.maxRollbacks`; a list such as `recovery.rules`
    counts whole). A field no source lists has its built-in default (docs/api.md)."""


class PolicyInForce(ApiModel):
    """The effective policy the running pods apply and the operator decides by."""

    spec_generation: int | None = Field(default=None, ge=0)
    """metadata.generation of the spec it was taken from (status.observedGeneration too,
    unless an edit that waits for the next attempt is newer)."""
    directives_generation: int = Field(ge=0)
    """The directives generation that carries it to the pods (0: none sent yet)."""
    policies: tuple[str, ...] = Field(default=(), max_length=SOURCES_MAX)
    """The StableTrainingPolicy objects that select the job's namespace, highest priority
    first."""
    sources: tuple[PolicySource, ...] = Field(default=(), max_length=SOURCES_MAX)
    """Where each value came from."""
    detection: Annotated[DetectionConfig, Shared()]
    recovery: Annotated[RecoverySpec, Shared()]
    checkpoints: Annotated[CheckpointSettings, Shared()]
    """The checkpoint interval and retentions the pods' managers apply."""


class PolicyRollout(ApiModel):
    """A spec edit sent to the running pods that not every pod reported applied yet."""

    sent_at: AwareDatetime
    """When its directives were first sent."""
    policy: PolicyInForce
    """The policy it puts in force once every pod reports its directives generation (or
    the ranks trip under it); another edit before that is sent anew."""


class BuiltFrom(ApiModel):
    """What the current attempt's pods were built from: `spec.workers` (the template, the
    rendezvous), `checkpoints.memory`, `recovery.restart` and `recovery.warmStart` reach
    pods only when they are created, so an edit of them takes effect at the next attempt."""

    spec_generation: int | None = Field(default=None, ge=0)
    """metadata.generation the pods were built from (the newest with the same values of
    those fields)."""
    digest: str = Field(max_length=64)
    """Digest of those fields."""
