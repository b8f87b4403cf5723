"""The policy's answer: one action, the rule behind it, and everything the plan needs."""

from __future__ import annotations

from dataclasses import dataclass

from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import Action, AnomalyClass

MANUAL_RULE = "manual"
"""Rule name recorded for a person's rollback request."""
DEFAULT_INFRASTRUCTURE_RULE = "default-infrastructure"
"""Built-in rule for a worker failure or stall that no configured rule matches."""
UNMATCHED_TRIP_RULE = "unmatched-trip"
"""Built-in for a trip that no rule matches (the agent stopped; somebody must look)."""
ESCALATION_RULE = "escalation"
"""Rule name of the final action once a spike recurred more often than allowed."""


@dataclass(frozen=True)
class Decision:
    """What to do about one observation; the operator carries it out, then calls `record`."""

    action: Action
    rule: str
    """Name of the rule that matched, or one of the built-ins above."""
    reason: str
    """CamelCase `Reason` for the condition and the Event."""
    message: str
    """A sentence a person can act on."""
    evidence: str
    """What was seen: the detector's values, the pods' failure, a person's stated reason."""
    signal: str
    anomaly_class: AnomalyClass | None
    step: int | None
    """Step the run had reached when the signal was seen."""
    onset_step: int | None
    lr_scale: float | None = None
    """New cumulative LR scale for Rollback and ReduceLR (current x factor, floored)."""
    skip: tuple[SkipRange, ...] = ()
    """Skip ranges this Rollback adds around the onset (wider on escalation)."""
    rewarmup_steps: int | None = None
    target_step_at_most: int | None = None
    """Rollback target bound: the newest stable checkpoint at or before this step; None
    means the newest stable checkpoint (a manual request without a step)."""
    escalation_level: int = 0
    """0 for a first occurrence, k for the k-th recurrence near an earlier onset."""
    request_id: str = ""
    """The manual request this decision answers; empty for automatic decisions."""
    backoff_seconds: int | None = None
    """A restart that completes a crash loop under crashLoop.action Backoff waits this long."""

    @property
    def told(self) -> str:
        """The message with the evidence it rests on, for the Event and a Failed condition."""
        if not self.evidence or self.evidence in self.message:
            return self.message
        return f"{self.message}; evidence: {self.evidence}"


@dataclass(frozen=True)
class Deferral:
    """Why a firing signal changed nothing this time (cooldown, episode handled, no rule)."""

    signal: str
    rule: str
    """The rule that would have acted; empty when none matches."""
    message: str


@dataclass(frozen=True)
class Evaluation:
    """`evaluate`'s answer: the decision (if any) and the notes on what was set aside."""

    decision: Decision | None
    deferred: tuple[Deferral, ...] = ()
