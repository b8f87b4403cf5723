"""Every name the operator writes into the cluster: API identity, phases, conditions, reasons.

One module so that Events, conditions, metrics labels and docs cannot drift apart. Actions,
signals and attribution classes come from the agent's contract, re-exported here.
"""

from __future__ import annotations

from enum import StrEnum

from stabletrain_contract.names import Action, AnomalyClass, Signal

GROUP = "stabletrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StableTrainingJob"
LIST_KIND = "StableTrainingJobList"
PLURAL = "stabletrainingjobs"
SINGULAR = "stabletrainingjob"
SHORT_NAMES = ("stj",)
CATEGORIES = ("stabletrain", "all")
SKIPS_PER_ACTION = 8
"""Skip ranges one action may add: a plan and a history entry hold this many."""
"""`kubectl get stabletrain` lists every stabletrain resource; `all` includes jobs in it."""
CRD_NAME = f"{PLURAL}.{GROUP}"

__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "CRD_NAME",
    "GROUP",
    "KIND",
    "LIST_KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "Action",
    "AnomalyClass",
    "ConditionType",
    "Phase",
    "Reason",
    "Signal",
]


class Phase(StrEnum):
    """Where the job is; the rollback state machine's steps are phases so they survive restarts."""

    PENDING = "Pending"
    """Accepted, pods not created yet."""
    RUNNING = "Running"
    STOPPING = "Stopping"
    """An action needs every training process of the attempt ended (Rollback,
    RestartFromLatest, Fail, suspend): kept pods stop their processes (restart InPlace), the
    others are deleted."""
    PLANNING = "Planning"
    """No process of the old attempt runs; choosing the checkpoint, LR scale and skip
    ranges (status.plan)."""
    RELAUNCHING = "Relaunching"
    """Directives and pods of the next attempt are being created."""
    CONFIRMING = "Confirming"
    """Relaunched; waiting for the run to pass the onset step without the signal firing."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class ConditionType(StrEnum):
    """Condition types in status.conditions (metav1.Condition shape)."""

    READY = "Ready"
    """All worker pods of the current attempt run and report steps."""
    HEALTHY = "Healthy"
    """No signal fires; False while an anomaly is being handled or only alerted."""
    RECOVERING = "Recovering"
    """An action (rollback, restart) is in flight."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    PREFLIGHT = "Preflight"
    """The run's start-up facts against the preflight checklist: False while a severe
    finding stands; the message has one line per finding (docs/preflight.md)."""
    ADMITTED = "Admitted"
    """A queued job's Kueue Workload is admitted: True while its quota is reserved and the
    pods may run; False with Kueue's own reason while it waits or after an eviction."""
    UNSCHEDULABLE = "Unschedulable"
    """Pods of the attempt stayed unschedulable past spec.scheduling.unschedulableSeconds;
    the message names them and the scheduler's reason."""
    INVALID_SPEC = "InvalidSpec"
    """True while the spec cannot become pods (the message names each field): nothing is
    created until the spec changes; False once a launch went ahead."""
    SPEC_APPLIED = "SpecApplied"
    """The pods run the spec's newest generation (status.observedGeneration); False while an
    edit is on its way to them, waits for the next attempt, or is refused by a
    StableTrainingPolicy limit, saying which."""


