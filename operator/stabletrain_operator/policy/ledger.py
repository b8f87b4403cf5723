"""What the policy must remember between decisions, and how it survives in the job's status.

Budgets, cooldowns, escalation and alert de-duplication all need memory, yet `decide` is a
pure function; the ledger is that memory, passed in and returned by `record`. Each part is
stored once in status: the budgets used in status.counters and the last handled manual
request in status.lastManualRequestId, which people read, and the rest in
status.policyLedger (`PolicyMemory`), so an operator restart forgets nothing and the two
can never disagree. Without a policyLedger, escalation and the cooldown are rebuilt from
rollbackHistory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from pydantic import ValidationError

from stabletrain_contract.base import error_lines
from stabletrain_contract.names import AnomalyClass
from stabletrain_operator.api.policy_memory import (
    RAISED_ALERTS_MAX,
    RECENT_ROLLBACKS_MAX,
    AlertEpisode,
    PolicyMemory,
    RollbackMemory,
)
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.policy.action_kind import StatusCounter
from stabletrain_operator.policy.action_registry import kind_of

__all__ = [
    "RAISED_ALERTS_MAX",
    "RECENT_ROLLBACKS_MAX",
    "AlertEpisode",
    "PolicyLedger",
    "RollbackMemory",
    "same_kind",
]


def same_kind(earlier: AnomalyClass | None, later: AnomalyClass | None) -> bool:
    """Whether `later` can be `earlier` coming back. Non-finite arithmetic and a loss or
    gradient that jumps have different causes and cures, so a NaN burst after a spike's
    rollback is a new incident and does not make that rollback's LR cut harder. An unknown
    class on either side matches, as before classes were kept."""
    if earlier is None or later is None:
        return True
    return (earlier is AnomalyClass.NUMERICAL) == (later is AnomalyClass.NUMERICAL)


@dataclass(frozen=True)
class PolicyLedger:
    """Budgets used, the last stopping action, recent rollbacks and raised alerts."""

    rollbacks_used: int = 0
    """Automatic and manual rollbacks, against budgets.maxRollbacks (status.counters.rollbacks)."""
    restarts_used: int = 0
    """RestartFromLatest actions, against budgets.maxRestarts (status.counters.restarts)."""
    last_action_at: datetime | None = None
    """When the last stopping action (Rollback, RestartFromLatest) was recorded."""
    recent_rollbacks: tuple[RollbackMemory, ...] = ()
    """Automatic rollbacks, oldest first, bounded by RECENT_ROLLBACKS_MAX."""
    live_actions: tuple[AlertEpisode, ...] = ()
    """Alert and ReduceLR episodes, oldest first, bounded by RAISED_ALERTS_MAX."""
    last_manual_request_id: str | None = None
    """A manual request with this id has been handled and does not run again
    (status.lastManualRequestId)."""

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

    def to_status(self) -> PolicyMemory:
        """status.policyLedger: the memory that counters and lastManualRequestId do not hold;
        `from_status` reads it back."""
        return PolicyMemory(
            last_action_at=self.last_action_at,
            recent_rollbacks=self.recent_rollbacks,
            live_actions=self.live_actions,
        )

    @classmethod
    def from_status(cls, data: object) -> PolicyLedger:
        """The memory persisted by `to_status`, as a model or its JSON, with no budget used
        (`from_job_status` adds those); ValueError names each malformed field."""
        try:
            return cls._remembering(PolicyMemory.model_validate(data))
        except ValidationError as error:
            problems = "; ".join(error_lines(error))
            raise ValueError(f"invalid policy ledger: {problems}") from None

    @classmethod
    def _remembering(cls, memory: PolicyMemory) -> PolicyLedger:
        """A ledger holding `memory`, with no budget used and no manual request handled."""
        return cls(
            last_action_at=memory.last_action_at,
            recent_rollbacks=memory.recent_rollbacks,
            live_actions=memory.live_actions,
        )

    @classmethod
    def from_job_status(cls, status: StableTrainingJobStatus) -> PolicyLedger:
        """The ledger as the job's status keeps it: budgets used from counters, the last
        manual request from lastManualRequestId, the rest from policyLedger.

        A job created before the ledger was kept has no policyLedger, and one written by
        such a version had an untyped map that the API server prunes to an empty object
        once the typed CRD is applied. An empty memory says nothing rollbackHistory cannot
        (any stopping or live action would be in it), so escalation and the cooldown are
        rebuilt from history instead; alert episodes start afresh, which at worst raises
        one Alert again.
        """
        memory = status.policy_ledger
        if memory is None or memory == PolicyMemory():
            remembered = cls._rebuilt_from_history(status)
        else:
            remembered = cls._remembering(memory)
        return replace(
            remembered,
            rollbacks_used=status.counters.rollbacks,
            restarts_used=status.counters.restarts,
            last_manual_request_id=status.last_manual_request_id,
        )

    @classmethod
    def _rebuilt_from_history(cls, status: StableTrainingJobStatus) -> PolicyLedger:
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
            last_action_at=max(stopping_times) if stopping_times else None,
            recent_rollbacks=automatic[-RECENT_ROLLBACKS_MAX:],
        )

    def used(self, counter: StatusCounter) -> int:
        """How much of a budgeted counter's budget was used."""
        if counter is StatusCounter.ROLLBACKS:
            return self.rollbacks_used
        if counter is StatusCounter.RESTARTS:
            return self.restarts_used
        raise ValueError(f"the ledger keeps no budget for {counter}")

    def spent(self, counter: StatusCounter | None, *, now: datetime) -> PolicyLedger:
        """One more of a budgeted counter's budget used by a stopping action taken `now`.

        Every counter of action_kind.BUDGETED needs its field and a branch here and in
        `used` (a unit test holds it); any other counter is refused rather than not counted.
        """
        if counter is StatusCounter.ROLLBACKS:
            return replace(self, rollbacks_used=self.rollbacks_used + 1, last_action_at=now)
        if counter is StatusCounter.RESTARTS:
            return replace(self, restarts_used=self.restarts_used + 1, last_action_at=now)
        raise ValueError(f"the ledger keeps no budget for {counter}")

    def with_rollback(self, memory: RollbackMemory, *, now: datetime) -> PolicyLedger:
        return replace(
            self.spent(StatusCounter.ROLLBACKS, now=now),
            recent_rollbacks=(*self.recent_rollbacks, memory)[-RECENT_ROLLBACKS_MAX:],
        )

    def with_live_action(self, episode: AlertEpisode) -> PolicyLedger:
        return replace(self, live_actions=(*self.live_actions, episode)[-RAISED_ALERTS_MAX:])
