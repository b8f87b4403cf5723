"""status of a StableTrainingJob: level-based conditions, live numbers, the rollback state.

Every field the operator writes is declared here: a structural schema silently prunes
undeclared fields, and the rollback state machine must find its plan again after an
operator restart. Lists are bounded so the object stays far below etcd's size limit;
long skip lists spill into a ConfigMap whose name is recorded.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    AwareDatetime,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from stabletrain_contract.base import error_lines
from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import Action, AnomalyClass
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.api.base import ApiModel
from stabletrain_operator.api.constants import SKIPS_PER_ACTION, Phase
from stabletrain_operator.api.policy_in_force import BuiltFrom, PolicyInForce, PolicyRollout
from stabletrain_operator.api.policy_memory import PolicyMemory

_log = logging.getLogger(__name__)

HISTORY_MAX = 20
"""Decisions kept in status.rollbackHistory; older ones live in Events and metrics."""
SKIP_RANGES_INLINE_MAX = 64
"""Skip ranges kept inline; beyond this the full list moves to a ConfigMap."""
INVENTORY_MAX = 64
CHOICE_MAX = 1024
EXCLUDED_MAX = 16
"""Re-plans of one action after restore failures; more fails the job (NoUsableCheckpoint)."""
SUSPECTS_MAX = 8
REPLACED_LISTED_MAX = 16
"""Replaced ranks a history entry lists; more are counted in `replacedPods` only."""
RANKS_MAX = 10_000
"""workers.nodes' bound: a plan may mark every rank replaced."""
"""Suspects recorded per incident."""
SUSPECT_NODES_MAX = 16
"""Nodes on the job's suspect list; the oldest incident drops off first."""
FAILURE_MESSAGE_MAX = 2048
"""The failure's own words kept: the termination message or the log tail a kubelet keeps."""
LOSS_SIGNIFICANT_DIGITS = 4
"""Digits status.loss keeps (see `rounded_loss`)."""


def rounded_loss(loss: float | None) -> float | None:
    """The loss as status.loss holds it: LOSS_SIGNIFICANT_DIGITS significant digits, null
    when unknown or non-finite (JSON has no NaN).

    kubectl prints a number column with every digit the float has (2.538881301879883), and
    the LOSS column is what a person reads first. No decision reads status.loss (the policy
    reads the pods' reports), and the agent's metrics keep the exact value.
    """
    if loss is None or not math.isfinite(loss):
        return None
    return float(f"{loss:.{LOSS_SIGNIFICANT_DIGITS}g}")


class Suspect(ApiModel):
    """A rank or node an incident is attributed to, and the evidence."""

    rank: int | None = Field(default=None, ge=0)
    """Global (or node) rank; null for a fault of the node itself."""
    node: str | None = Field(default=None, max_length=253)
    """Node it ran on; null when the pod was never scheduled."""
    reason: str = Field(max_length=512)
    """The evidence, in a sentence (e.g. `stalled: stuck outside torch at train.py:88`)."""
    avoid: bool = True
    """Whether its node joins the suspect list (false when the evidence cannot tell the
    culprit from the ranks that waited for it, or the fault is the job's, not the node's)."""
    node_lost: bool = False
    """Whether the node itself stopped reporting (the node controller marked the pod not
    ready): evidence from the control plane, which no pod can write."""


class SuspectNode(ApiModel):
    """A node this job's recent incidents were attributed to; relaunches avoid it."""

    node: str = Field(max_length=253)
    """Node name."""
    incidents: int = Field(ge=1)
    """Incidents of this job attributed to the node while it was on the list."""
    node_lost_incidents: int = Field(default=0, ge=0)
    """Those of them in which the node itself stopped reporting; only these count toward
    node remediation (the operator's --remediate-nodes), since the others rest on what the
    job's own pods did or wrote."""
    last_reason: str = Field(max_length=512)
    """The evidence of the newest incident."""
    last_incident_at: AwareDatetime
    """When the newest incident stopped the run."""
    expires_at: AwareDatetime
    """The node leaves the list at this time (recovery.placement.suspectSeconds after its
    last incident)."""