class Reason(StrEnum):
    """CamelCase reasons of conditions and Events."""

    CREATED = "Created"
    PODS_RUNNING = "PodsRunning"
    PODS_NOT_READY = "PodsNotReady"
    NO_SIGNAL = "NoSignal"
    SIGNAL_FIRING = "SignalFiring"
    TRIPPED = "Tripped"
    ROLLBACK_STARTED = "RollbackStarted"
    ROLLBACK_CONFIRMED = "RollbackConfirmed"
    CONFIRMATION_TIMED_OUT = "ConfirmationTimedOut"
    """The relaunched run did not pass the old onset with the signal quiet in time."""
    RESTART_STARTED = "RestartStarted"
    LR_REDUCED = "LRReduced"
    ALERTED = "Alerted"
    ESCALATED = "Escalated"
    NO_CHECKPOINT = "NoUsableCheckpoint"
    """No usable checkpoint precedes the bound: those there cannot be trusted, the rule's
    noCheckpointFarEnough is Fail, or the pods could not restore any of them."""
    RESTORE_FAILED = "RestoreFailed"
    """The relaunched pods could not restore the planned step; the same action is planned
    again without it (never a checkpoint newer than a rollback's bound)."""
    ROLLBACK_BUDGET_EXHAUSTED = "RollbackBudgetExhausted"
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
    FAILED_BY_POLICY = "FailedByPolicy"
    MANUAL_ROLLBACK = "ManualRollback"
    SUSPENDED = "Suspended"
    SAVING_BEFORE_SUSPEND = "SavingBeforeSuspend"
    """spec.suspend: the pods save a final checkpoint before they are stopped."""
    RESUMED = "Resumed"
    TRAINING_COMPLETE = "TrainingComplete"
    STALLED = "Stalled"
    CRASH_LOOP = "CrashLoop"
    """Every rank failed before its first step, or the same error ended two attempts."""
    SUSPECT_NODE = "SuspectNode"
    """A node joined (or stayed on) the job's suspect list."""
    POD_REPLACED = "PodReplaced"
    """A pod kept for a restart in place is replaced after all: its processes did not stop
    in time or survived KILL, or its container ended during the stop."""
    INVALID_TRIP_REPORT = "InvalidTripReport"
    CHECKPOINT_REJECTED = "CheckpointRejected"
    """A pod refused a checkpoint copy (not signed with the job's key, damaged, or not what
    its path says); the Event names it and where a restore moved it aside."""
    CHECKPOINTS_UNSIGNED = "CheckpointsUnsigned"
    """The job's Secret holds no checkpoint key (made before signing): its checkpoints are
    neither signed nor checked for a signature."""
    NO_MATCHING_RULE = "NoMatchingRule"
    PREFLIGHT_PASSED = "PreflightPassed"
    PREFLIGHT_WARNINGS = "PreflightWarnings"
    PREFLIGHT_SEVERE = "PreflightSevereFindings"
    """Severe findings in Warn mode: the job runs anyway."""
    PREFLIGHT_REFUSED = "PreflightRefused"
    """Severe findings in Refuse mode: no worker pod is created."""
    PREFLIGHT_RUNNING = "PreflightRunning"
    PREFLIGHT_POD_FAILED = "PreflightPodFailed"
    """The preflight pod ended without facts; Refuse mode starts nothing without them."""
    QUEUED = "Queued"
    """The job's Kueue Workload waits for admission; no pod is created meanwhile."""
    ADMITTED = "Admitted"
    """Kueue admitted the job's Workload: its pods start (or resume)."""
    EVICTED = "Evicted"
    """Kueue evicted the Workload: the pods save a final checkpoint and stop, as for
    spec.suspend; the Admitted condition carries Kueue's own reason."""
    WORKLOAD_CREATED = "WorkloadCreated"
    WORKLOAD_FINISHED = "WorkloadFinished"
    UNSCHEDULABLE = "Unschedulable"
    """Pods of the attempt stayed unschedulable past the bound (the scheduler's reason in
    the message)."""
    SCHEDULED = "Scheduled"
    """The pods that were unschedulable got a node."""
    INVALID_SPEC = "InvalidSpec"
    """The Event of an InvalidSpec condition that turned True or changed its message."""
    HOST_PATH_NOT_ALLOWED = "HostPathNotAllowed"
    """local.hostPath is not one of the node directories the cluster allows."""
    VOLUME_TYPE_NOT_ALLOWED = "VolumeTypeNotAllowed"
    """local.volume is not one volume source of the types the cluster allows."""
    POD_SECURITY = "PodSecurityViolation"
    """The worker template breaks the Pod Security level the cluster requires."""
    MALFORMED_TEMPLATE = "MalformedTemplate"
    """A field of the worker template the operator fills in has the wrong shape."""
    NAME_NOT_USABLE = "NameNotUsable"
    """The job's name cannot name its Service, or a pod's hostname would be too long."""
    REFUSED_BY_API_SERVER = "RefusedByAPIServer"
    """The API server refused the pods the spec makes (a dry run, or the create itself)."""
    NAME_TAKEN = "NameTaken"
    """An object the job needs exists under its name but belongs to something else."""
    SPEC_ACCEPTED = "SpecAccepted"
    """InvalidSpec False: the spec became pods."""
    SPEC_IN_FORCE = "SpecInForce"
    """The pods run the newest spec generation (or none run, and the next launch will)."""
    AWAITING_PODS = "AwaitingPods"
    """An edit's directives were sent; not every pod reported applying them yet."""
    AT_NEXT_ATTEMPT = "AtNextAttempt"
    """An edit of what the pods are built from (workers) takes effect when the next
    attempt's pods are created."""
    EXCEEDS_POLICY_LIMIT = "ExceedsPolicyLimit"
    """The spec sets a value beyond a StableTrainingPolicy limit: not taken into force."""
    INVALID_EFFECTIVE_POLICY = "InvalidEffectivePolicy"
    """The job's values over its policies' defaults do not make a valid policy."""


JOB_NAME_MAX = 40
"""Longest job name the API server accepts (a CEL rule on metadata.name). Worker hostnames
are `<job>-a<attempt>-<rank>` and ranks have at most 4 digits (10,000 nodes), so 40
characters leave 16 digits for the attempt; the preflight pod's `<job>-preflight-g<N>`
leaves 11 for the spec generation. The operator still checks the exact hostname of every
attempt before it launches one (tenancy/hostnames.py)."""
