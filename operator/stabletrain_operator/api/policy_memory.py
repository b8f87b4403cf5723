"""status.policyLedger: what the recovery policy remembers that the rest of status does not say.

Cooldowns, escalation and alert de-duplication need memory between decisions, and an
operator restart must forget none of it, so it lives in status, typed like every other
field: the API server validates what the operator writes and the CRD documents it. Budgets
used and the last handled manual request are not repeated here: status.counters and
status.lastManualRequestId hold them, once, where people read them.
"""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import AnomalyClass
from stabletrain_operator.api.base import ApiModel

RECENT_ROLLBACKS_MAX = 16
"""Rollbacks kept for escalation; more recurrences than this fail long before."""
RAISED_ALERTS_MAX = 32
"""Alert episodes remembered; the oldest are forgotten first."""
KEPT_ELSEWHERE_BEFORE = frozenset({"rollbacks_used", "restarts_used", "last_manual_request_id"})
"""Keys of the untyped map earlier versions wrote whose values status.counters and
status.lastManualRequestId hold; the rest of that map reads as this model by field name."""


class RollbackMemory(ApiModel):
    """One automatic rollback, as escalation needs it."""

    model_config = ConfigDict(frozen=True)

    onset_step: int = Field(ge=0)
    """First anomalous step of the incident the rollback answered."""
    lr_scale: float = Field(gt=0.0, le=1.0)
    """LR scale the rollback set."""
    skip: tuple[SkipRange, ...] = Field(default=(), max_length=8)
    """Skip ranges the rollback added (as many as its rollbackHistory entry keeps)."""
    escalation_level: int = Field(default=0, ge=0)
    """Earlier rollbacks near the same onset when it was decided (0: the first)."""
    anomaly_class: AnomalyClass | None = None
    """What the rollback answered; null (a ledger kept before the class was) matches any."""


class AlertEpisode(ApiModel):
    """A live action (Alert, ReduceLR) already taken for one episode of one signal.

    A report-only signal stays in the agent's `firing` list on every scrape while it
    lasts; an episode is identified by its onset step, so it raises one Alert, not one per
    scrape.
    """

    model_config = ConfigDict(frozen=True)

    rule: str = Field(max_length=63)
    """Rule that acted."""
    signal: str = Field(max_length=70)
    """Signal it acted on."""
    onset_step: int | None = Field(default=None, ge=0)
    """First anomalous step of the episode; null when the finding had none."""
    at: AwareDatetime
    """When it acted (the rule's cooldown runs from here)."""


class PolicyMemory(ApiModel):
    """The recovery policy's memory beyond counters and rollbackHistory: the last stopping
    action, recent automatic rollbacks and live actions taken. Internal to the operator;
    read counters and rollbackHistory instead."""

    last_action_at: AwareDatetime | None = None
    """When the last stopping action (Rollback, RestartFromLatest) was recorded."""
    recent_rollbacks: tuple[RollbackMemory, ...] = Field(
        default=(), max_length=RECENT_ROLLBACKS_MAX
    )
    """Automatic rollbacks, oldest first, for escalation."""
    live_actions: tuple[AlertEpisode, ...] = Field(default=(), max_length=RAISED_ALERTS_MAX)
    """Alert and ReduceLR episodes, oldest first, for de-duplication and cooldowns."""

    @model_validator(mode="before")
    @classmethod
    def _without_what_status_keeps_elsewhere(cls, data: Any) -> Any:
        """A job written by an earlier version carries its ledger as an untyped map that
        also held the budgets used and the last manual request id; those now come from
        status alone, so a copy here could only disagree with them."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if key not in KEPT_ELSEWHERE_BEFORE}
        return data
