"""The one table from action to what it means: jobset's failure-policy map, for our actions.

To add an action: its name in `Action` (stabletrain_contract/names.py), its reason in
`Reason` (api/constants.py), its applier in policy/actions.py (each decides the action it
names, so a new action needs one of its own, which may wrap another), and its entry here.
The state machine, the engine, the planner, the docs and the replay plot all read the
entry; unit tests fail when an action has none or its applier decides another action.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from stabletrain_contract.names import Action
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.policy.action_kind import ActionKind, Relaunch, StatusCounter
from stabletrain_operator.policy.actions import (
    alert,
    fail_by_rule,
    reduce_lr,
    restart_by_rule,
    rollback,
)

_KINDS = (
    ActionKind(
        action=Action.ROLLBACK,
        relaunch=Relaunch.BEFORE_ONSET,
        counter=StatusCounter.ROLLBACKS,
        event_type="Warning",
        reason=Reason.ROLLBACK_STARTED,
        decide=rollback,
        doc=(
            "Phase Stopping: end every training process of the attempt and wait until all "
            "ended (no rank may write after the decision): with `recovery.restart: InPlace` "
            "(the default) the supervisors stop the processes of the pods that can run the next "
            "attempt and only the other pods are deleted; with `RecreatePods` every pod is "
            "deleted. Planning: choose the newest checkpoint that "
            "is stable, not a spike marker, complete and verified on the PFS and on the local tier "
            "of every node it will be read from (a node without a local copy reads from the PFS), "
            "and at least `minStepsBeforeOnset` steps before the onset; multiply the LR scale by "
            "`lrFactor`, never below `lrFloor`; skip the data of steps [onset - "
            "skipStepsBeforeOnset, onset + skipStepsAfterOnset]: only the suspect shards the trip "
            "report's lineage names (`skipData: SuspectShards`, the default; what the range passes "
            "over of them stays skipped in every later pass over the data), the whole range when "
            "the lineage is missing or was cut, with `skipData: StepRange`, and on every "
            "escalation. Relaunching: write directives with a new generation for attempt + 1 "
            "(resume step, LR scale, re-warm-up, all skip ranges), start it in the kept pods and "
            "create the others. Confirming: "
            "the rollback is confirmed (Event RollbackConfirmed, with the step passed and the loss "
            "against the pre-spike baseline) once every pod runs the new directives past the old "
            "onset plus the signal's detection window (its `consecutiveSteps`) while the signal is "
            "quiet; a trip before that is the same incident, and so is a new onset within "
            "`escalation.withinSteps` of the old one later: rolled back harder (an older "
            "checkpoint, the factor applied again, the whole skip window doubled) up to "
            "`escalation.maxRecurrences` times, then `escalation.finalAction`. Not confirmed "
            "within `recovery.confirmTimeoutSeconds` of the decision, the job runs on unconfirmed "
            "(Recovering=False, reason ConfirmationTimedOut, a Warning Event). Counts against "
            "`budgets.maxRollbacks`; with no usable checkpoint the job fails with reason "
            "NoUsableCheckpoint."
        ),
        plot_colour="tab:red",
    ),
    ActionKind(
        action=Action.REDUCE_LR,
        relaunch=None,
        counter=StatusCounter.LR_REDUCTIONS,
        event_type="Normal",
        reason=Reason.LR_REDUCED,
        decide=reduce_lr,
        doc=(
            "No restart: the operator PUTs directives with the LR scale multiplied by `lrFactor` "
            "(floor `lrFloor`) and a new generation to every pod's agent, retrying until each pod "
            "reports that generation as applied; the agent applies it from its next step. At most "
            "once per `budgets.cooldownSeconds` per rule."
        ),
        plot_colour="tab:orange",
    ),
    ActionKind(
        action=Action.RESTART_FROM_LATEST,
        relaunch=Relaunch.FROM_LATEST,
        counter=StatusCounter.RESTARTS,
        event_type="Warning",
        reason=Reason.RESTART_STARTED,
        decide=restart_by_rule,
        doc=(
            "For faults outside the model (crashed or OOM-killed worker, lost node, stall): stop "
            "every training process as a Rollback does (in place or by deleting the pods), "
            "relaunch attempt + 1 from the newest complete and verified checkpoint "
            "(stable or not, never a spike marker), with LR scale and skip ranges unchanged: "
            "on the PFS, or a snapshot in the memory tier of every pod when all the pods of the "
            "next attempt are kept (`checkpoints.memory`; a replaced pod's memory is gone). "
            "Counts against `budgets.maxRestarts`, not against rollbacks."
        ),
        plot_colour="tab:purple",
    ),
    ActionKind(
        action=Action.ALERT,
        relaunch=None,
        counter=StatusCounter.ALERTS,
        event_type="Warning",
        reason=Reason.ALERTED,
        decide=alert,
        doc=(
            "Nothing in the run changes: a Warning Event naming the rule and the signal's "
            "evidence, the Healthy condition set to False with reason Alerted, and the alerts "
            "counter and metric increased; at most once per `budgets.cooldownSeconds` per rule."
        ),
        plot_colour="tab:olive",
    ),
    ActionKind(
        action=Action.FAIL,
        relaunch=Relaunch.NEVER,
        counter=None,
        event_type="Warning",
        reason=Reason.FAILED_BY_POLICY,
        decide=fail_by_rule,
        doc=(
            "Stop all pods and set phase Failed with the Failed condition naming the rule and the "
            "evidence. Checkpoints stay for a person to inspect."
        ),
        plot_colour="black",
    ),
)

ACTION_KINDS: Mapping[Action, ActionKind] = MappingProxyType({k.action: k for k in _KINDS})


def kind_of(action: Action) -> ActionKind:
    return ACTION_KINDS[action]


LIVE_ACTION_REASONS = frozenset(k.reason for k in _KINDS if not k.stops_the_run)
"""Healthy-condition reasons a live action leaves; a firing signal does not overwrite them."""