class FailureRecord(ApiModel):
    """How the newest failed attempt ended, to notice the same error ending the next."""

    attempt: int = Field(ge=0)
    """The attempt that failed."""
    signature: str = Field(max_length=256)
    """The failing rank's own last error line(s), which the failure is compared by (e.g.
    `ModuleNotFoundError: No module named 'x'` or `train.py: error: unrecognized
    arguments: --bad`; never torchrun's summary), else the signal that killed it, else the
    pod's reason and exit code."""
    exit_code: int | None = None
    """The failing rank's own exit code as torchrun's summary reports it (negative: killed
    by that signal), else the container's; torchrun itself exits 1 whatever the rank did."""
    message: str = Field(default="", max_length=FAILURE_MESSAGE_MAX)
    """The failure's own words at length: the culprit's termination message or its log
    tail (the conditions quote only the error line)."""
    nodes: tuple[str, ...] = Field(default=(), max_length=64)
    """Nodes of the failed pods."""
    before_first_step: bool = False
    """No rank of the attempt completed a step."""
    step: int | None = Field(default=None, ge=0)
    """The newest step the job had reported when the attempt failed: an attempt that got
    further than the one before it is not stuck on the same error, whatever the error."""


class Condition(ApiModel):
    """metav1.Condition: one aspect of the job's state, keyed by type."""

    type: str = Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        max_length=316,
    )
    """CamelCase condition type, unique in the list (see ConditionType)."""
    status: str = Field(pattern="^(True|False|Unknown)$")
    """True, False or Unknown."""
    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation of the spec this condition was computed from."""
    last_transition_time: AwareDatetime
    """When status last flipped; unchanged while only reason or message change."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """CamelCase reason for the last transition (see Reason)."""
    message: str = Field(default="", max_length=32_768)
    """A sentence for people: what happened and what to do."""


class Counters(ApiModel):
    """Totals since the job was created; never reset."""

    rollbacks: int = Field(default=0, ge=0)
    """Automatic and manual rollbacks; compared against budgets.maxRollbacks."""
    restarts: int = Field(default=0, ge=0)
    """RestartFromLatest actions; compared against budgets.maxRestarts."""
    lr_reductions: int = Field(default=0, ge=0)
    """Live ReduceLR actions applied."""
    alerts: int = Field(default=0, ge=0)
    """Alert actions taken."""
    trips: int = Field(default=0, ge=0)
    """Trip reports received (including those that led to no action)."""


class RollbackRecord(ApiModel):
    """One decision as it happened, the audit trail of the policy: every Rollback and
    RestartFromLatest (where it resumed), every live ReduceLR and Alert, and the Fail that
    ended the job."""

    time: AwareDatetime
    """When the action started."""
    action: Action
    reason: str = Field(default="", max_length=1024)
    """CamelCase reason of the decision (RollbackStarted, Escalated, LRReduced, Alerted,
    RollbackBudgetExhausted, NoUsableCheckpoint, ...); the Event of that reason has the
    evidence."""
    rule: str = Field(default="", max_length=63)
    """Rule that matched, or the built-in name: `manual` (a person's request), `resume`
    (after a suspend), `escalation`, `default-infrastructure`, `unmatched-trip`."""
    request_id: str = Field(default="", max_length=63)
    """Manual request id; empty for automatic actions."""
    signal: str = Field(max_length=70)
    """Signal that triggered the action (Manual for a person's request)."""
    anomaly_class: AnomalyClass | None = None
    """Attribution class from the trip report; Infrastructure for a worker failure or a
    stall; null for a manual request or a resume."""
    onset_step: int | None = Field(default=None, ge=0)
    """First anomalous step; for a worker failure or a stall the step the run had reached;
    null for a manual request or a resume."""
    from_step: int = Field(ge=0)
    """Step the run had reached when it stopped."""
    to_step: int | None = Field(default=None, ge=0)
    """Checkpoint step the pods restored; 0 when they started from scratch (nothing
    restored); null for the actions that launch nothing (ReduceLR, Alert, Fail)."""
    checkpoint_choice: str = Field(default="", max_length=CHOICE_MAX)
    """Why that step: the selection's verdict, a narrowed margin, a start from scratch."""
    lr_scale: float = Field(gt=0.0, le=1.0)
    """LR scale after the action."""
    skipped: tuple[SkipRange, ...] = Field(default=(), max_length=SKIPS_PER_ACTION)
    """Skip ranges this action added."""
    attempt: int = Field(ge=0)
    """Attempt that the action launched (Rollback, RestartFromLatest) or acted on (ReduceLR,
    Alert, Fail)."""
    suspects: tuple[Suspect, ...] = Field(default=(), max_length=SUSPECTS_MAX)
    """Ranks and nodes the incident was attributed to."""
    restarted_in_place: int = Field(default=0, ge=0)
    """Pods of the relaunched attempt that kept running and restarted their training
    processes in place (recovery.restart InPlace); the others were created anew."""
    replaced_pods: int = Field(default=0, ge=0)
    """Pods deleted and created anew for the relaunched attempt."""
    replaced_ranks: tuple[int, ...] = Field(default=(), max_length=REPLACED_LISTED_MAX)
    """Ranks whose pods were replaced in a relaunch in place (the first 16; empty with
    RecreatePods); the reason of each replaced pod the stop still found is in a PodReplaced
    Event."""

    @classmethod
    def from_plan(cls, plan: Plan, *, reason: str, lr_scale: float) -> RollbackRecord:
        """A planned action once its relaunch is under way: where it resumed and why."""
        return cls(
            time=plan.started_at,
            action=plan.action,
            reason=reason,
            **_answered(plan),
            to_step=plan.target_step,
            checkpoint_choice=plan.checkpoint_choice,
            lr_scale=lr_scale,
            skipped=plan.added_skip,
            attempt=plan.next_attempt,
            suspects=plan.suspects,
        )

    @classmethod
    def failing(
        cls, plan: Plan, *, time: datetime, reason: str, lr_scale: float, attempt: int
    ) -> RollbackRecord:
        """The Fail that ends the job instead of `plan`: what it answered, nothing launched
        (the plan's checkpoint, skips and suspects belong to a relaunch that never ran)."""
        return cls(
            time=time,
            action=Action.FAIL,
            reason=reason,
            **_answered(plan),
            lr_scale=lr_scale,
            attempt=attempt,
        )


def _answered(plan: Plan) -> dict[str, Any]:
    """The record fields that say what `plan` answered, whatever became of it."""
    return {
        "rule": plan.rule,
        "request_id": plan.request_id,
        "signal": plan.signal,
        "anomaly_class": plan.anomaly_class,
        "onset_step": plan.onset_step,
        "from_step": plan.from_step,
    }


class Plan(ApiModel):
    """The in-flight action, persisted before anything is touched so that an operator killed
    anywhere finishes it exactly once after its restart."""

    action: Action
    """Rollback, RestartFromLatest or Fail: the actions that stop the pods."""
    rule: str = Field(default="", max_length=63)
    """Rule that matched, or the built-in name (`manual`, `resume`, `escalation`,
    `default-infrastructure`, `unmatched-trip`)."""
    request_id: str = Field(default="", max_length=63)
    """Manual request id being served; empty for automatic actions."""
    signal: str = Field(max_length=70)
    """Signal that triggered the action."""
    anomaly_class: AnomalyClass | None = None
    """Attribution class from the trip report, if any."""
    onset_step: int | None = Field(default=None, ge=0)
    """First anomalous step, if any: skip ranges and the checkpoint choice are relative to it."""
    from_step: int = Field(ge=0)
    """Step the run had reached when it stopped."""
    started_at: AwareDatetime
    """When the plan was persisted (phase Stopping began)."""
    from_attempt: int = Field(ge=0)
    """Attempt being stopped: every process of it must have ended (its pods stopped in place
    or deleted) before Planning."""
    next_attempt: int = Field(ge=0)
    """Attempt the relaunch creates; written before any pod of it exists."""
    target_step: int | None = Field(default=None, ge=0)
    """Chosen checkpoint, restored exactly; 0 starts from scratch; null until Planning."""
    checkpoint_choice: str = Field(default="", max_length=CHOICE_MAX)
    """Why Planning chose `targetStep` (also the Planned Event's message)."""
    excluded_steps: tuple[int, ...] = Field(default=(), max_length=EXCLUDED_MAX)
    """Steps the pods of an earlier try of this plan could not restore (RestoreFailed)."""
    lr_scale: float | None = Field(default=None, gt=0.0, le=1.0)
    """LR scale of the next attempt; null until Planning computed it."""
    rewarmup_steps: int = Field(default=0, ge=0)
    """Re-warm-up of the next attempt."""
    added_skip: tuple[SkipRange, ...] = Field(default=(), max_length=SKIPS_PER_ACTION)
    """Skip ranges this action adds to the active ones."""
    directives_generation: int | None = Field(default=None, ge=1)
    """Generation of the directives written for the next attempt; set in Relaunching."""
    recurrence: int = Field(default=0, ge=0)
    """How many times this is a recurrence near the same onset (escalation level)."""
    suspects: tuple[Suspect, ...] = Field(default=(), max_length=SUSPECTS_MAX)
    """Ranks and nodes the incident is attributed to."""
    backoff_seconds: int | None = Field(default=None, ge=0)
    """Crash loop with recovery.crashLoop.action Backoff: the relaunch waits this long."""
    confirm_step: int | None = Field(default=None, ge=0)
    """Step every pod must pass with the signal quiet before Confirming ends: the onset
    plus the signal's detection window (its consecutiveSteps). Null for actions without an
    onset, confirmed once every pod runs the new directives."""
    loss_baseline: float | None = Field(default=None, allow_inf_nan=False)
    """The loss baseline when the action was decided (the pre-spike level): the
    RollbackConfirmed Event states the loss against it."""
    in_place: bool = False
    """The relaunch keeps the pods that can run the next attempt (recovery.restart InPlace)
    and restarts their processes; it was decided with the plan, so an operator restarted
    in the middle carries it on the same way."""
    replaced_ranks: tuple[int, ...] = Field(default=(), max_length=RANKS_MAX)
    """Ranks whose pods an in-place relaunch replaces after all: their pods could not be
    kept, or did not stop in time."""


class QueueState(StrEnum):
    """Where a queued job stands with Kueue (`kubectl get stj`'s QUEUE column)."""

    QUEUED = "Queued"
    """Its Workload waits for admission; no pod runs."""
    ADMITTED = "Admitted"
    """Admitted: the quota is reserved for the job, through every recovery."""
    EVICTED = "Evicted"
    """Kueue evicted it (preemption, a waitForPodsReady timeout, a stopped queue): it saves,
    stops and gives the quota back, and waits to be admitted again."""
    FINISHED = "Finished"
    """The job ended and its Workload is finished: the quota is released."""


class QueueStatus(ApiModel):
    """The job's Kueue Workload, when it carries the kueue.x-k8s.io/queue-name label."""

    state: QueueState
    workload: str = Field(default="", max_length=253)
    """Name of the job's Workload (`stabletrainingjob-<job>-<hash>`, as Kueue names them)."""
    local_queue: str = Field(max_length=253)
    """The LocalQueue named by the label."""
    cluster_queue: str | None = Field(default=None, max_length=253)
    """The ClusterQueue that admitted it, while admitted."""


class StableTrainingJobStatus(ApiModel):
    """What the operator knows, written once per reconcile."""

    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation of the spec in force: the running pods apply its detection,
    trip list and checkpoint settings and the operator decides by its policy
    (status.policy.specGeneration). While an edit is on its way to the pods, or refused by a
    StableTrainingPolicy limit, it stays at the generation before and the SpecApplied
    condition says why."""
    phase: Phase = Phase.PENDING
    conditions: tuple[Condition, ...] = Field(
        default=(),
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Level-based state, one entry per type (metav1.Condition)."""
    attempt: int = Field(default=0, ge=0)
    """Current attempt; bumps on every relaunch and fences everything older."""
    step: int | None = Field(default=None, ge=0)
    """Newest global step reported by the pods; once Succeeded, the last step trained."""
    loss: float | None = None
    """Loss of that step, to 4 significant digits (the pods' metrics keep every digit); null
    while unknown or when non-finite (see the Healthy condition)."""
    loss_baseline: float | None = None
    """Healthy EMA baseline of the loss, as the agent computes it."""
    grad_norm: float | None = None
    """Newest pre-clip gradient norm."""
    tokens_per_second: float | None = Field(default=None, ge=0.0)
    """Newest throughput of the whole job."""
    lr_scale: float = Field(default=1.0, gt=0.0, le=1.0)
    """Effective LR multiplier: the product of every reduction so far."""
    directives_generation: int = Field(default=0, ge=0)
    """Newest directives generation issued; pods report the one they applied."""
    active_skip_ranges: tuple[SkipRange, ...] = Field(default=(), max_length=SKIP_RANGES_INLINE_MAX)
    """Skip ranges in force (all of them, unless skipRangesConfigMap is set)."""
    skip_ranges_total: int = Field(default=0, ge=0)
    """Number of skip ranges in force, inline or in the ConfigMap."""
    skip_ranges_config_map: str | None = Field(default=None, max_length=253)
    """ConfigMap (same namespace) holding the full list once it outgrew the inline limit,
    as a JSON array of SkipRange under the key `skipRanges.json`."""
    checkpoints: tuple[CheckpointRecord, ...] = Field(default=(), max_length=INVENTORY_MAX)
    """Per-step inventory across tiers and nodes, newest last."""
    rollback_history: tuple[RollbackRecord, ...] = Field(default=(), max_length=HISTORY_MAX)
    """Every decision of the policy (Rollback, RestartFromLatest, ReduceLR, Alert, Fail),
    newest last; the oldest entries drop off (Events and metrics keep them)."""
    counters: Counters = Field(default_factory=Counters)
    suspect_nodes: tuple[SuspectNode, ...] = Field(default=(), max_length=SUSPECT_NODES_MAX)
    """Nodes recent incidents were attributed to, until each expires; relaunched pods avoid
    them (recovery.placement)."""
    attempt_progressed: bool = False
    """A rank of the current attempt has completed a step (a crash before that is a start-up
    failure)."""
    last_failure: FailureRecord | None = None
    """How the newest attempt that failed without a trip ended."""
    plan: Plan | None = None
    """The action in flight (phases Stopping, Planning, Relaunching, Confirming)."""
    last_trip: TripReport | None = None
    """The newest trip report as the pod left it, except that a non-finite value or
    threshold is stored as null (JSON numbers cannot be NaN)."""
    save_request: int | None = Field(default=None, ge=1)
    """While spec.suspend waits for the final checkpoint: the directives generation that
    asked every pod to save now; cleared when the pods are stopped."""
    last_manual_request_id: str | None = Field(default=None, max_length=63)
    """spec.manualRollback.requestId handled last: a request with this id does not run again."""
    queue: QueueStatus | None = None
    """The job's place in Kueue's queue; null for a job without the queue-name label (or an
    operator without --kueue)."""
    unschedulable_pods: int | None = Field(default=None, ge=0)
    """Pods of the attempt unschedulable for longer than spec.scheduling.unschedulableSeconds;
    null while there are none."""
    policy_ledger: PolicyMemory | None = None
    """The recovery policy's memory (cooldowns, escalation, alert episodes), written with
    each decision so an operator restart forgets no cooldown or alert episode; the budgets
    used are counters.rollbacks and counters.restarts. Null, or empty, on a job created
    before it was kept: the operator rebuilds it from counters and rollbackHistory."""
    policy: PolicyInForce | None = None
    """The effective policy in force, with where each value came from (the job, a
    StableTrainingPolicy, else the built-in default)."""
    policy_rollout: PolicyRollout | None = None
    """An edit sent to the running pods and not yet applied by every one of them."""
    built_from: BuiltFrom | None = None
    """The spec generation the current attempt's pods were built from (spec.workers)."""

    @field_validator("policy_ledger", mode="wrap")
    @classmethod
    def _unreadable_ledger_is_rebuilt(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> PolicyMemory | None:
        """A ledger this operator cannot read (edited by hand under an older CRD that did not
        check it) must not stop the job being reconciled: it is dropped with a warning naming
        the problem and rebuilt from counters and rollbackHistory, as a missing one is."""
        try:
            memory: PolicyMemory | None = handler(value)
        except ValidationError as error:
            problems = "; ".join(error_lines(error, under="status.policyLedger"))
            job = (info.context or {}).get("job", "?")
            _log.warning("job %s: invalid policy ledger, rebuilt from history: %s", job, problems)
            return None
        return memory
