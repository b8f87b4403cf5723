"""What the policy must remember between decisions, and how it survives in the job's status.

Budgets, cooldowns, escalation and alert de-duplication all need memory, yet `decide` is a
pure function; the ledger is that memory, passed in and returned by `record`. It is plain
JSON-able data so the operator can keep it in status and an operator restart forgets
nothing. The budget counters can also be rebuilt from the status counters and rollback
history alone, which is the part that must never be lost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from stabletrain_agent.contract.directives import SkipRange
from stabletrain_agent.contract.names import AnomalyClass
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.policy.action_kind import StatusCounter
from stabletrain_operator.policy.action_registry import kind_of

RECENT_ROLLBACKS_MAX = 16
"""Rollbacks kept for escalation; more recurrences than this fail long before."""
RAISED_ALERTS_MAX = 32
"""Alert episodes remembered; the oldest are forgotten first."""


@dataclass(frozen=True)
class RollbackMemory:
    """One automatic rollback, as escalation needs it."""

    onset_step: int
    lr_scale: float
    skip: tuple[SkipRange, ...] = ()
    escalation_level: int = 0
    anomaly_class: AnomalyClass | None = None
    """What the rollback answered; None (a ledger kept before the class was) matches any."""


def same_kind(earlier: AnomalyClass | None, later: AnomalyClass | None) -> bool:
    """Whether `later` can be `earlier` coming back. Non-finite arithmetic and a loss or
    gradient that jumps have different causes and cures, so a NaN burst after a spike's
    rollback is a new incident and does not make that rollback's LR cut harder. An unknown
    class on either side matches, as before classes were kept."""
    if earlier is None or later is None:
        return True
    return (earlier is AnomalyClass.NUMERICAL) == (later is AnomalyClass.NUMERICAL)


@dataclass(frozen=True)
class AlertEpisode:
    """A live action (Alert, ReduceLR) already taken for one episode of one signal.

    A report-only signal stays in the agent's `firing` list on every scrape while it
    lasts; an episode is identified by its onset step, so it raises one Alert, not one per
    scrape.
    """

    rule: str
    signal: str
    onset_step: int | None
    at: datetime


@dataclass(frozen=True)
class PolicyLedger:
    """Budgets used, the last stopping action, recent rollbacks and raised alerts."""

    rollbacks_used: int = 0
    """Automatic and manual rollbacks, against budgets.maxRollbacks."""
    restarts_used: int = 0
    """RestartFromLatest actions, against budgets.maxRestarts."""
    last_action_at: datetime | None = None
    """When the last stopping action (Rollback, RestartFromLatest) was recorded."""
    recent_rollbacks: tuple[RollbackMemory, ...] = ()
    """Automatic rollbacks, oldest first, bounded by RECENT_ROLLBACKS_MAX."""
    live_actions: tuple[AlertEpisode, ...] = ()
    """Alert and ReduceLR episodes, oldest first, bounded by RAISED_ALERTS_MAX."""
    last_manual_request_id: str | None = None
    """A manual request with this id has been handled and does not run again."""

    def rollbacks_near(
        self, onset_step: int, within_steps: int, anomaly_class: AnomalyClass | None = None
    ) -> tuple[RollbackMemory, ...]:
        """Earlier rollbacks of the same kind (`same_kind`) whose onset lies within
        `within_steps` of `onset_step`."""
        return tuple(
            memory
            for memory in self.recent_rollbacks
            if abs(memory.onset_step - onset_step) <= within_steps
            and same_kind(memory.anomaly_class, anomaly_class)
        )

    def last_live_action(self, rule: str) -> AlertEpisode | None:
        """The newest live action the rule took, for its cooldown."""
        for episode in reversed(self.live_actions):
            if episode.rule == rule:
                return episode
        return None

    def episode_handled(self, rule: str, signal: str, onset_step: int | None) -> bool:
        """True when this rule already acted on this episode (same signal and onset)."""
        return onset_step is not None and any(
            e.rule == rule and e.signal == signal and e.onset_step == onset_step
            for e in self.live_actions
        )

    def to_status(self) -> dict[str, Any]:
        """JSON-able form for the job's status; `from_status` reads it back."""
        data: dict[str, Any] = _ADAPTER.dump_python(self, mode="json")
        return data

    @classmethod
    def from_status(cls, data: object) -> PolicyLedger:
        """The ledger persisted by `to_status`; ValueError names each malformed field."""
        try:
            return _ADAPTER.validate_python(data)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in problem['loc']) or '(root)'}: {problem['msg']}"
                for problem in error.errors()
            )
            raise ValueError(f"invalid policy ledger: {problems}") from None

    @classmethod
    def from_job_status(cls, status: StableTrainingJobStatus) -> PolicyLedger:
        """Rebuild the budget-relevant memory from status counters and rollback history.

        Used when no persisted ledger exists (a job created before the ledger was kept,
        or status edited by hand): budgets and escalation survive, alert episodes and
        cooldowns start afresh, which at worst raises one Alert again.
        """
        automatic = tuple(
            RollbackMemory(
                onset_step=record.onset_step,
                lr_scale=record.lr_scale,
                skip=record.skipped,
                anomaly_class=record.anomaly_class,
            )
            for record in status.rollback_history
            if kind_of(record.action).counter is StatusCounter.ROLLBACKS
            and record.onset_step is not None
            and not record.request_id
        )
        stopping_times = [
            record.time for record in status.rollback_history if kind_of(record.action).budgeted
        ]
        return cls(
            rollbacks_used=status.counters.rollbacks,
            restarts_used=status.counters.restarts,
            last_action_at=max(stopping_times) if stopping_times else None,
            recent_rollbacks=automatic[-RECENT_ROLLBACKS_MAX:],
            last_manual_request_id=status.last_manual_request_id,
        )

    def with_rollback(self, memory: RollbackMemory, *, now: datetime) -> PolicyLedger:
        return replace(
            self,
            rollbacks_used=self.rollbacks_used + 1,
            last_action_at=now,
            recent_rollbacks=(*self.recent_rollbacks, memory)[-RECENT_ROLLBACKS_MAX:],
        )

    def with_live_action(self, episode: AlertEpisode) -> PolicyLedger:
        return replace(self, live_actions=(*self.live_actions, episode)[-RAISED_ALERTS_MAX:])


_ADAPTER: TypeAdapter[PolicyLedger] = TypeAdapter(PolicyLedger)
