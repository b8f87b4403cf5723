"""The shape of one action's registry entry (policy/action_registry.py holds the entries).

Every part of the operator that treats actions differently reads one of these fields instead
of comparing with a particular action, so a new action is one entry (plus its applier)
rather than a hunt through the state machine, the engine, the planner and the docs. The
shape lives apart from the table because the appliers the table names need the types here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from stabletrain_contract.names import Action
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import RecoveryRule, RecoverySpec
from stabletrain_operator.policy.decision import Decision, Deferral
from stabletrain_operator.policy.observation import Observation

if TYPE_CHECKING:
    # Only a type here: the ledger reads the registry to rebuild itself from status.
    from stabletrain_operator.policy.ledger import PolicyLedger


class StatusCounter(StrEnum):
    """The status counter an action adds one to; the value is the `Counters` field name."""

    ROLLBACKS = "rollbacks"
    """Also budgets.maxRollbacks: numerical faults, answered by going back before them."""
    RESTARTS = "restarts"
    """Also budgets.maxRestarts: faults outside the model, answered by relaunching as is."""
    LR_REDUCTIONS = "lr_reductions"
    ALERTS = "alerts"


BUDGETED = frozenset({StatusCounter.ROLLBACKS, StatusCounter.RESTARTS})
"""Counters that are budgets: the ledger keeps how much of each is used, and the last
budgeted action starts the cooldown."""


class Relaunch(StrEnum):
    """What Planning does once every process of a stopping action's attempt has ended."""

    BEFORE_ONSET = "BeforeOnset"
    """The newest stable checkpoint before the onset (bounded by the rule, its
    noCheckpointFarEnough deciding when none is far enough back), then Confirming until the
    run is past the onset with the signal quiet."""
    FROM_LATEST = "FromLatest"
    """The newest complete checkpoint, LR and data unchanged."""
    NEVER = "Never"
    """Nothing is relaunched: the job ends Failed, its checkpoints left for a person."""


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Matched:
    """What an applier gets: the rule that matched the observation, and the policy's state."""

    recovery: RecoverySpec
    rule: RecoveryRule
    observation: Observation
    ledger: PolicyLedger
    now: datetime
    lr_scale: float


Applier = Callable[[Matched], Decision | Deferral]
"""The decision an action makes for a matched observation, or why it makes none now."""


@dataclass(frozen=True)
class ActionKind:
    """Everything that sets one action apart from the others."""

    action: Action
    relaunch: Relaunch | None
    """None: the run keeps going (a live action); else what follows stopping every pod."""
    counter: StatusCounter | None
    """The status counter (and, for rollbacks and restarts, the budget) it uses."""
    event_type: EventType
    reason: Reason
    """The reason of its Event when it acts as planned (escalations, budgets and crash loops
    give their own); a live action's reason also marks the Healthy condition it set."""
    decide: Applier
    """How the engine decides it once a rule with this action matched. The engine itself
    defers a stopping action during the cooldown and turns a live one whose pods already
    stopped into a restart, so the applier sees neither case."""
    doc: str
    """Its paragraph in docs/api.md: what exactly happens."""
    plot_colour: str
    """Matplotlib colour of its line in `stabletrain replay --plot`."""

    @property
    def stops_the_run(self) -> bool:
        """The attempt's processes must all end first (in kept pods or with their pods); the
        agent may trip on signals its rules name."""
        return self.relaunch is not None

    @property
    def budgeted(self) -> bool:
        return self.counter in BUDGETED

    @property
    def goes_before_onset(self) -> bool:
        """It resumes before the onset, so its plan is bounded by and confirmed past it."""
        return self.relaunch is Relaunch.BEFORE_ONSET

    @property
    def ends_the_job(self) -> bool:
        return self.relaunch is Relaunch.NEVER
